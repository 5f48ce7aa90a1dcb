"""The group coordinator: one shard for every group type over a real `__consumer_offsets` (InternalTopicLog
on PartitionLogs in tmp_path), its OffsetMetadataManager (a property test against a model of Kafka's
rules), transactional offsets and their markers, offset expiry, deleted topics, and one group per id."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.classic_coordinator import ClassicGroupConfig, JoinRequest, OffsetToCommit
from shoal.coordinator.classic_group import ClassicGroup
from shoal.coordinator.consumer_group import ConsumerGroup
from shoal.coordinator.group_coordinator import GroupCoordinator, OffsetConfig
from shoal.coordinator.group_coordinator_shard import GroupCoordinatorShard
from shoal.coordinator.offset_metadata_manager import CommittedOffset, offset_commit_record, offset_tombstone
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

from .test_share_group_coordinator import Clock, RecordingPersister, close_log, open_log

GROUP = "gc-group"
T_ORDERS = b"\x10" * 16
RETENTION_MS = 60_000
NOW_MS = 1_700_000_000_000


class Topics:
    def __init__(self) -> None:
        self.by_name: dict[str, tuple[bytes, int]] = {"orders": (T_ORDERS, 2)}

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        return self.by_name.get(name)

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        return next(((n, c) for n, (t, c) in self.by_name.items() if t == topic_id), None)

    def topic_names(self) -> list[str]:
        return list(self.by_name)


# ---- OffsetMetadataManager against a model ---------------------------------------------------------

# An operation on one partition's offsets of one group: a regular commit, a transactional commit of a
# producer, a producer's COMMIT or ABORT marker, or a tombstone.
Op = tuple[str, int]
ops_strategy = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.just(-1)),
    st.tuples(st.just("txn"), st.integers(1, 3)),
    st.tuples(st.just("marker-commit"), st.integers(1, 3)),
    st.tuples(st.just("marker-abort"), st.integers(1, 3)),
    st.tuples(st.just("tombstone"), st.just(-1)),
), max_size=30)


def _model(ops: list[Op]) -> int | None:
    """Kafka's rule, stated without its bookkeeping: the committed offset is the value of the latest record
    (by log offset) after the last tombstone that is either a regular commit or a transactional one whose
    producer's next marker is a COMMIT already read."""
    best: int | None = None
    for i, (kind, pid) in enumerate(ops):
        if kind == "tombstone":
            best = None
        elif kind == "commit":
            best = i
        elif kind.startswith("marker"):
            continue
        elif kind == "txn":
            marker = next((k for k, p in ops[i + 1:] if p == pid and k.startswith("marker")), None)
            later_tombstone = any(k == "tombstone" for k, _ in ops[i + 1:])
            if marker == "marker-commit" and not later_tombstone and (best is None or i > best):
                best = i
    if best is not None and any(k == "tombstone" for k, _ in ops[best + 1:]):
        return None
    return best


@settings(max_examples=300, deadline=None)
@given(ops_strategy)
def test_committed_offset_is_the_latest_counted_record(ops: list[Op]) -> None:
    shard = GroupCoordinatorShard()
    for offset, (kind, pid) in enumerate(ops):
        if kind == "tombstone":
            shard.replay(offset, offset_tombstone(GROUP, "t", 0))
        elif kind in ("commit", "txn"):
            # The committed value is the record's own log offset, so the model can name it.
            shard.replay(offset, offset_commit_record(GROUP, "t", 0, CommittedOffset(offset, -1, "", 0)), pid)
        else:
            shard.replay_end_transaction(pid, kind == "marker-commit")
    committed = shard.offsets.offsets(GROUP).get(("t", 0))
    assert (None if committed is None else committed.offset) == _model(ops)
    open_pids = {pid for i, (k, pid) in enumerate(ops) if k == "txn"
                 and not any(p == pid and kk.startswith("marker") for kk, p in ops[i + 1:])
                 and not any(kk == "tombstone" for kk, _ in ops[i + 1:])}
    assert shard.offsets.has_pending(GROUP, "t", 0) == bool(open_pids)


# ---- the coordinator over a real log ---------------------------------------------------------------


