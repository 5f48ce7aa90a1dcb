"""The purgatory where long polls park: a notify wakes them at once, a watch sees a notify that came
while its owner looked at the state, a cancelled waiter leaves nothing behind; and the park hook and
`watching`, what sidecar mode's tail poller learns of parked waiters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from shoal.broker.common.purgatory import SHARE_SESSION_SLOT, LogKey, Purgatory, WakeKey

KEY = LogKey(b"\x01" * 16, 0)
OTHER = LogKey(b"\x01" * 16, 1)


async def test_a_notify_resumes_the_waiter_in_the_next_pass_of_the_loop() -> None:
    purgatory = Purgatory()
    waiter = asyncio.ensure_future(purgatory.wait([KEY, OTHER], 3600))
    await asyncio.sleep(0)  # parked
    purgatory.notify(OTHER)
    await asyncio.sleep(0)  # one pass: no timer, no relay through another future, stands between them
    assert waiter.done() and waiter.result() is True
    assert purgatory._watchers == {}


async def test_a_notify_during_the_look_is_not_lost() -> None:
    purgatory = Purgatory()
    with purgatory.watch([KEY]) as watch:
        purgatory.notify(KEY)  # lands after the watch was registered, before the wait
        assert watch.notified
        assert await watch.wait(3600) is True


async def test_the_wait_ends_at_its_deadline_unnotified() -> None:
    purgatory = Purgatory()
    assert await purgatory.wait([KEY], 0.001) is False
    assert await purgatory.wait([KEY], 0) is False
    assert purgatory._watchers == {}


async def test_a_cancelled_waiter_leaves_no_watch_behind() -> None:
    purgatory = Purgatory()
    with purgatory.watch([KEY]) as watch:
        waiter = asyncio.ensure_future(watch.wait(3600))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not watch.notified  # and asking does not raise the cancellation
        purgatory.notify(KEY)
    assert purgatory._watchers == {}


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
