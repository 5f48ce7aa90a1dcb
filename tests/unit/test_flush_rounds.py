"""Flush rounds of several partition logs due at once: each round releases its own waiters when its own fsync
is done, and a failed fsync fails only the waiters whose data it covered."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from shoal.broker.storage.partition_log import LogConfig, PartitionLog

from .test_partition_log import append, executor_fsync, make_batch


def _logs(tmp_path: Path, n: int) -> list[PartitionLog]:
    logs = [PartitionLog.open(tmp_path / f"__share_group_state-{i}", LogConfig()) for i in range(n)]
    for plog in logs:
        append(plog, make_batch([b"state"]))
    return logs


def _fd_dir(fd: int) -> str:
    return os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))


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
    executor_fsync(monkeypatch)
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
