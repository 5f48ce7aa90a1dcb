"""fsync for the event loop, in threads that never take the interpreter lock.

A log's flush round (partition_log.py) has a few descriptors to fsync and close. In a thread pool of
Python workers each one waits for the interpreter lock to start, and again after every fsync and close:
while the loop is busy that wait, not the disk, is most of a round (about 0.4 ms to start and 0.1 ms to
report back, against 0.2-0.5 ms of fsync, at 2,500 rounds a second on two cores). The compiled
`_fsync_worker` runs the whole job in POSIX threads and reports through an eventfd the loop watches.

Without the compiled module (installed without a C compiler, or not on Linux) `for_loop` gives None and
the log uses the loop's default executor, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from ._fsync_worker import FsyncWorker

log = structlog.get_logger(__name__)

THREADS = 4  # fsyncs of different files run side by side and share the filesystem's journal commits


def _load() -> type[FsyncWorker] | None:
    try:
        from ._fsync_worker import FsyncWorker as compiled
    except ImportError:
        return None
    return compiled


_FsyncWorker = _load()


def compiled_worker_loaded() -> bool:
    """Whether flush rounds can use the compiled worker (the broker says so when it starts)."""
    return _FsyncWorker is not None


class LoopFsync:
    """The fsync worker of one event loop: `sync` hands descriptors over and completes on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, worker: FsyncWorker) -> None:
        self._loop = loop
        self._worker = worker
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._tokens = itertools.count()
        loop.add_reader(worker.fileno(), self._on_completed)

    def sync(self, fds: Sequence[int], directory: Path | None) -> asyncio.Future[None]:
        """fsync then close every descriptor of `fds` (this call owns them from now on, also when it
        raises), then fsync `directory`; the future fails with the first OSError."""
        try:
            token = next(self._tokens)
            future: asyncio.Future[None] = self._loop.create_future()
            self._worker.submit(token, fds, None if directory is None else os.fsencode(directory))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._pending[token] = future
        return future

    def _on_completed(self) -> None:
        for token, error in self._worker.completed():
            future = self._pending.pop(token, None)
            if future is None or future.done():
                continue  # its round was cancelled; the descriptors are closed all the same
            if error:
                future.set_exception(OSError(error, os.strerror(error)))
            else:
                future.set_result(None)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._worker.fileno())
        self._worker.close()


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopFsync] = weakref.WeakKeyDictionary()


def for_loop(loop: asyncio.AbstractEventLoop) -> LoopFsync | None:
    """The running loop's fsync worker, started on first use; None without the compiled module."""
    global _FsyncWorker
    found = _by_loop.get(loop)
    if found is not None or _FsyncWorker is None:
        return found
    try:
        fsync = LoopFsync(loop, _FsyncWorker(THREADS))
    except (OSError, NotImplementedError, RuntimeError) as e:
        # Threads or the eventfd refused, or a loop that cannot watch descriptors: the executor it is.
        log.warning("fsync_worker.unavailable", error=repr(e))
        _FsyncWorker = None
        return None
    _by_loop[loop] = fsync
    return fsync
