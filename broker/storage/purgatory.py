"""The request purgatory: parked long-poll requests woken when the thing they wait on changes.

A key names the state a request waits on (`WakeKey`); a waiter wakes on the first notify of any of
its keys or at its deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogKey:
    """A partition's log: records appended, or its start moved (Fetch and ShareFetch wait on it)."""

    topic_id: bytes
    partition: int


@dataclass(frozen=True, slots=True)
class ShareFetchKey:
    """A share partition: records released, acknowledged or their locks expired (ShareFetch)."""

    group_id: str
    topic_id: bytes
    partition: int


@dataclass(frozen=True, slots=True)
class ShareSessionSlotKey:
    """A place in the share-session cache came free (a ShareFetch opening a session waits for one)."""


SHARE_SESSION_SLOT = ShareSessionSlotKey()


@dataclass(frozen=True, slots=True)
class ConnectionClosedKey:
    """A client connection closed: the long polls it started end early."""

    connection: object


WakeKey = LogKey | ShareFetchKey | ShareSessionSlotKey | ConnectionClosedKey


class Purgatory:
    def __init__(self) -> None:
        self._watchers: dict[WakeKey, set[asyncio.Future[bool]]] = {}

    async def wait(self, keys: Iterable[WakeKey], timeout_s: float) -> bool:
        """Park until one of `keys` is notified or `timeout_s` passes; True if woken by a notify."""
        if timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        keys = list(keys)
        for key in keys:
            self._watchers.setdefault(key, set()).add(fut)
        handle = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            handle.cancel()
            for key in keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(fut)
                    if not watchers:
                        del self._watchers[key]

    def notify(self, key: WakeKey) -> None:
        watchers = self._watchers.get(key)
        if not watchers:
            return
        for fut in list(watchers):
            if not fut.done():
                fut.set_result(True)


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
