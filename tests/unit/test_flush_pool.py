"""Flush rounds of several partition logs due at once fsync concurrently on the flush pool, whatever else the
loop's default executor is doing; each round releases its own waiters and fails only with its own fsync."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.storage.partition_log import LogConfig, PartitionLog

from .test_partition_log import append, make_batch


class OneWorkerExecutor(ThreadPoolExecutor):
    """A real one-thread pool that counts the jobs submitted to it: a default executor that can run one
    blocking job at a time."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.jobs = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
async def executor() -> AsyncIterator[OneWorkerExecutor]:
    pool = OneWorkerExecutor()
    asyncio.get_running_loop().set_default_executor(pool)
    yield pool
    pool.shutdown(wait=False)


def _logs(tmp_path: Path, n: int) -> list[PartitionLog]:
    logs = [PartitionLog.open(tmp_path / f"__share_group_state-{i}", LogConfig()) for i in range(n)]
    for plog in logs:
        append(plog, make_batch([b"state"]))
    return logs


def _fd_dir(fd: int) -> str:
    return os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))


async def test_rounds_due_together_fsync_concurrently_off_the_default_executor(
        tmp_path: Path, executor: OneWorkerExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = _logs(tmp_path, 4)
    # Every log's fsync waits at the barrier for the others: it passes only if all four run at once (queued
    # one after another, as on a one-thread default executor, the barrier breaks and the flushes fail).
    barrier = threading.Barrier(4, timeout=10)
    real_fsync = os.fsync
    seen: set[str] = set()
    lock = threading.Lock()

    def gathering_fsync(fd: int) -> None:
        path = _fd_dir(fd)
        with lock:
            first = path.startswith(str(tmp_path)) and path not in seen
            seen.add(path)
        if first:
            barrier.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", gathering_fsync)
    await asyncio.gather(*(plog.flush() for plog in logs))
    assert executor.jobs == 0
    assert len(seen) == 4
    for plog in logs:
        assert plog.flushed_offset == plog.log_end_offset == 1
        assert plog.fsync_count == 1
        plog.close()


async def test_each_round_releases_its_own_waiters_and_fails_only_with_its_own_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing, held, fine = _logs(tmp_path, 3)
    release = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = _fd_dir(fd)
        if path == str(failing.directory):
            raise OSError(5, "EIO")
        if path == str(held.directory):
            release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    waiters: list[asyncio.Future[None]] = []
    for plog in (failing, held, fine):
        waiter = plog.durable(plog.log_end_offset)
        assert waiter is not None
        waiters.append(waiter)
    held_flush = asyncio.ensure_future(held.flush())
    # The failed fsync fails exactly the waiters of the log whose data it covered; the fine log's waiter is
    # released by its own fsync while the held log's fsync still runs, and the held log releases nobody.
    with pytest.raises(OSError):
        await waiters[0]
    with pytest.raises(OSError):
        await failing.flush()
    await waiters[2]
    assert fine.flushed_offset == 1
    assert not waiters[1].done() and not held_flush.done()
    assert held.flushed_offset == 0 and failing.flushed_offset == 0
    release.set()
    await asyncio.gather(waiters[1], held_flush)
    assert held.flushed_offset == 1
    monkeypatch.undo()
    await failing.flush()  # the disk is back: the next round makes it durable
    assert failing.flushed_offset == 1
    for plog in (failing, held, fine):
        plog.close()
