"""Cancelling a coordinator write at the one moment that matters: its records are in the log, their
fsync is under way, and nothing has been replayed yet (what a client disconnect does to its request)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from shoal.broker.storage.partition_log import PartitionLog


async def cancel_once_appended(plog: PartitionLog, work: Awaitable[Any]) -> None:
    """Run `work` until it has appended to `plog`, then cancel it and see the cancellation raised."""
    end = plog.log_end_offset
    task = asyncio.ensure_future(work)
    while plog.log_end_offset == end:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