class Env:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = open_log(path)
        self.clock = Clock()
        self.now_ms = NOW_MS
        self.topics = Topics()
        self.gc = self.new()

    def new(self) -> GroupCoordinator:
        return GroupCoordinator(self.log, self.topics, RecordingPersister(),
                                classic_config=ClassicGroupConfig(initial_rebalance_delay_ms=0),
                                offset_config=OffsetConfig(retention_ms=RETENTION_MS),
                                clock=self.clock, wall_ms=lambda: self.now_ms)

    async def restart(self) -> None:
        await self.gc.stop()
        close_log(self.log)
        self.log = open_log(self.path)
        self.gc = self.new()
        await self.gc.load()

    def marker(self, group_id: str, producer_id: int, commit: bool) -> None:
        """What the transaction coordinator's marker writer does on the group's partition."""
        partition = self.gc.partition_for(group_id)
        plog = self.log.topic.partitions[partition]
        plog.append_marker(producer_id=producer_id, producer_epoch=0, commit=commit, coordinator_epoch=0,
                           timestamp_ms=0)
        self.gc.on_transaction_completed(partition, producer_id, commit)

    def committed(self, group_id: str, topic: str = "orders", partition: int = 0) -> int | None:
        code, rows = self.gc.fetch_offsets(group_id, None, -1, [(topic, [partition])])
        assert code == ErrorCode.NONE
        row = rows[0][2]
        return None if row is None else row.offset


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    await e.gc.load()
    yield e
    await e.gc.stop()
    close_log(e.log)


def _offsets(*items: tuple[str, int, int]) -> list[OffsetToCommit]:
    return [OffsetToCommit(t, p, o, -1, "") for t, p, o in items]


async def test_transactional_offsets_count_at_their_marker_and_after_restart(env: Env) -> None:
    gc = env.gc
    assert await gc.commit_transactional_offsets(GROUP, 7, 0, "", None, -1, _offsets(("orders", 0, 42))) == (
        ErrorCode.NONE, [ErrorCode.NONE])
    await gc.commit_transactional_offsets(GROUP, 8, 0, "", None, -1, _offsets(("orders", 1, 5)))
    assert gc.has_pending_offset(GROUP, "orders", 0) and gc.has_pending_offset(GROUP, "orders", 1)
    assert env.committed(GROUP) is None  # nothing counts before its marker
    env.marker(GROUP, 7, commit=True)
    assert env.committed(GROUP) == 42 and not gc.has_pending_offset(GROUP, "orders", 0)
    # Producer 8 is still open: a restart finds its offset pending, the other committed; an abort drops it.
    await env.restart()
    assert env.committed(GROUP) == 42 and env.gc.has_pending_offset(GROUP, "orders", 1)
    env.marker(GROUP, 8, commit=False)
    assert env.committed(GROUP, partition=1) is None and not env.gc.has_pending_offset(GROUP, "orders", 1)
    await env.restart()
    assert (env.committed(GROUP), env.committed(GROUP, partition=1)) == (42, None)


async def test_txn_offset_commit_is_fenced_by_the_classic_generation(env: Env) -> None:
    join = JoinRequest(group_id=GROUP, member_id="", group_instance_id="i1", session_timeout_ms=10_000,
                       rebalance_timeout_ms=10_000, protocol_type="consumer", protocols=[("range", b"")],
                       client_id="c", client_host="/h", version=9)
    joined = await env.gc.classic.join_group(join)
    assert joined.error_code == ErrorCode.NONE
    member, generation = joined.member_id, joined.generation_id
    offsets = _offsets(("orders", 0, 1))

    async def txn(member_id: str, instance: str | None, gen: int) -> int:
        return (await env.gc.commit_transactional_offsets(GROUP, 3, 0, member_id, instance, gen, offsets))[0]

    assert await txn(member, "i1", generation - 1) == ErrorCode.ILLEGAL_GENERATION
    assert await txn("ghost", None, generation) == ErrorCode.UNKNOWN_MEMBER_ID
    assert await txn("ghost", "i1", generation) == ErrorCode.FENCED_INSTANCE_ID
    assert await txn(member, "i1", generation) == ErrorCode.NONE
    # No group at all: only a commit without a generation is taken (a simple group).
    assert (await env.gc.commit_transactional_offsets("nogroup", 3, 0, "m", None, 1, offsets))[0] == \
        ErrorCode.ILLEGAL_GENERATION


async def test_join_group_and_consumer_heartbeat_at_once_make_one_group(env: Env) -> None:
    join = JoinRequest(group_id=GROUP, member_id="", group_instance_id=None, session_timeout_ms=10_000,
                       rebalance_timeout_ms=10_000, protocol_type="consumer", protocols=[("range", b"")],
                       client_id="c", client_host="/h", version=9)
    heartbeat = messages.ConsumerGroupHeartbeatRequest(
        group_id=GROUP, member_id="m", member_epoch=0, rebalance_timeout_ms=10_000, subscribed_topic_names=["orders"],
        topic_partitions=[])
    await asyncio.gather(env.gc.classic.join_group(join), env.gc.consumer.heartbeat(heartbeat, 1, "c", "/h"))
    shard = env.gc.runtime.shard(env.gc.partition_for(GROUP))
    assert len([gid for gid in shard.groups if gid == GROUP]) == 1
    assert (GROUP in env.gc.classic.groups) + (GROUP in env.gc.consumer.groups) == 1


