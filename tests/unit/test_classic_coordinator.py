"""ClassicGroupCoordinator over a real `__consumer_offsets` (InternalTopicLog on PartitionLogs in tmp_path)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shoal.coordinator.classic_coordinator import (
    ClassicGroupConfig,
    ClassicGroupCoordinator,
    JoinRequest,
    OffsetToCommit,
)
from shoal.coordinator.classic_group import ClassicGroupState, parse_subscription_topics
from shoal.coordinator.group_coordinator import GroupCoordinator
from shoal.protocol import coordinator_records as cr
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

from .cancellation import cancel_once_appended
from .test_share_group_coordinator import Clock, RecordingPersister, Topics, close_log, open_log

GROUP = "cg"
SUBSCRIPTION = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x06orders" + b"\xff\xff\xff\xff"


class Env:
    def __init__(self, path: Path, **config: Any) -> None:
        self.log = open_log(path)
        self.clock = Clock()
        self.config = ClassicGroupConfig(initial_rebalance_delay_ms=0, **config)
        self.coord = self.new()

    def new(self) -> ClassicGroupCoordinator:
        """The classic groups of a new group coordinator over the log (`gc`, whose offset operations the
        tests use too)."""
        self.gc = GroupCoordinator(self.log, Topics(), RecordingPersister(), classic_config=self.config,
                                   clock=self.clock, wall_ms=lambda: 1_700_000_000_000)
        return self.gc.classic

    def join_req(self, member_id: str = "", instance: str | None = None, protocol: str = "range",
                 metadata: bytes = SUBSCRIPTION, version: int = 9) -> JoinRequest:
        return JoinRequest(group_id=GROUP, member_id=member_id, group_instance_id=instance, session_timeout_ms=10000,
                           rebalance_timeout_ms=10000, protocol_type="consumer", protocols=[(protocol, metadata)],
                           client_id="cli", client_host="/127.0.0.1", version=version)

    async def join(self, **kw: Any) -> Any:
        return await self.coord.join_group(self.join_req(**kw))

    async def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None) -> Any:
        entry = messages.SyncGroupRequest.SyncGroupRequestAssignment
        req = messages.SyncGroupRequest(group_id=GROUP, generation_id=generation, member_id=member_id,
                                        group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                        assignments=[entry(member_id=m, assignment=a)
                                                     for m, a in (assignments or {}).items()])
        return await self.coord.sync_group(req, 5)


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    await e.coord.load()
    yield e
    await e.coord.stop()
    close_log(e.log)


async def reached(env: Env, member_id: str, phase: str = "join") -> None:
    """Let a request started in the background run its operation: its member then waits in `phase`."""
    for _ in range(100):
        member = env.coord.groups[GROUP].members.get(member_id) if GROUP in env.coord.groups else None
        if member is not None and getattr(member, f"awaiting_{phase}"):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{member_id} never reached {phase}")


async def one_member(env: Env, instance: str | None = None) -> tuple[str, int]:
    first = await env.join(instance=instance)
    if first.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        first = await env.join(member_id=first.member_id)
    assert first.error_code == ErrorCode.NONE
    synced = await env.sync(first.member_id, first.generation_id, {first.member_id: b"P0"})
    assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, b"P0")
    return first.member_id, first.generation_id


async def test_two_members_rebalance_and_the_leader_assigns(env: Env) -> None:
    a, gen1 = await one_member(env)
    assert env.coord.groups[GROUP].state == ClassicGroupState.STABLE
    b_id = (await env.join()).member_id  # MEMBER_ID_REQUIRED
    b_join = asyncio.ensure_future(env.join(member_id=b_id))
    await reached(env, b_id)
    assert await env.coord.heartbeat(GROUP, a, gen1, None) == ErrorCode.REBALANCE_IN_PROGRESS
    a_join = await env.join(member_id=a)  # a rejoins: every member is in, the join phase completes
    b_resp = await b_join
    assert a_join.generation_id == b_resp.generation_id == gen1 + 1
    assert a_join.leader == a and {m.member_id for m in a_join.members} == {a, b_id} and b_resp.members == []
    b_sync = asyncio.ensure_future(env.sync(b_id, b_resp.generation_id))
    await reached(env, b_id, "sync")
    assert not b_sync.done()  # followers wait for the leader's assignment
    a_sync = await env.sync(a, a_join.generation_id, {a: b"A", b_id: b"B"})
    assert (a_sync.assignment, (await b_sync).assignment) == (b"A", b"B")


async def test_state_and_offsets_replay_after_restart(env: Env) -> None:
    member, gen = await one_member(env)
    codes = await env.gc.commit_offsets(GROUP, member, None, gen, [OffsetToCommit("orders", 0, 42, 3, "meta")], 9)
    assert codes == (ErrorCode.NONE, [ErrorCode.NONE])
    restarted = env.new()
    await restarted.load()
    group = restarted.groups[GROUP]
    assert (group.state, group.generation_id, group.leader_id, list(group.members)) == (
        ClassicGroupState.STABLE, gen, member, [member])
    assert group.members[member].assignment == b"P0"
    assert parse_subscription_topics(group.members[member].metadata("range")) == {"orders"}
    _, rows = env.gc.fetch_offsets(GROUP, None, -1, [("orders", [0, 1])])
    assert [(t, p, c and (c.offset, c.leader_epoch, c.metadata)) for t, p, c in rows] == [
        ("orders", 0, (42, 3, "meta")), ("orders", 1, None)]
    # The restored member keeps its generation: a heartbeat needs no rejoin.
    assert await restarted.heartbeat(GROUP, member, gen, None) == ErrorCode.NONE
    await restarted.stop()


async def test_session_expiry_empties_the_group_and_persists_it(env: Env) -> None:
    member, gen = await one_member(env)
    env.clock.now += 11
    # As the session timer runs it: an operation on the group whose records the runtime writes.
    await env.coord._write_steps(GROUP, lambda: env.coord._on_heartbeat_deadline(GROUP, member))
    group = env.coord.groups[GROUP]
    assert (group.state, group.generation_id, group.members) == (ClassicGroupState.EMPTY, gen + 1, {})
    metadata = [r for p in range(3) for _, r in env.log.replay(p) if r.record_type == cr.GROUP_METADATA]
    assert metadata[-1].value.generation == gen + 1 and metadata[-1].value.members == []


async def test_static_member_replacement_keeps_generation(env: Env) -> None:
    old, gen = await one_member(env, instance="i1")
    again = await env.join(instance="i1")
    assert again.error_code == ErrorCode.NONE and again.generation_id == gen and again.member_id != old
    assert again.skip_assignment and again.leader == again.member_id
    # The old incarnation is fenced.
    assert await env.coord.heartbeat(GROUP, old, gen, "i1") == ErrorCode.FENCED_INSTANCE_ID
    assert await env.coord.heartbeat(GROUP, again.member_id, gen, "i1") == ErrorCode.NONE


async def test_commit_validation_and_offset_delete(env: Env) -> None:
    # A group that does not exist: generation -1 creates a "simple" group, others are refused.
    simple = await env.gc.commit_offsets("simple", "", None, -1, [OffsetToCommit("t", 0, 1, -1, None)], 8)
    assert simple == (ErrorCode.NONE, [ErrorCode.NONE])
    assert (await env.gc.commit_offsets("nope", "m", None, 1, [], 8))[0] == ErrorCode.ILLEGAL_GENERATION
    assert (await env.gc.commit_offsets("nope", "m", None, 1, [], 9))[0] == ErrorCode.GROUP_ID_NOT_FOUND
    member, gen = await one_member(env)
    big = OffsetToCommit("orders", 1, 5, -1, "x" * 5000)
    assert await env.gc.commit_offsets(GROUP, member, None, gen, [big], 9) == (
        ErrorCode.NONE, [ErrorCode.OFFSET_METADATA_TOO_LARGE])
    assert (await env.gc.commit_offsets(GROUP, "", None, -1, [], 9))[0] == ErrorCode.UNKNOWN_MEMBER_ID
    await env.gc.commit_offsets(GROUP, member, None, gen, [OffsetToCommit("other", 0, 7, -1, "")], 9)
    # The members subscribe to "orders" (their ConsumerProtocol metadata says so), not to "other".
    assert await env.gc.delete_offsets(GROUP, [("orders", 0), ("other", 0)]) == (
        ErrorCode.NONE, [ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ErrorCode.NONE])
    assert env.gc.fetch_offsets(GROUP, None, -1, [("other", [0])])[1][0][2] is None
    assert await env.gc.delete_group(GROUP) == ErrorCode.NON_EMPTY_GROUP


async def test_group_max_size_refuses_another_member(tmp_path: Path) -> None:
    env = Env(tmp_path, max_size=1)
    await env.coord.load()
    try:
        await one_member(env)
        refused = await env.join()
        assert refused.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert len(env.coord.groups[GROUP].members) == 1
    finally:
        await env.coord.stop()
        close_log(env.log)


async def test_initial_rebalance_delay_gathers_members_into_one_generation(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.config.initial_rebalance_delay_ms = 20
    await env.coord.load()
    try:
        joins = [asyncio.ensure_future(env.join(version=3)) for _ in range(3)]
        answers = await asyncio.gather(*joins)
        assert {a.generation_id for a in answers} == {1} and env.coord.rebalances == 1
        leaders = [a for a in answers if a.members]
        assert len(leaders) == 1 and len(leaders[0].members) == 3
    finally:
        await env.coord.stop()
        close_log(env.log)


async def test_batch_leave_by_member_and_instance_id(env: Env) -> None:
    static, gen = await one_member(env, instance="i1")
    code, codes = await env.coord.leave_group(GROUP, [("", "i1"), ("ghost", None), ("wrong", "i1")])
    # Each entry is checked against the group as it was: the third names i1 with another member id.
    assert (code, codes) == (ErrorCode.NONE, [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID])
    group = env.coord.groups[GROUP]
    assert (group.state, group.members, group.generation_id) == (ClassicGroupState.EMPTY, {}, gen + 1)
    fenced = await one_member(env, instance="i2")
    assert await env.coord.leave_group(GROUP, [("not-" + fenced[0], "i2")]) == (
        ErrorCode.NONE, [ErrorCode.FENCED_INSTANCE_ID])


async def test_members_that_do_not_sync_in_time_are_removed(env: Env) -> None:
    a, gen = await one_member(env)
    b_id = (await env.join()).member_id
    b_join = asyncio.ensure_future(env.join(member_id=b_id))
    await reached(env, b_id)
    a_join = await env.join(member_id=a)
    await b_join
    # Only the leader syncs; the follower never does.
    a_sync = asyncio.ensure_future(env.sync(a, a_join.generation_id, {a: b"A", b_id: b"B"}))
    assert (await a_sync).assignment == b"A"
    group = env.coord.groups[GROUP]
    assert group.state == ClassicGroupState.STABLE
    # A generation whose leader never syncs: its members are dropped when the sync deadline passes.
    c_id = (await env.join()).member_id
    c_join = asyncio.ensure_future(env.join(member_id=c_id))
    await reached(env, c_id)
    joins = await asyncio.gather(env.join(member_id=a), env.join(member_id=b_id), c_join)
    generation = joins[0].generation_id
    await env.coord._write_steps(GROUP, lambda: env.coord._on_sync_deadline(GROUP, generation))
    assert group.members == {} and group.state == ClassicGroupState.EMPTY and group.generation_id == generation + 1
    assert gen < generation


async def test_unload_answers_requests_waiting_for_a_rebalance(env: Env) -> None:
    a, _gen = await one_member(env)
    b_id = (await env.join()).member_id
    waiting = asyncio.ensure_future(env.join(member_id=b_id))
    await reached(env, b_id)
    assert not waiting.done()  # a has not rejoined yet
    env.coord.unload()
    assert (await waiting).error_code == ErrorCode.NOT_COORDINATOR
    assert a in env.coord.groups[GROUP].members


async def test_ids_too_long_for_a_record_key_are_refused(env: Env) -> None:
    huge = "g" * 40_000
    req = env.join_req()
    req.group_id = huge
    assert (await env.coord.join_group(req)).error_code == ErrorCode.INVALID_GROUP_ID
    assert (await env.gc.commit_offsets(huge, "", None, -1, [OffsetToCommit("t", 0, 1, -1, "")], 9))[0] == (
        ErrorCode.INVALID_GROUP_ID)
    req = env.join_req(instance="i" * 40_000)
    assert (await env.coord.join_group(req)).error_code == ErrorCode.INVALID_REQUEST
    assert env.coord.groups == {}


def _persisted_view(coord: ClassicGroupCoordinator) -> dict[str, Any]:
    """What of each group the log holds: generation, leader, members with assignments, offsets."""
    def offsets(group_id: str) -> dict[tuple[str, int], Any]:
        return dict(coord.runtime.shard(coord.partition_for(group_id)).offsets.offsets(group_id))

    return {gid: (g.generation_id, g.leader_id, {m: x.assignment for m, x in g.members.items()}, offsets(gid))
            for gid, g in coord.groups.items()}


async def test_writes_whose_caller_is_cancelled_mid_fsync_still_reach_memory(env: Env) -> None:
    plog = env.log.topic.partitions[env.coord.partition_for(GROUP)]
    first = await env.join()
    joined = await env.join(member_id=first.member_id)
    # The leader's SyncGroup persists the assignment; its client goes away while that is being fsynced.
    await cancel_once_appended(plog, env.sync(joined.member_id, joined.generation_id, {joined.member_id: b"P0"}))
    commit = [OffsetToCommit("orders", 0, 42, 3, "m")]
    await cancel_once_appended(plog, env.gc.commit_offsets(GROUP, joined.member_id, None, joined.generation_id,
                                                           commit, 9))
    await env.coord.runtime.drain()
    restarted = env.new()
    await restarted.load()
    assert _persisted_view(env.coord) == _persisted_view(restarted)
    group = env.coord.groups[GROUP]
    assert group.state == ClassicGroupState.STABLE and group.members[joined.member_id].assignment == b"P0"
    assert _persisted_view(env.coord)[GROUP][3][("orders", 0)].offset == 42
    await restarted.stop()
