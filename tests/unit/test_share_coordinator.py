"""Share coordinator: records written per the persistence policy, batch merging, fencing, replay and pruning.

Everything runs against real partition logs in a temp dir (the same storage `__share_group_state` uses).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.broker.apis.services import ShareStateServices
from shoal.broker.apis.share_state_apis import register
from shoal.broker.common.config import BrokerConfig, Listener
from shoal.broker.network.connection import KafkaConnection, RequestContext
from shoal.broker.security.authorizer import AllowAllAuthorizer, Operation, Principal, ResourceType
from shoal.broker.server.server import Broker
from shoal.broker.storage.internal_topic_log import InternalTopicLog
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.topic_registry import Topic, topic_id_to_str
from shoal.coordinator.placement import java_string_hashcode
from shoal.coordinator.share_coordinator import ShareCoordinator
from shoal.coordinator.share_coordinator_client import InProcessShareCoordinatorClient
from shoal.coordinator.share_state import (
    ShareState,
    combine_state_batches,
    state_partition_for,
)
from shoal.persister.default_persister import DefaultStatePersister
from shoal.persister.persister import PersistedStateBatch, SharePartitionKey, WriteStateRequest
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.coordinator_records import SHARE_SNAPSHOT, SHARE_UPDATE, CoordinatorRecord
from shoal.protocol.errors import ErrorCode

from .cancellation import cancel_once_appended

AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
TOPIC = uuid.UUID("6f1c0e2a-4d4b-4a7e-9a1f-3b2c1d0e9f88").bytes
GROUP = "g1"
NUM_STATE_PARTITIONS = 3
B = PersistedStateBatch

InitReq = messages.InitializeShareGroupStateRequest
ReadReq = messages.ReadShareGroupStateRequest
WriteReq = messages.WriteShareGroupStateRequest
DeleteReq = messages.DeleteShareGroupStateRequest
SummaryReq = messages.ReadShareGroupStateSummaryRequest


# ---- fixtures / helpers ------------------------------------------------------------------------------


def open_state_topic(base: Path, segment_bytes: int = 1 << 20) -> Topic:
    return Topic(
        name="__share_group_state",
        topic_id=b"\x01" * 16,
        partitions=[
            PartitionLog.open(base / f"__share_group_state-{i}", LogConfig(segment_bytes=segment_bytes))
            for i in range(NUM_STATE_PARTITIONS)
        ],
    )


def close_topic(topic: Topic) -> None:
    for plog in topic.partitions:
        plog.close()


class Clock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


async def make_coordinator(topic: Topic, clock: Clock | None = None, **kw: Any) -> ShareCoordinator:
    c = ShareCoordinator(InternalTopicLog(topic), clock_ms=clock or Clock(), **kw)
    await c.load()
    return c


@pytest.fixture
def state_topic(tmp_path: Path) -> Iterator[Topic]:
    topic = open_state_topic(tmp_path)
    yield topic
    close_topic(topic)


def records_of(topic: Topic, key: SharePartitionKey) -> list[tuple[int, CoordinatorRecord]]:
    log = InternalTopicLog(topic)
    sp = state_partition_for(key, log.num_partitions)
    return [
        (o, r) for o, r in log.replay(sp)
        if (r.key.group_id, r.key.topic_id, r.key.partition) == (key.group_id, key.topic_id, key.partition)
    ]


def key(partition: int = 0, group: str = GROUP, topic: bytes = TOPIC) -> SharePartitionKey:
    return SharePartitionKey(group, topic, partition)


def init_req(k: SharePartitionKey, state_epoch: int = 0, start_offset: int = -1) -> Any:
    return InitReq(group_id=k.group_id, topics=[InitReq.InitializeStateData(topic_id=k.topic_id, partitions=[
        InitReq.PartitionData(partition=k.partition, state_epoch=state_epoch, start_offset=start_offset)])])


def read_req(k: SharePartitionKey, leader_epoch: int = 0) -> Any:
    return ReadReq(group_id=k.group_id, topics=[ReadReq.ReadStateData(topic_id=k.topic_id, partitions=[
        ReadReq.PartitionData(partition=k.partition, leader_epoch=leader_epoch)])])


def write_req(
    k: SharePartitionKey,
    batches: list[PersistedStateBatch],
    *,
    start_offset: int = -1,
    state_epoch: int = 0,
    leader_epoch: int = 0,
    dcc: int = -1,
) -> Any:
    return WriteReq(group_id=k.group_id, topics=[WriteReq.WriteStateData(topic_id=k.topic_id, partitions=[
        WriteReq.PartitionData(
            partition=k.partition, state_epoch=state_epoch, leader_epoch=leader_epoch, start_offset=start_offset,
            delivery_complete_count=dcc,
            state_batches=[WriteReq.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                               delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                           for b in batches])])])


def delete_req(k: SharePartitionKey) -> Any:
    return DeleteReq(group_id=k.group_id, topics=[DeleteReq.DeleteStateData(topic_id=k.topic_id, partitions=[
        DeleteReq.PartitionData(partition=k.partition)])])


def summary_req(k: SharePartitionKey, leader_epoch: int = 0) -> Any:
    return SummaryReq(group_id=k.group_id, topics=[SummaryReq.ReadStateSummaryData(topic_id=k.topic_id, partitions=[
        SummaryReq.PartitionData(partition=k.partition, leader_epoch=leader_epoch)])])


def only(resp: Any) -> Any:
    [result] = resp.results
    [p] = result.partitions
    return p


def batches_of(p: Any) -> list[PersistedStateBatch]:
    return [B(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p.state_batches]


def all_states(c: ShareCoordinator) -> dict[SharePartitionKey, ShareState]:
    return {k: s for m in c.maps for k, s in m}


def replayable(states: dict[SharePartitionKey, ShareState]) -> dict[SharePartitionKey, ShareState]:
    """States as a replay of a pruned state topic rebuilds them: the count of updates since the last
    count-triggered snapshot lives in memory only (as in Kafka), and updates before a pruned-to cold
    snapshot are gone, so it is left out of the comparison."""
    return {k: replace(s, updates_since_snapshot=0) for k, s in states.items()}


# ---- partitioning ------------------------------------------------------------------------------------


def java_hash_by_formula(s: str) -> int:
    # s[0]*31^(n-1) + ... + s[n-1], wrapped to a signed 32-bit int (ASCII input: one code unit per char)
    n = len(s)
    total = sum(ord(ch) * 31 ** (n - 1 - i) for i, ch in enumerate(s)) % 2**32
    return total - 2**32 if total >= 2**31 else total


def string_with_hash(target: int, length: int = 7) -> str:
    """An ASCII string whose Java hashCode is `target` (31 is odd, so 7 base-31 digits reach any int32)."""
    base = sum(ord("A") * 31**i for i in range(length))
    rest = (target - base) % 2**32
    digits = []
    for _ in range(length):
        digits.append(rest % 31)
        rest //= 31
    assert rest == 0
    return "".join(chr(ord("A") + d) for d in reversed(digits))


def test_java_string_hashcode_known_values() -> None:
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("hello") == 99162322  # as Java computes it
    assert java_string_hashcode("polygenelubricants") == -(2**31)  # the classic Integer.MIN_VALUE string
    text = f"{GROUP}:{topic_id_to_str(TOPIC)}:7"
    assert java_string_hashcode(text) == java_hash_by_formula(text)
    # non-BMP characters hash as their two UTF-16 surrogates, as in Java
    assert java_string_hashcode("\U0001f600") == 0xD83D * 31 + 0xDE00


def test_state_partition_matches_kafka_formula() -> None:
    for p in range(20):
        k = key(p)
        h = java_hash_by_formula(f"{k.group_id}:{topic_id_to_str(k.topic_id)}:{k.partition}")
        assert state_partition_for(k, 50) == abs(h) % 50
        assert state_partition_for(k, 3) == abs(h) % 3
    # Utils.abs(Integer.MIN_VALUE) is 0, not 2^31 (which would pick partition 2^31 % 3 == 2)
    suffix = f":{topic_id_to_str(TOPIC)}:0"
    n = len(suffix)
    inv = pow(31**n, -1, 2**32)
    group = string_with_hash(((-(2**31) - java_hash_by_formula(suffix)) * inv) % 2**32)
    assert java_string_hashcode(group + suffix) == -(2**31)
    assert state_partition_for(SharePartitionKey(group, TOPIC, 0), 3) == 0


# ---- the batch combiner ------------------------------------------------------------------------------


def test_tie_on_delivery_count_goes_to_higher_state() -> None:
    merged = combine_state_batches([B(0, 9, AVAILABLE, 1)], [B(5, 14, ACKNOWLEDGED, 1)], -1)
    assert merged == [B(0, 4, AVAILABLE, 1), B(5, 14, ACKNOWLEDGED, 1)]
    # and the order in which they arrive does not matter
    assert combine_state_batches([B(5, 14, ACKNOWLEDGED, 1)], [B(0, 9, AVAILABLE, 1)], -1) == merged


def test_higher_delivery_count_wins_over_state() -> None:
    assert combine_state_batches([B(0, 9, ARCHIVED, 1)], [B(3, 5, AVAILABLE, 2)], -1) == [
        B(0, 2, ARCHIVED, 1), B(3, 5, AVAILABLE, 2), B(6, 9, ARCHIVED, 1)
    ]
    # a stale update (lower count) cannot undo an acknowledgement
    assert combine_state_batches([B(0, 9, ACKNOWLEDGED, 2)], [B(0, 9, AVAILABLE, 1)], -1) == [
        B(0, 9, ACKNOWLEDGED, 2)
    ]


def test_prune_below_start_offset_and_coalesce() -> None:
    assert combine_state_batches([B(0, 4, AVAILABLE, 1), B(5, 9, ARCHIVED, 1)], [], 7) == [B(7, 9, ARCHIVED, 1)]
    assert combine_state_batches([B(0, 4, AVAILABLE, 1)], [B(5, 9, AVAILABLE, 1)], -1) == [B(0, 9, AVAILABLE, 1)]
    assert combine_state_batches([B(0, 4, AVAILABLE, 1)], [B(6, 9, AVAILABLE, 1)], -1) == [
        B(0, 4, AVAILABLE, 1), B(6, 9, AVAILABLE, 1)
    ]
    assert combine_state_batches([B(0, 4, AVAILABLE, 1)], [], 5) == []


batch_st = st.builds(
    lambda first, length, state, count: B(first, first + length, state, count),
    st.integers(0, 40), st.integers(0, 8), st.sampled_from([AVAILABLE, ACKNOWLEDGED, ARCHIVED]), st.integers(0, 4),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(batch_st, max_size=6), st.lists(batch_st, max_size=6), st.integers(-1, 30).filter(lambda s: s != 0))
def test_combiner_matches_per_offset_rule(
    so_far: list[PersistedStateBatch], new: list[PersistedStateBatch], start: int
) -> None:
    merged = combine_state_batches(so_far, new, start)
    expected: dict[int, tuple[int, int]] = {}
    for b in so_far + new:
        for o in range(b.first_offset, b.last_offset + 1):
            if start != -1 and o < start:
                continue
            prio = (b.delivery_count, b.delivery_state)
            expected[o] = max(expected.get(o, prio), prio)
    got = {o: (b.delivery_count, b.delivery_state) for b in merged for o in range(b.first_offset, b.last_offset + 1)}
    assert got == expected
    assert sum(b.last_offset - b.first_offset + 1 for b in merged) == len(got)  # no overlaps
    for a, b in zip(merged, merged[1:], strict=False):
        assert a.last_offset < b.first_offset
        # coalesced: touching neighbours differ
        assert not (a.last_offset + 1 == b.first_offset and (a.delivery_state, a.delivery_count)
                    == (b.delivery_state, b.delivery_count))


# ---- the persistence policy --------------------------------------------------------------------------


async def test_initialize_writes_a_snapshot_and_write_an_update(state_topic: Topic) -> None:
    clock = Clock(5000)
    c = await make_coordinator(state_topic, clock)
    k = key()
    assert only(await c.initialize_state(init_req(k, state_epoch=1, start_offset=-1))).error_code == ErrorCode.NONE
    [(_, snap)] = records_of(state_topic, k)
    assert snap.record_type == SHARE_SNAPSHOT
    assert (snap.value.snapshot_epoch, snap.value.state_epoch, snap.value.start_offset) == (0, 1, -1)
    assert snap.value.delivery_complete_count == -1
    assert snap.value.create_timestamp == snap.value.write_timestamp == 5000

    # a retried initialize with the same epoch and start offset writes nothing
    assert only(await c.initialize_state(init_req(k, state_epoch=1, start_offset=-1))).error_code == ErrorCode.NONE
    assert len(records_of(state_topic, k)) == 1

    resp = await c.write_state(write_req(k, [B(10, 19, AVAILABLE, 1)], start_offset=10, state_epoch=1, dcc=0))
    assert only(resp).error_code == ErrorCode.NONE
    _, upd = records_of(state_topic, k)[-1]
    assert upd.record_type == SHARE_UPDATE
    assert upd.value.snapshot_epoch == 0 and upd.value.start_offset == 10
    assert [(b.first_offset, b.last_offset) for b in upd.value.state_batches] == [(10, 19)]

    p = only(await c.read_state(read_req(k)))
    assert (p.error_code, p.state_epoch, p.start_offset) == (ErrorCode.NONE, 1, 10)
    assert batches_of(p) == [B(10, 19, AVAILABLE, 1)]

    # re-initialising (alter offsets) is a fresh start: new snapshot epoch, batches gone, lag countable
    assert only(await c.initialize_state(init_req(k, state_epoch=2, start_offset=50))).error_code == ErrorCode.NONE
    _, snap2 = records_of(state_topic, k)[-1]
    assert snap2.record_type == SHARE_SNAPSHOT and snap2.value.snapshot_epoch == 1
    p = only(await c.read_state(read_req(k)))
    assert (p.state_epoch, p.start_offset, p.state_batches) == (2, 50, [])
    s = only(await c.read_state_summary(summary_req(k)))
    assert (s.start_offset, s.delivery_complete_count) == (50, 0)


async def test_snapshot_after_n_updates_carries_merged_state(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic, snapshot_update_records_per_snapshot=3)
    k = key(1)
    await c.initialize_state(init_req(k, start_offset=0))
    writes = [
        [B(0, 9, AVAILABLE, 1)],
        [B(0, 4, ACKNOWLEDGED, 1)],
        [B(10, 14, AVAILABLE, 1)],
        [B(5, 9, ARCHIVED, 1), B(15, 19, AVAILABLE, 1)],  # the 4th write: 3 updates exist, so a snapshot
    ]
    for w in writes:
        assert only(await c.write_state(write_req(k, w))).error_code == ErrorCode.NONE
    types = [r.record_type for _, r in records_of(state_topic, k)]
    assert types == [SHARE_SNAPSHOT, SHARE_UPDATE, SHARE_UPDATE, SHARE_UPDATE, SHARE_SNAPSHOT]
    _, snap = records_of(state_topic, k)[-1]
    assert snap.value.snapshot_epoch == 1
    merged = [B(0, 4, ACKNOWLEDGED, 1), B(5, 9, ARCHIVED, 1), B(10, 19, AVAILABLE, 1)]
    assert [B(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in snap.value.state_batches] == merged
    assert batches_of(only(await c.read_state(read_req(k)))) == merged
    # the count restarts after the snapshot: next write is an update again
    await c.write_state(write_req(k, [B(20, 20, AVAILABLE, 1)]))
    assert records_of(state_topic, k)[-1][1].record_type == SHARE_UPDATE


async def test_only_a_count_triggered_snapshot_restarts_the_update_count(state_topic: Topic) -> None:
    clock = Clock(0)
    c = await make_coordinator(state_topic, clock, snapshot_update_records_per_snapshot=3,
                               cold_snapshot_interval_ms=1000)
    k = key(2)
    await c.initialize_state(init_req(k, start_offset=0))
    for i in range(2):
        await c.write_state(write_req(k, [B(i, i, ACKNOWLEDGED, 1)]))
    clock.now = 1000
    assert await c.maybe_cold_snapshot() == 1
    # The cold snapshot leaves the two updates counted: the third update, then the count-triggered snapshot.
    for i in range(2, 5):
        await c.write_state(write_req(k, [B(i, i, ACKNOWLEDGED, 1)]))
    types = [r.record_type for _, r in records_of(state_topic, k)]
    assert types == [SHARE_SNAPSHOT, SHARE_UPDATE, SHARE_UPDATE, SHARE_SNAPSHOT, SHARE_UPDATE, SHARE_SNAPSHOT,
                     SHARE_UPDATE]


async def test_merge_rules_through_writes(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(2)
    await c.initialize_state(init_req(k, start_offset=0))
    await c.write_state(write_req(k, [B(0, 9, ACKNOWLEDGED, 2)], start_offset=0))
    # a late write with a lower delivery count loses; with a tie the higher state wins
    await c.write_state(write_req(k, [B(0, 4, AVAILABLE, 1)], start_offset=-1))
    await c.write_state(write_req(k, [B(8, 12, AVAILABLE, 2)], start_offset=-1))
    p = only(await c.read_state(read_req(k)))
    assert p.start_offset == 0  # -1 left it unchanged
    assert batches_of(p) == [B(0, 9, ACKNOWLEDGED, 2), B(10, 12, AVAILABLE, 2)]
    # a higher start offset prunes and trims; a lower one never moves it back
    await c.write_state(write_req(k, [], start_offset=9))
    assert batches_of(only(await c.read_state(read_req(k)))) == [B(9, 9, ACKNOWLEDGED, 2), B(10, 12, AVAILABLE, 2)]
    await c.write_state(write_req(k, [B(3, 3, AVAILABLE, 5)], start_offset=3))
    p = only(await c.read_state(read_req(k)))
    assert p.start_offset == 9
    assert batches_of(p) == [B(9, 9, ACKNOWLEDGED, 2), B(10, 12, AVAILABLE, 2)]


async def test_delivery_complete_count_v1(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(3)
    await c.initialize_state(init_req(k, start_offset=0))
    await c.write_state(write_req(k, [B(0, 9, ACKNOWLEDGED, 1)], start_offset=0, dcc=10))
    assert only(await c.read_state_summary(summary_req(k))).delivery_complete_count == 10
    # same start offset: the larger count stands; an older window (lower start) cannot change it
    await c.write_state(write_req(k, [], start_offset=0, dcc=4))
    assert only(await c.read_state_summary(summary_req(k))).delivery_complete_count == 10
    await c.write_state(write_req(k, [], start_offset=10, dcc=0))
    s = only(await c.read_state_summary(summary_req(k)))
    assert (s.start_offset, s.delivery_complete_count) == (10, 0)


# ---- errors and fencing -------------------------------------------------------------------------------


async def test_uninitialised_keys(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(4)
    assert only(await c.read_state(read_req(k))).error_code == ErrorCode.INVALID_REQUEST
    assert only(await c.write_state(write_req(k, []))).error_code == ErrorCode.INVALID_REQUEST
    s = only(await c.read_state_summary(summary_req(k)))
    assert (s.error_code, s.start_offset, s.delivery_complete_count) == (ErrorCode.NONE, -1, -1)
    assert only(await c.delete_state(delete_req(k))).error_code == ErrorCode.NONE  # no-op
    assert records_of(state_topic, k) == []


async def test_fencing(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(5)
    await c.initialize_state(init_req(k, state_epoch=3, start_offset=0))
    assert only(await c.initialize_state(init_req(k, state_epoch=2))).error_code == ErrorCode.FENCED_STATE_EPOCH
    assert only(await c.write_state(write_req(k, [], state_epoch=2))).error_code == ErrorCode.FENCED_STATE_EPOCH

    # a new leader's read records its epoch (a record), older leaders are fenced from then on
    n = len(records_of(state_topic, k))
    assert only(await c.read_state(read_req(k, leader_epoch=5))).error_code == ErrorCode.NONE
    assert len(records_of(state_topic, k)) == n + 1
    assert records_of(state_topic, k)[-1][1].value.leader_epoch == 5
    assert only(await c.read_state(read_req(k, leader_epoch=5))).error_code == ErrorCode.NONE
    assert len(records_of(state_topic, k)) == n + 1  # same epoch: nothing to record
    assert only(await c.read_state(read_req(k, leader_epoch=4))).error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert only(await c.write_state(write_req(k, [], state_epoch=3, leader_epoch=4))).error_code == \
        ErrorCode.FENCED_LEADER_EPOCH
    assert only(await c.write_state(write_req(k, [], state_epoch=3, leader_epoch=5))).error_code == ErrorCode.NONE
    assert only(await c.read_state_summary(summary_req(k))).leader_epoch == 5

    # a re-initialise keeps the leader fence
    await c.initialize_state(init_req(k, state_epoch=4, start_offset=0))
    assert only(await c.read_state(read_req(k, leader_epoch=4))).error_code == ErrorCode.FENCED_LEADER_EPOCH

    assert only(await c.read_state(read_req(k, leader_epoch=-1))).error_code == ErrorCode.INVALID_REQUEST
    # A write with an epoch of -1 ("not known") skips that epoch's fencing, as in Kafka.
    assert only(await c.write_state(write_req(k, [], state_epoch=-1, leader_epoch=5))).error_code == ErrorCode.NONE
    assert only(await c.write_state(write_req(k, [], state_epoch=4, leader_epoch=-1))).error_code == ErrorCode.NONE
    assert only(await c.write_state(write_req(k, [], state_epoch=3, leader_epoch=-1))).error_code == \
        ErrorCode.FENCED_STATE_EPOCH
    assert only(await c.write_state(write_req(k, [], state_epoch=-2, leader_epoch=5))).error_code == \
        ErrorCode.INVALID_REQUEST
    assert only(await c.read_state(read_req(key(-1)))).error_code == ErrorCode.INVALID_REQUEST
    assert only(await c.read_state(read_req(key(0, topic=b"\x00" * 16)))).error_code == ErrorCode.INVALID_REQUEST


async def test_unknown_topic_or_partition_when_metadata_given(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic, partition_count=lambda tid: 2 if tid == TOPIC else None)
    assert only(await c.initialize_state(init_req(key(1)))).error_code == ErrorCode.NONE
    assert only(await c.initialize_state(init_req(key(2)))).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    other = key(0, topic=b"\x07" * 16)
    assert only(await c.read_state(read_req(other))).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_delete_writes_tombstone(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(6)
    await c.initialize_state(init_req(k, start_offset=0))
    await c.write_state(write_req(k, [B(0, 3, AVAILABLE, 1)]))
    assert only(await c.delete_state(delete_req(k))).error_code == ErrorCode.NONE
    _, last = records_of(state_topic, k)[-1]
    assert last.record_type == SHARE_SNAPSHOT and last.value is None
    assert only(await c.read_state(read_req(k))).error_code == ErrorCode.INVALID_REQUEST
    assert only(await c.read_state_summary(summary_req(k))).start_offset == -1
    # and the deletion survives a restart
    c2 = await make_coordinator(state_topic)
    assert only(await c2.read_state(read_req(k))).error_code == ErrorCode.INVALID_REQUEST


async def test_delete_topics_tombstones_every_key_of_the_topic(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    other = b"\x09" * 16
    for p in range(4):
        await c.initialize_state(init_req(key(p), start_offset=0))
    await c.initialize_state(init_req(key(0, topic=other), start_offset=0))
    assert await c.delete_topics({TOPIC}) == 4
    assert set(all_states(c)) == {key(0, topic=other)}


async def test_state_of_topics_deleted_while_down_is_swept_at_start(state_topic: Topic) -> None:
    other = b"\x09" * 16
    c = await make_coordinator(state_topic)
    await c.initialize_state(init_req(key(0), start_offset=0))
    await c.initialize_state(init_req(key(1, topic=other), start_offset=0))
    # Restart knowing only TOPIC: the other topic was deleted before its state was.
    c = await make_coordinator(state_topic, partition_count=lambda tid: 2 if tid == TOPIC else None)
    assert await c.delete_orphaned_state() == 1
    assert set(all_states(c)) == {key(0)}
    assert await c.delete_orphaned_state() == 0


async def test_write_with_unusable_batches_is_refused_and_changes_nothing(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    await c.initialize_state(init_req(key(), start_offset=0))
    before = all_states(c)
    for batches in ([PersistedStateBatch(0, 9, 0, 1), PersistedStateBatch(5, 3, 2, 1)],  # inverted
                    [PersistedStateBatch(-3, 2, 0, 1)],  # negative
                    [PersistedStateBatch(0, 2, 5, 1)],  # no such delivery state (3 is ARCHIVING)
                    [PersistedStateBatch(0, 2, 0, -1)]):  # negative delivery count
        p = only(await c.write_state(write_req(key(), batches, start_offset=0)))
        assert p.error_code == ErrorCode.INVALID_REQUEST, batches
    assert all_states(c) == before
    # Overlapping batches are the combiner's job, not an error.
    ok = [PersistedStateBatch(0, 9, 0, 1), PersistedStateBatch(5, 7, 2, 1)]
    assert only(await c.write_state(write_req(key(), ok, start_offset=0))).error_code == ErrorCode.NONE


async def test_load_in_progress_until_loaded(state_topic: Topic) -> None:
    c = ShareCoordinator(InternalTopicLog(state_topic))
    k = key(7)
    assert only(await c.initialize_state(init_req(k))).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert only(await c.read_state_summary(summary_req(k))).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    await c.load()
    assert only(await c.initialize_state(init_req(k))).error_code == ErrorCode.NONE


async def test_failed_append_leaves_memory_unchanged(tmp_path: Path) -> None:
    topic = open_state_topic(tmp_path)
    c = await make_coordinator(topic)
    k = key(8)
    await c.initialize_state(init_req(k, start_offset=0))
    before = all_states(c)[k]
    snapshot = (before.start_offset, list(before.state_batches), before.updates_since_snapshot)
    close_topic(topic)  # the storage goes away underneath the coordinator
    p = only(await c.write_state(write_req(k, [B(0, 9, ACKNOWLEDGED, 1)], start_offset=5)))
    assert p.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    after = all_states(c)[k]
    assert (after.start_offset, after.state_batches, after.updates_since_snapshot) == snapshot
    assert c.stats.write_errors == 1


async def test_concurrent_writes_to_one_key_all_land(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic, snapshot_update_records_per_snapshot=4)
    k = key(9)
    await c.initialize_state(init_req(k, start_offset=0))
    resps = await asyncio.gather(*(c.write_state(write_req(k, [B(i * 10, i * 10 + 4, ACKNOWLEDGED, 1)]))
                                   for i in range(20)))
    assert all(only(r).error_code == ErrorCode.NONE for r in resps)
    expected = [B(i * 10, i * 10 + 4, ACKNOWLEDGED, 1) for i in range(20)]
    assert batches_of(only(await c.read_state(read_req(k)))) == expected
    c2 = await make_coordinator(state_topic, snapshot_update_records_per_snapshot=4)
    assert all_states(c2) == all_states(c)
    assert c.stats.records_written == 21 and c.stats.writes == 21


async def test_write_cancelled_mid_append_is_replayed_into_memory(state_topic: Topic) -> None:
    # A client that disconnects cancels its request task; a write whose record already reached the log
    # must still reach memory, or the next snapshot (built from memory) silently drops it.
    c = await make_coordinator(state_topic)
    k = key(10)
    await c.initialize_state(init_req(k, start_offset=0))
    plog = state_topic.partitions[c.partition_for(k)]
    await cancel_once_appended(plog, c.write_state(write_req(k, [B(0, 4, ACKNOWLEDGED, 1)])))
    # The next write to the key plans from the cancelled one's replayed state.
    assert only(await c.write_state(write_req(k, [B(5, 9, ARCHIVED, 1)]))).error_code == ErrorCode.NONE
    await c.stop()
    assert all_states(c)[k].state_batches == [B(0, 4, ACKNOWLEDGED, 1), B(5, 9, ARCHIVED, 1)]
    assert all_states(await make_coordinator(state_topic)) == all_states(c)


# ---- replay, cold snapshots, pruning ------------------------------------------------------------------


async def test_cold_snapshot_and_prune(tmp_path: Path) -> None:
    topic = open_state_topic(tmp_path, segment_bytes=600)  # small segments so pruning frees whole files
    clock = Clock(0)
    c = await make_coordinator(topic, clock, snapshot_update_records_per_snapshot=1000,
                               cold_snapshot_interval_ms=60_000)
    hot, cold = key(10), key(11, group="g2")
    for k in (hot, cold):
        await c.initialize_state(init_req(k, start_offset=0))
    for i in range(30):
        await c.write_state(write_req(hot, [B(i, i, ACKNOWLEDGED, 1)]))
    await c.write_state(write_req(cold, [B(0, 4, ARCHIVED, 3)]))
    assert await c.prune() == {}  # each key's only snapshot is its partition's first record
    assert await c.maybe_cold_snapshot(59_999) == 0  # not old enough
    clock.now = 60_000
    assert await c.maybe_cold_snapshot() == 2
    assert await c.maybe_cold_snapshot(120_000) == 0  # quiet since: nothing gained by another round
    states = all_states(c)
    assert states[hot].snapshot_epoch == 1 and states[hot].write_timestamp == 60_000
    assert states[hot].create_timestamp == 0  # kept: marks the snapshot as a cold one
    moved = await c.prune()
    for k in (hot, cold):
        sp = c.partition_for(k)
        assert moved[sp] == min(s.snapshot_offset for kk, s in states.items() if c.partition_for(kk) == sp) > 0
        assert topic.partitions[sp].log_start_offset == moved[sp]
    assert await c.prune() == {}  # idempotent
    close_topic(topic)
    reopened = open_state_topic(tmp_path, segment_bytes=600)
    c2 = await make_coordinator(reopened)
    assert replayable(all_states(c2)) == replayable(states)
    assert batches_of(only(await c2.read_state(read_req(hot)))) == [B(0, 29, ACKNOWLEDGED, 1)]
    close_topic(reopened)


async def test_prune_after_delete_frees_the_partition(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    k = key(12)
    sp = c.partition_for(k)
    await c.initialize_state(init_req(k, start_offset=0))
    await c.write_state(write_req(k, [B(0, 1, AVAILABLE, 1)]))
    await c.delete_state(delete_req(k))
    live_here = [kk for kk in all_states(c) if c.partition_for(kk) == sp]
    assert live_here == []
    moved = await c.prune()
    assert moved[sp] == state_topic.partitions[sp].log_end_offset
    c2 = await make_coordinator(state_topic)
    assert all_states(c2) == {}


OPS = st.one_of(
    st.tuples(st.just("init"), st.integers(0, 3), st.integers(0, 3), st.sampled_from([-1, 0, 5, 20])),
    st.tuples(st.just("write"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.sampled_from([-1, 0, 5, 12]),
              st.lists(batch_st, max_size=3), st.integers(-1, 10)),
    st.tuples(st.just("read"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.integers(0, 3)),
    st.tuples(st.just("cold"), st.integers(0, 200_000)),
    st.tuples(st.just("prune")),
)


def key_n(n: int) -> SharePartitionKey:
    return key(n % 2, group=f"g{n // 2}")


@contextmanager
def temp_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="share-coord-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def run_ops(base: Path, ops: list[tuple[Any, ...]]) -> None:
    topic = open_state_topic(base, segment_bytes=500)
    clock = Clock(0)
    c = await make_coordinator(topic, clock, snapshot_update_records_per_snapshot=2, cold_snapshot_interval_ms=50_000)
    for op in ops:
        kind = op[0]
        if kind == "init":
            await c.initialize_state(init_req(key_n(op[1]), state_epoch=op[2], start_offset=op[3]))
        elif kind == "write":
            _, n, se, le, start, batches, dcc = op
            await c.write_state(write_req(key_n(n), batches, state_epoch=se, leader_epoch=le,
                                          start_offset=start, dcc=dcc))
        elif kind == "read":
            await c.read_state(read_req(key_n(op[1]), leader_epoch=op[2]))
        elif kind == "delete":
            await c.delete_state(delete_req(key_n(op[1])))
        elif kind == "cold":
            clock.now += op[1]
            await c.maybe_cold_snapshot()
        else:
            await c.prune()
    expected = all_states(c)
    summaries = [only(await c.read_state_summary(summary_req(key_n(n)))) for n in range(4)]
    close_topic(topic)
    reopened = open_state_topic(base, segment_bytes=500)
    try:
        c2 = await make_coordinator(reopened, snapshot_update_records_per_snapshot=2)
        assert replayable(all_states(c2)) == replayable(expected)
        assert [only(await c2.read_state_summary(summary_req(key_n(n)))) for n in range(4)] == summaries
    finally:
        close_topic(reopened)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25))
def test_replay_rebuilds_exactly_the_same_state(ops: list[tuple[Any, ...]]) -> None:
    with temp_dir() as base:
        asyncio.run(run_ops(base, ops))


# ---- the persister over the in-process client ---------------------------------------------------------


async def test_default_persister_round_trip(state_topic: Topic) -> None:
    c = await make_coordinator(state_topic)
    persister = DefaultStatePersister(InProcessShareCoordinatorClient(c))
    k = key(13)
    assert (await persister.read_state(k, 0)).error_code == ErrorCode.INVALID_REQUEST
    assert await persister.initialize_state(k, 1, -1) == ErrorCode.NONE
    r = await persister.read_state(k, 3)
    assert (r.error_code, r.state_epoch, r.start_offset, r.state_batches) == (ErrorCode.NONE, 1, -1, [])
    batches = [B(100, 109, ACKNOWLEDGED, 1), B(110, 119, AVAILABLE, 2)]
    assert await persister.write_state(WriteStateRequest(k, 1, 3, 100, 10, batches)) == ErrorCode.NONE
    r = await persister.read_state(k, 3)
    assert (r.start_offset, r.state_batches) == (100, batches)
    s = await persister.read_state_summary(k, 3)
    assert (s.error_code, s.state_epoch, s.leader_epoch, s.start_offset, s.delivery_complete_count) == (
        ErrorCode.NONE, 1, 3, 100, 10)
    assert await persister.write_state(WriteStateRequest(k, 1, 2, 100, 10, [])) == ErrorCode.FENCED_LEADER_EPOCH
    assert await persister.initialize_state(k, 0, 0) == ErrorCode.FENCED_STATE_EPOCH
    assert await persister.delete_state(k) == ErrorCode.NONE
    assert (await persister.read_state(k, 3)).error_code == ErrorCode.INVALID_REQUEST
    assert (await persister.read_state_summary(k, 3)).start_offset == -1


# ---- the broker-side APIs ---------------------------------------------------------------------------


class DenyClusterAction:
    """An authorizer that refuses inter-broker calls and allows everything else."""

    def authorize(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        return not (operation == Operation.CLUSTER_ACTION and resource_type == ResourceType.CLUSTER)


async def test_state_apis_authorize_forward_and_encode(tmp_path: Path, state_topic: Topic) -> None:
    broker = Broker(BrokerConfig.from_strings({"log.dirs": str(tmp_path / "broker")}))
    register(broker, ShareStateServices(share_coordinator=None))
    for api_key, (lo, hi) in {83: (0, 0), 84: (0, 0), 85: (0, 1), 86: (0, 0), 87: (0, 1)}.items():
        assert (broker.apis[api_key].min_version, broker.apis[api_key].max_version) == (lo, hi)
        assert broker.apis[api_key].is_async
    conn = KafkaConnection(broker, Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0))

    def ctx(api_key: int, version: int) -> RequestContext:
        return RequestContext(messages.RequestHeader(api_key, version, 1, "test"), conn)

    async def call(api_key: int, version: int, req: Any) -> Any:
        # through the real wire codec both ways, as a peer broker would see it
        _, decoded = messages.decode_request(messages.encode_request(req, api_key, version, 7, "peer"))
        resp = await broker.apis[api_key].handler(ctx(api_key, version), decoded)
        framed = messages.encode_response(resp, api_key, version, 7)
        return messages.decode_response(framed[4:], api_key, version)[1]

    k = key(14)
    p = only(await call(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, init_req(k)))
    assert p.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE  # no coordinator on this broker yet

    broker.share_coordinator = await make_coordinator(state_topic)
    register(broker, ShareStateServices(broker.share_coordinator))
    broker.authorizer = DenyClusterAction()
    resp = await call(ApiKey.WRITE_SHARE_GROUP_STATE, 1, write_req(k, []))
    assert only(resp).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert all_states(broker.share_coordinator) == {}

    broker.authorizer = AllowAllAuthorizer()
    assert only(await call(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, init_req(k, 1, 0))).error_code == ErrorCode.NONE
    assert only(await call(ApiKey.WRITE_SHARE_GROUP_STATE, 1,
                           write_req(k, [B(0, 2, ARCHIVED, 1)], state_epoch=1, start_offset=0, dcc=3))).error_code == ErrorCode.NONE
    p = only(await call(ApiKey.READ_SHARE_GROUP_STATE, 0, read_req(k)))
    assert batches_of(p) == [B(0, 2, ARCHIVED, 1)]
    s1 = only(await call(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, summary_req(k)))
    s0 = only(await call(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0, summary_req(k)))
    assert (s1.delivery_complete_count, s0.delivery_complete_count) == (3, -1)  # v0 does not carry it
    assert only(await call(ApiKey.DELETE_SHARE_GROUP_STATE, 0, delete_req(k))).error_code == ErrorCode.NONE
