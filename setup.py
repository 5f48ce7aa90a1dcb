"""Build hook for the one optional C extension; all other metadata lives in pyproject.toml.

`shoal.protocol._record_walk` speeds up the produce-time record walk. It is optional: without a C
compiler the build goes on without it and protocol/records.py walks records in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("shoal.protocol._record_walk", ["protocol/_record_walk.c"], optional=True),
    ],
)
