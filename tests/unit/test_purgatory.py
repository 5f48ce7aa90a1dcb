"""The purgatory's park hook and `watching`: what sidecar mode's tail poller learns of parked waiters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shoal.broker.common.purgatory import SHARE_SESSION_SLOT, LogKey, Purgatory, WakeKey

KEY = LogKey(b"\x01" * 16, 0)


def test_the_hook_hears_of_waiters_that_park_and_watching_follows_their_interest() -> None:
    async def run() -> None:
        purgatory = Purgatory()
        parked: list[list[WakeKey]] = []

        def on_park(keys: Sequence[WakeKey]) -> None:
            parked.append(list(keys))

        purgatory.on_park = on_park
        assert not purgatory.watching(KEY)
        with purgatory.watch([KEY, SHARE_SESSION_SLOT]) as watch:
            assert purgatory.watching(KEY)
            assert not await watch.wait(0)  # no wait at all: nothing parks
            assert parked == []
            waiting = asyncio.ensure_future(watch.wait(30))
            await asyncio.sleep(0)
            assert parked == [[KEY, SHARE_SESSION_SLOT]]
            purgatory.notify(KEY)
            assert await waiting
            assert await watch.wait(30)  # notified already: returns without parking again
            assert len(parked) == 1
        assert not purgatory.watching(KEY)

    asyncio.run(run())
