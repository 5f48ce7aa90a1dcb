"""The compiled fsync worker (broker/storage/_fsync_worker.c) that runs the logs' flush rounds.

Every job handed over completes exactly once on the loop, fails with the first errno of its descriptors
(a pipe cannot be fsynced: EINVAL), and closes every descriptor it was given whatever happened; a
round whose waiter was cancelled is dropped quietly. Flush rounds of PartitionLog go through it.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.broker.storage import fsync_worker
from shoal.broker.storage.partition_log import LogConfig, PartitionLog

from .test_partition_log import append, make_batch

pytestmark = pytest.mark.skipif(fsync_worker._FsyncWorker is None, reason="the fsync worker extension is not built")


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        assert e.errno == errno.EBADF
        return False
    return True


def open_file(directory: Path, name: str) -> int:
    fd = os.open(directory / name, os.O_CREAT | os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"record")
    return fd


def open_pipe() -> int:
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


async def test_files_and_directory_are_synced_and_their_descriptors_closed(tmp_path: Path) -> None:
    fsync = fsync_worker.for_loop(asyncio.get_running_loop())
    assert fsync is not None and fsync_worker.for_loop(asyncio.get_running_loop()) is fsync
    fds = [open_file(tmp_path, f"f{i}") for i in range(3)]
    await fsync.sync(fds, tmp_path)
    assert not any(is_open(fd) for fd in fds)
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(3)] == [b"record"] * 3
    await fsync.sync([], None)  # nothing to do still completes


async def test_a_failed_fsync_fails_its_job_and_still_closes_everything(tmp_path: Path) -> None:
    fsync = fsync_worker.for_loop(asyncio.get_running_loop())
    assert fsync is not None
    fds = [open_file(tmp_path, "a"), open_pipe(), open_file(tmp_path, "b")]
    with pytest.raises(OSError) as raised:
        await fsync.sync(fds, tmp_path)
    assert raised.value.errno == errno.EINVAL
    assert not any(is_open(fd) for fd in fds)
    with pytest.raises(FileNotFoundError):
        await fsync.sync([open_file(tmp_path, "c")], tmp_path / "missing")


async def test_a_cancelled_waiter_is_dropped_and_later_jobs_complete(tmp_path: Path) -> None:
    fsync = fsync_worker.for_loop(asyncio.get_running_loop())
    assert fsync is not None
    fd = open_file(tmp_path, "a")
    fsync.sync([fd], None).cancel()
    await fsync.sync([open_file(tmp_path, "b")], None)
    for _ in range(100):  # the cancelled job still ran and closed its descriptor
        if not is_open(fd):
            break
        await asyncio.sleep(0.01)
    assert not is_open(fd)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.lists(st.sampled_from(["file", "pipe"]), max_size=4), min_size=1, max_size=12))
def test_every_job_completes_once_with_its_own_outcome(tmp_path: Path, jobs: list[list[str]]) -> None:
    async def run() -> None:
        fsync = fsync_worker.for_loop(asyncio.get_running_loop())
        assert fsync is not None
        handed: list[list[int]] = []
        futures = []
        for i, kinds in enumerate(jobs):
            fds = [open_file(tmp_path, f"j{i}-{k}") if kind == "file" else open_pipe() for k, kind in enumerate(kinds)]
            handed.append(fds)
            futures.append(fsync.sync(fds, None))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for kinds, outcome in zip(jobs, outcomes, strict=True):
            if "pipe" in kinds:
                assert isinstance(outcome, OSError) and outcome.errno == errno.EINVAL
            else:
                assert outcome is None
        assert not any(is_open(fd) for fds in handed for fd in fds)
        assert not fsync._pending
        fsync.close()  # this loop ends here: its threads with it

    asyncio.run(run())


async def test_flush_rounds_of_a_log_go_through_the_worker(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
    fsync = fsync_worker.for_loop(asyncio.get_running_loop())
    assert fsync is not None
    submitted = 0
    real_sync = fsync.sync

    def counting_sync(fds: list[int], directory: Path | None) -> asyncio.Future[None]:
        nonlocal submitted
        submitted += 1
        return real_sync(fds, directory)

    fsync.sync = counting_sync  # type: ignore[method-assign]
    try:
        for _ in range(3):
            append(plog, make_batch([b"v"]))
        await asyncio.gather(*(plog.flush() for _ in range(5)))
        assert plog.flushed_offset == 3 and submitted >= 1
    finally:
        del fsync.sync
        plog.close()
