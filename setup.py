"""Build hook for the optional C extensions; all other metadata lives in pyproject.toml.

`shoal.protocol._record_walk` speeds up the produce-time record walk, and
`shoal.broker.storage._fsync_worker` runs the logs' fsyncs in threads that never take the interpreter
lock. Both are optional: without a C compiler the build goes on without them, protocol/records.py walks
records in Python and the logs fsync in the event loop's default executor.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("shoal.protocol._record_walk", ["protocol/_record_walk.c"], optional=True),
        Extension("shoal.broker.storage._fsync_worker", ["broker/storage/_fsync_worker.c"], optional=True),
    ],
)
