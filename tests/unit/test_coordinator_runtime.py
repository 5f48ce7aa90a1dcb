"""The coordinator runtime: its partition gate (keys overlap, one key never overlaps itself, the whole
partition runs alone), cancel-safety (memory is what the log replays to, whatever the caller does), and
operations that plan (`write_result`) or write in steps (`write_steps`) while the runtime appends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.storage.internal_topic_log import InternalTopicLog
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.topic_registry import Topic
from shoal.coordinator.runtime import (
    Answer,
    AsyncSteps,
    CoordinatorResult,
    CoordinatorRuntime,
    PartitionGate,
    Steps,
)
from shoal.coordinator.share_state import tombstone_record
from shoal.persister.persister import SharePartitionKey
from shoal.protocol.coordinator_records import CoordinatorRecord

from .cancellation import cancel_once_appended


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


# ---- cancel-safety ---------------------------------------------------------------------------------


class ReplayedOffsets:
    """A shard that remembers which offsets it replayed."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def replay(self, offset: int, record: CoordinatorRecord) -> None:
        self.offsets.append(offset)


def a_record(partition: int) -> CoordinatorRecord:
    return tombstone_record(SharePartitionKey("g", b"\x07" * 16, partition))


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog]]:
    plog = PartitionLog.open(tmp_path / "__share_group_state-0", LogConfig())
    yield CoordinatorRuntime(InternalTopicLog(Topic("__share_group_state", b"\x01" * 16, [plog])),
                             lambda _p: ReplayedOffsets()), plog
    plog.close()


async def test_append_cancelled_mid_fsync_is_still_replayed(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, plog = runtime
    await rt.load(0)
    await cancel_once_appended(plog, rt.append(0, [a_record(0), a_record(1)]))
    assert rt.shard(0).offsets == [0, 1] == [o for o, _ in rt.record_log.replay(0)]
    assert plog.flushed_offset == 2


async def test_operation_outlives_its_caller_and_keeps_its_key(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, plog = runtime
    await rt.load(0)
    after_first: list[int] = []

    async def first() -> None:
        await rt.append(0, [a_record(0)])
        await rt.append(0, [a_record(1)])  # still runs: the operation is not its caller's task

    async def second() -> None:
        after_first.extend(rt.shard(0).offsets)

    await cancel_once_appended(plog, rt.write(0, "k", first))
    await rt.write(0, "k", second)  # waits for the key, so it sees everything `first` replayed
    assert after_first == [0, 1]
    await rt.drain()
    reloaded = CoordinatorRuntime(rt.record_log, lambda _p: ReplayedOffsets())
    await reloaded.load(0)
    assert reloaded.shard(0).offsets == rt.shard(0).offsets


# ---- timers ----------------------------------------------------------------------------------------


async def test_timer_runs_as_an_operation_on_its_key_and_is_replaced_or_cancelled(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, _plog = runtime
    await rt.load(0)
    fired: list[str] = []
    released = asyncio.Event()

    def op(name: str) -> Any:
        async def run() -> None:
            fired.append(name)
            await rt.append(0, [a_record(len(fired))])
        return run

    async def hold_key() -> None:
        await released.wait()

    holder = asyncio.ensure_future(rt.write(0, "k", hold_key))
    await asyncio.sleep(0)
    rt.schedule(0, "t1", 0, "k", op("first"))
    rt.schedule(0, "t1", 0, "k", op("replacing"))  # the same timer again: only this one fires
    rt.schedule(0, "t2", 0, "k", op("cancelled"))
    rt.cancel(0, "t2")
    await asyncio.sleep(0.01)
    assert fired == [] and not rt.is_scheduled(0, "t1")  # fired, but waits for the key's writer
    released.set()
    await holder
    await rt.drain()
    assert fired == ["replacing"] and rt.shard(0).offsets == [0]


async def test_write_result_appends_and_replays_before_answering(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, plog = runtime
    await rt.load(0)

    def plan() -> CoordinatorResult[list[int]]:
        return CoordinatorResult([a_record(0), a_record(1)], list(rt.shard(0).offsets))

    assert await rt.write_result(0, "k", plan) == []  # the answer was planned before the write
    assert rt.shard(0).offsets == [0, 1] and plog.flushed_offset == 2  # and given once it was durable
    with pytest.raises(TypeError):  # a transactional batch needs the transactional runtime
        await rt.write_result(0, "k", lambda: CoordinatorResult([a_record(2)], None, producer_id=5))
    assert rt.shard(0).offsets == [0, 1]


# ---- operations that write in steps ----------------------------------------------------------------


def an_unwritable_record() -> CoordinatorRecord:
    """A record the log refuses: its group id does not fit the key's int16-length string."""
    return tombstone_record(SharePartitionKey("g" * 40_000, b"\x07" * 16, 0))


async def test_write_steps_replays_each_step_before_resuming_and_raises_a_failed_append_into_it(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, plog = runtime
    await rt.load(0)
    seen: list[object] = []

    def operation() -> Steps[str]:
        yield [a_record(0)]
        seen.append(list(rt.shard(0).offsets))  # the first step is durable and replayed here
        try:
            yield [an_unwritable_record()]
        except Exception as exc:  # the operation decides what the failed write means
            seen.append(type(exc))
        yield []  # nothing to write: resumed at once
        yield [a_record(1), a_record(2)]
        return "answered"

    assert await rt.write_steps(0, "k", operation) == "answered"
    assert seen[0] == [0] and isinstance(seen[1], type) and issubclass(seen[1], Exception)
    assert rt.shard(0).offsets == [0, 1, 2] == [o for o, _ in rt.record_log.replay(0)]
    assert plog.flushed_offset == 3


async def test_write_steps_cancelled_by_its_caller_finishes_every_step(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, plog = runtime
    await rt.load(0)

    def operation() -> Steps[None]:
        yield [a_record(0)]
        yield [a_record(1)]

    await cancel_once_appended(plog, rt.write_steps(0, "k", operation))
    await rt.drain()
    assert rt.shard(0).offsets == [0, 1]


async def test_write_async_steps_answers_what_the_operation_set(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, _plog = runtime
    await rt.load(0)

    async def operation(answer: Answer[int]) -> AsyncSteps:
        yield [a_record(0)]
        await asyncio.sleep(0)  # other work between the steps (a share-state RPC)
        answer.value = len(rt.shard(0).offsets)

    assert await rt.write_async_steps(0, "k", operation, -1) == 1


async def test_a_timer_runs_its_steps_holding_its_key(
    runtime: tuple[CoordinatorRuntime[ReplayedOffsets], PartitionLog],
) -> None:
    rt, _plog = runtime
    await rt.load(0)
    fired = asyncio.get_running_loop().create_future()

    def expire() -> Steps[None]:
        yield [a_record(0)]
        fired.set_result(list(rt.shard(0).offsets))

    rt.schedule_steps(0, "expiry", 0.0, "k", expire)
    assert await fired == [0]
    await rt.drain()
