"""Group commit across logs: flush rounds of several partition logs due at once share one executor job and
run their fsyncs concurrently; each round's waiters see only their own round's outcome."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.storage.flush_batch import batcher_for, run_together
from shoal.broker.storage.partition_log import LogConfig, PartitionLog

from .test_partition_log import append, make_batch


class CountingExecutor(ThreadPoolExecutor):
    """A real thread pool that counts the jobs submitted to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.jobs = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
async def executor() -> AsyncIterator[CountingExecutor]:
    pool = CountingExecutor()
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


async def test_rounds_due_together_share_one_executor_job_and_fsync_concurrently(
        tmp_path: Path, executor: CountingExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = _logs(tmp_path, 4)
    # Every log's fsync waits at the barrier for the others: it passes only if all four run at once.
    barrier = threading.Barrier(4, timeout=10)
    real_fsync = os.fsync
    seen: set[str] = set()

    def gathering_fsync(fd: int) -> None:
        path = _fd_dir(fd)
        if path.startswith(str(tmp_path)) and path not in seen:
            seen.add(path)
            barrier.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", gathering_fsync)
    jobs_before = executor.jobs
    batches_before = batcher_for(asyncio.get_running_loop()).batches
    await asyncio.gather(*(plog.flush() for plog in logs))
    assert executor.jobs - jobs_before == 1
    assert batcher_for(asyncio.get_running_loop()).batches - batches_before == 1
    assert len(seen) == 4
    for plog in logs:
        assert plog.flushed_offset == plog.log_end_offset == 1
        assert plog.fsync_count == 1
        plog.close()


async def test_each_round_waits_for_its_own_fsync_and_fails_only_with_it(
        tmp_path: Path, executor: CountingExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
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
    flushes = [asyncio.ensure_future(failing.flush()), asyncio.ensure_future(held.flush())]
    # The held log's fsync has not finished: none of its waiters may be released.
    while held._flush_task is None or executor.jobs == 0:
        await asyncio.sleep(0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiters[1].done()
    assert not flushes[1].done()
    assert held.flushed_offset == 0
    release.set()
    outcomes = await asyncio.gather(*waiters, *flushes, return_exceptions=True)
    # The failed fsync fails exactly the waiters of the log whose data it covered.
    assert isinstance(outcomes[0], OSError) and isinstance(outcomes[3], OSError)
    assert outcomes[1] is None and outcomes[2] is None and outcomes[4] is None
    assert failing.flushed_offset == 0
    assert held.flushed_offset == 1 and fine.flushed_offset == 1
    monkeypatch.undo()
    await failing.flush()  # the disk is back: the next round makes it durable
    assert failing.flushed_offset == 1
    for plog in (failing, held, fine):
        plog.close()


def test_run_together_reports_each_jobs_error() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def ok(i: int) -> Callable[[], None]:
        def job() -> None:
            with lock:
                ran.append(i)
        return job

    def bad() -> None:
        raise OSError(28, "ENOSPC")

    outcomes = run_together([bad, ok(1), ok(2), bad])
    assert [type(o) for o in outcomes] == [OSError, type(None), type(None), OSError]
    assert sorted(ran) == [1, 2]


async def test_a_round_that_cannot_be_planned_fails_alone() -> None:
    ran = threading.Event()

    def unplannable() -> Callable[[], None]:
        raise OSError(24, "EMFILE")

    batcher = batcher_for(asyncio.get_running_loop())
    failed = batcher.submit(unplannable)
    fine = batcher.submit(lambda: ran.set)
    outcomes = await asyncio.gather(failed, fine, return_exceptions=True)
    assert isinstance(outcomes[0], OSError) and outcomes[1] is None
    assert ran.is_set()