async def test_offsets_without_a_group_become_the_consumer_groups(env: Env) -> None:
    assert await env.gc.commit_offsets(GROUP, "", None, -1, _offsets(("orders", 0, 9)), 9) == (
        ErrorCode.NONE, [ErrorCode.NONE])
    assert isinstance(env.gc.runtime.shard(env.gc.partition_for(GROUP)).groups[GROUP], ClassicGroup)
    joined = await env.gc.consumer.heartbeat(messages.ConsumerGroupHeartbeatRequest(
        group_id=GROUP, member_id="m", member_epoch=0, rebalance_timeout_ms=10_000, subscribed_topic_names=["orders"],
        topic_partitions=[]), 1, "c", "/h")
    assert joined.error_code == ErrorCode.NONE
    assert isinstance(env.gc.runtime.shard(env.gc.partition_for(GROUP)).groups[GROUP], ConsumerGroup)
    assert env.committed(GROUP) == 9
    await env.restart()
    assert GROUP in env.gc.consumer.groups and env.committed(GROUP) == 9


async def test_offsets_expire_after_the_retention_except_subscribed_topics(env: Env) -> None:
    await env.gc.commit_offsets("simple", "", None, -1, _offsets(("orders", 0, 1)), 9)
    await env.gc.consumer.heartbeat(messages.ConsumerGroupHeartbeatRequest(
        group_id=GROUP, member_id="m", member_epoch=0, rebalance_timeout_ms=10_000, subscribed_topic_names=["orders"],
        topic_partitions=[]), 1, "c", "/h")
    described = env.gc.consumer.describe(GROUP)
    epoch = described.members[0].member_epoch
    assert (await env.gc.commit_offsets(GROUP, "m", None, epoch, _offsets(("orders", 0, 3), ("gone", 0, 4)), 9))[0] \
        == ErrorCode.NONE
    # A consumer group whose only member left, without offsets: the next pass deletes it, as Kafka does.
    left = messages.ConsumerGroupHeartbeatRequest(group_id="left", member_id="x", member_epoch=0,
                                                  rebalance_timeout_ms=10_000, subscribed_topic_names=["orders"],
                                                  topic_partitions=[])
    await env.gc.consumer.heartbeat(left, 1, "c", "/h")
    left.member_epoch = -1
    assert (await env.gc.consumer.heartbeat(left, 1, "c", "/h")).error_code == ErrorCode.NONE
    partitions = range(env.gc.runtime.num_partitions)
    env.now_ms = NOW_MS + RETENTION_MS - 1
    assert sum([await env.gc.expire_offsets(p) for p in partitions]) == 0
    assert "left" not in env.gc.consumer.groups and GROUP in env.gc.consumer.groups
    env.now_ms = NOW_MS + RETENTION_MS
    assert sum([await env.gc.expire_offsets(p) for p in partitions]) == 2
    assert env.committed("simple") is None and "simple" not in env.gc.classic.groups
    # The consumer group's members read "orders": that offset stays, "gone" went.
    assert (env.committed(GROUP), env.committed(GROUP, "gone")) == (3, None)
    await env.restart()
    assert (env.committed("simple"), env.committed(GROUP), env.committed(GROUP, "gone")) == (None, 3, None)


async def test_offsets_of_a_deleted_topic_go_committed_and_pending(env: Env) -> None:
    await env.gc.commit_offsets(GROUP, "", None, -1, _offsets(("orders", 0, 100), ("kept", 0, 1)), 9)
    await env.gc.commit_transactional_offsets(GROUP, 5, 0, "", None, -1, _offsets(("orders", 1, 7)))
    await env.gc.on_topics_deleted(["orders"])
    assert (env.committed(GROUP), env.committed(GROUP, "kept")) == (None, 1)
    assert not env.gc.has_pending_offset(GROUP, "orders", 1)
    env.marker(GROUP, 5, commit=True)
    assert env.committed(GROUP, partition=1) is None
    await env.restart()
    assert (env.committed(GROUP), env.committed(GROUP, partition=1), env.committed(GROUP, "kept")) == (None, None, 1)
