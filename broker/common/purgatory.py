"""The request purgatory: parked long-poll requests woken when the thing they wait on changes.

A key names the state a request waits on (`WakeKey`); a waiter wakes on the first notify of any of
its keys or at its deadline. A `watch` registers before the caller looks at the state, so a notify
that arrives while it looks is not lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType


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


class Watch:
    """Interest in some keys, registered from creation until `close`; `wait` returns at once when one
    of them was notified since."""

    def __init__(self, purgatory: Purgatory, keys: Iterable[WakeKey]):
        self._purgatory = purgatory
        self._keys = list(keys)
        self._fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        for key in self._keys:
            purgatory._watchers.setdefault(key, set()).add(self._fut)

    @property
    def notified(self) -> bool:
        fut = self._fut
        return fut.done() and not fut.cancelled() and fut.result()

    async def wait(self, timeout_s: float) -> bool:
        """Park until a notify (possibly one that already happened) or `timeout_s`; True if notified."""
        if self._fut.done():
            return self.notified
        if timeout_s <= 0:
            return False
        if self._purgatory.on_park is not None:
            self._purgatory.on_park(self._keys)
        handle = asyncio.get_running_loop().call_later(timeout_s, _expire, self._fut)
        try:
            # Awaited directly, not through a shield: the future is this watch's alone, so a cancelled
            # waiter may cancel it, and a notify resumes the waiter one pass of the loop sooner.
            return await self._fut
        finally:
            handle.cancel()

    def close(self) -> None:
        watchers_by_key = self._purgatory._watchers
        for key in self._keys:
            watchers = watchers_by_key.get(key)
            if watchers is not None:
                watchers.discard(self._fut)
                if not watchers:
                    del watchers_by_key[key]

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Purgatory:
    def __init__(self) -> None:
        self._watchers: dict[WakeKey, set[asyncio.Future[bool]]] = {}
        # Told the keys of every waiter that parks: sidecar mode follows the upstream for the partitions
        # share fetches wait on, since records produced straight to the upstream notify nothing here.
        self.on_park: Callable[[Sequence[WakeKey]], None] | None = None

    def watching(self, key: WakeKey) -> bool:
        """Whether some waiter is registered on `key`."""
        return key in self._watchers

    def watch(self, keys: Iterable[WakeKey]) -> Watch:
        return Watch(self, keys)

    async def wait(self, keys: Iterable[WakeKey], timeout_s: float) -> bool:
        """Park until one of `keys` is notified or `timeout_s` passes; True if woken by a notify."""
        if timeout_s <= 0:
            return False
        with self.watch(keys) as watch:
            return await watch.wait(timeout_s)

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
