"""The state-partition gate: keys overlap, one key never overlaps itself, the whole partition runs alone."""

from __future__ import annotations

import asyncio

from shoal.coordinator.partition_gate import PartitionGate


async def _hold(gate: PartitionGate, key: str | None, log: list[str], name: str) -> None:
    ctx = gate.whole() if key is None else gate.key(key)
    async with ctx:
        log.append(f"{name}+")
        await asyncio.sleep(0.01)
        log.append(f"{name}-")


def _overlapped(log: list[str], a: str, b: str) -> bool:
    return log.index(f"{b}+") < log.index(f"{a}-")


async def test_different_keys_overlap() -> None:
    gate, log = PartitionGate(), []
    await asyncio.gather(_hold(gate, "k1", log, "a"), _hold(gate, "k2", log, "b"))
    assert _overlapped(log, "a", "b")


async def test_one_key_is_serialised() -> None:
    gate, log = PartitionGate(), []
    await asyncio.gather(_hold(gate, "k1", log, "a"), _hold(gate, "k1", log, "b"))
    assert log == ["a+", "a-", "b+", "b-"]


async def test_whole_partition_excludes_key_writers_both_ways() -> None:
    gate, log = PartitionGate(), []
    await asyncio.gather(_hold(gate, "k1", log, "a"), _hold(gate, None, log, "w"), _hold(gate, "k2", log, "b"))
    w_start, w_end = log.index("w+"), log.index("w-")
    assert w_end == w_start + 1, log  # nothing ran while the whole partition was held
    assert log.index("a-") < w_start


async def test_key_locks_are_forgotten_when_idle() -> None:
    gate, log = PartitionGate(), []
    await asyncio.gather(*(_hold(gate, f"k{i}", log, f"n{i}") for i in range(20)))
    assert gate._key_locks == {} and gate._key_users == {}
