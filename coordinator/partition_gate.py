"""Concurrency for one state-topic partition: many keys at once, or the whole partition alone.

Writes for different keys may overlap so that their appends share one fsync (group commit); writes for
one key never overlap, because each builds its records from the state the previous one replayed.
Partition-wide work (cold snapshots, topic deletion, pruning) reads every key's state, so it waits for
in-flight key writes and keeps new ones out while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class PartitionGate:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._key_locks: dict[Hashable, asyncio.Lock] = {}
        self._key_users: dict[Hashable, int] = {}

    @contextlib.asynccontextmanager
    async def key(self, key: Hashable) -> AsyncIterator[None]:
        """Hold `key` alone, alongside other keys of the partition."""
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        self._key_users[key] = self._key_users.get(key, 0) + 1
        try:
            async with lock:
                async with self._cond:
                    await self._cond.wait_for(lambda: not self._exclusive)
                    self._shared += 1
                try:
                    yield
                finally:
                    async with self._cond:
                        self._shared -= 1
                        self._cond.notify_all()
        finally:
            self._key_users[key] -= 1
            if not self._key_users[key]:
                # No one holds or waits for this key: forget its lock so the map stays small.
                del self._key_users[key]
                del self._key_locks[key]

    @contextlib.asynccontextmanager
    async def whole(self) -> AsyncIterator[None]:
        """Hold the whole partition: no key write runs meanwhile."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()
