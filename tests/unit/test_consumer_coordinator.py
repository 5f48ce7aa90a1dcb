"""KIP-848 consumer groups: the reconciliation state machine (pure) and ConsumerGroupCoordinator over a real
`__consumer_offsets` (InternalTopicLog on PartitionLogs in tmp_path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.classic_coordinator import OffsetToCommit
from shoal.coordinator.consumer_assignors import RangeAssignor, UniformAssignor
from shoal.coordinator.consumer_coordinator import (
    ConsumerGroupConfig,
    ConsumerGroupCoordinator,
    apply_heartbeat_fields,
)
from shoal.coordinator.consumer_group import ConsumerMember, MemberState, reconcile
from shoal.coordinator.group_coordinator import GroupCoordinator
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

from .test_share_group_coordinator import Clock, RecordingPersister, close_log, open_log

GROUP = "kg"
T1, T2 = b"\x31" * 16, b"\x32" * 16
Request = messages.ConsumerGroupHeartbeatRequest
_TP = Request.TopicPartitions  # type: ignore[attr-defined]


class Topics:
    def __init__(self) -> None:
        self.by_name: dict[str, tuple[bytes, int]] = {"orders": (T1, 4)}

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        return self.by_name.get(name)

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        return next(((n, c) for n, (t, c) in self.by_name.items() if t == topic_id), None)

    def topic_names(self) -> list[str]:
        return list(self.by_name)


# ---- the state machine -----------------------------------------------------------------------------

def fs(*ps: int) -> frozenset[int]:
    return frozenset(ps)


def test_revocation_comes_first_and_keeps_the_epoch() -> None:
    m = ConsumerMember("a", member_epoch=3, previous_member_epoch=2, assigned={T1: fs(0, 1, 2, 3)})
    r = reconcile(m, {T1: fs(0, 1)}, 4, None, set())
    assert (r.state, r.member_epoch, r.assigned, r.pending_revocation) == (
        MemberState.UNREVOKED_PARTITIONS, 3, {T1: fs(0, 1)}, {T1: fs(2, 3)})
    m.state, m.assigned, m.pending_revocation = r.state, r.assigned, r.pending_revocation
    # Still owning a revoked partition: nothing moves.
    assert reconcile(m, {T1: fs(0, 1)}, 4, {T1: fs(0, 1, 2)}, set()).state == MemberState.UNREVOKED_PARTITIONS
    # Revoked: the member moves to the target epoch.
    done = reconcile(m, {T1: fs(0, 1)}, 4, {T1: fs(0, 1)}, set())
    assert (done.state, done.member_epoch, done.previous_member_epoch, done.assigned) == (
        MemberState.STABLE, 4, 3, {T1: fs(0, 1)})


def test_partitions_held_by_others_wait_until_released() -> None:
    m = ConsumerMember("b", member_epoch=3, assigned={})
    r = reconcile(m, {T1: fs(2, 3)}, 4, None, {(T1, 3)})
    assert (r.state, r.member_epoch, r.assigned) == (MemberState.UNRELEASED_PARTITIONS, 4, {T1: fs(2)})
    m.state, m.member_epoch, m.assigned = r.state, r.member_epoch, r.assigned
    r = reconcile(m, {T1: fs(2, 3)}, 4, None, set())
    assert (r.state, r.assigned) == (MemberState.STABLE, {T1: fs(2, 3)})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sets(st.integers(0, 7)), st.booleans()), min_size=1, max_size=8))
def test_two_members_never_own_one_partition(steps: list[tuple[set[int], bool]]) -> None:
    """Random targets split 8 partitions between two members who heartbeat (and revoke) in turn: at no
    point do both hold one partition, and once targets stop changing both reach them."""
    members = {"a": ConsumerMember("a"), "b": ConsumerMember("b")}
    epoch = 0

    def held_by_others(mid: str) -> set[tuple[bytes, int]]:
        return {(T1, p) for o, m in members.items() if o != mid
                for a in (m.assigned, m.pending_revocation) for p in a.get(T1, ())}

    def beat(mid: str, target: dict[str, frozenset[int]]) -> None:
        m = members[mid]
        owned = {T1: m.assigned.get(T1, fs())}  # the client revoked what it was told to
        r = reconcile(m, {T1: target[mid]} if target[mid] else {}, epoch, owned, held_by_others(mid))
        m.state, m.member_epoch, m.previous_member_epoch = r.state, r.member_epoch, r.previous_member_epoch
        m.assigned, m.pending_revocation = r.assigned, r.pending_revocation
        mine = {p for p in m.assigned.get(T1, ())}
        assert not mine & {p for _, p in held_by_others(mid)}

    for a_part, a_first in steps:
        epoch += 1
        target = {"a": frozenset(a_part), "b": frozenset(set(range(8)) - a_part)}
        for mid in ("ab" if a_first else "ba"):
            beat(mid, target)
    for _ in range(3):
        beat("a", target)
        beat("b", target)
    assert all(m.state == MemberState.STABLE and m.member_epoch == epoch for m in members.values())
    assert members["a"].assigned.get(T1, fs()) == target["a"] and members["b"].assigned.get(T1, fs()) == target["b"]


# Every field a heartbeat may leave out (null, or -1 for RebalanceTimeoutMs) and what the member holds then.
_NULLABLE = {
    "instance_id": ("instance_id", None, "inst-1"),
    "rack_id": ("rack_id", None, "rack-a"),
    "rebalance_timeout_ms": ("rebalance_timeout_ms", -1, 45000),
    "subscribed_topic_names": ("subscribed_topic_names", None, ["orders", "audit"]),
    "subscribed_topic_regex": ("subscribed_topic_regex", None, "ord.*"),
    "server_assignor": ("server_assignor", None, "range"),
}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_NULLABLE)), st.booleans()))
def test_a_field_left_out_of_a_heartbeat_keeps_the_members_value(sent: dict[str, bool]) -> None:
    """Kafka's consumerGroupHeartbeat: clients send a field only when it changed (librdkafka sends
    InstanceId once), so null means unchanged and only a field that is sent replaces the member's."""
    before = ConsumerMember("m", instance_id="inst-0", rack_id="rack-0", rebalance_timeout_ms=30000,
                            subscribed_topic_names=("old",), subscribed_topic_regex="old.*",
                            server_assignor="uniform")
    member = ConsumerMember(**{f: getattr(before, f) for f in ConsumerMember.__dataclass_fields__})
    fields = {name: (value if sent.get(name) else absent) for name, (_, absent, value) in _NULLABLE.items()}
    apply_heartbeat_fields(member, Request(group_id=GROUP, member_id="m", member_epoch=3, **fields), 1)
    for name, (attr, _, value) in _NULLABLE.items():
        expected = (tuple(sorted(set(value))) if name == "subscribed_topic_names" else value) if sent.get(name) \
            else getattr(before, attr)
        assert getattr(member, attr) == expected, name


def test_an_empty_regex_clears_it_and_version_0_has_none() -> None:
    member = ConsumerMember("m", subscribed_topic_regex="old.*")
    apply_heartbeat_fields(member, Request(group_id=GROUP, member_id="m", member_epoch=3,
                                           subscribed_topic_regex="new.*"), 0)
    assert member.subscribed_topic_regex == "old.*"
    apply_heartbeat_fields(member, Request(group_id=GROUP, member_id="m", member_epoch=3,
                                           subscribed_topic_regex=""), 1)
    assert member.subscribed_topic_regex is None


# ---- the coordinator over a real log ------------------------------------------------------------------

class Env:
    def __init__(self, path: Path) -> None:
        self.log = open_log(path)
        self.clock = Clock()
        self.topics = Topics()
        self.coord = self.new()

    def new(self) -> ConsumerGroupCoordinator:
        """The consumer groups of a new group coordinator over the log (`gc`, whose offset operations the
        tests use too)."""
        self.gc = GroupCoordinator(self.log, self.topics, RecordingPersister(),
                                   consumer_config=ConsumerGroupConfig(session_timeout_ms=10000),
                                   assignors=[UniformAssignor(), RangeAssignor()], clock=self.clock)
        return self.gc.consumer

    async def beat(self, member_id: str, epoch: int, owned: dict[bytes, set[int]] | None = None,
                   topics: list[str] | None = None, regex: str | None = None, version: int = 1) -> Any:
        req = Request(group_id=GROUP, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=30000,
                      subscribed_topic_names=topics if topics is not None or epoch else ["orders"],
                      subscribed_topic_regex=regex,
                      topic_partitions=None if owned is None else [_TP(topic_id=t, partitions=sorted(ps))
                                                                   for t, ps in owned.items()])
        return await self.coord.heartbeat(req, version, "cli", "/127.0.0.1")


def parts(resp: Any) -> set[int]:
    return {p for tp in resp.assignment.topic_partitions for p in tp.partitions}


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    await e.gc.load()
    yield e
    await e.gc.stop()
    close_log(e.log)


async def test_join_split_revoke_and_replay(env: Env) -> None:
    a = await env.beat("a", 0, owned={})
    assert (a.error_code, a.member_epoch, parts(a)) == (ErrorCode.NONE, 1, {0, 1, 2, 3})
    b = await env.beat("b", 0, owned={})
    assert (b.member_epoch, parts(b)) == (2, set())  # a still holds everything
    a2 = await env.beat("a", 1, owned={T1: {0, 1, 2, 3}})
    assert (a2.member_epoch, len(parts(a2))) == (1, 2)  # revoke first, epoch kept
    kept = parts(a2)
    a3 = await env.beat("a", 1, owned={T1: kept})
    assert (a3.member_epoch, parts(a3)) == (2, kept)
    b2 = await env.beat("b", 2, owned={})
    assert parts(b2) == {0, 1, 2, 3} - kept
    assert env.coord.describe(GROUP).group_state == "Stable"
    # Offsets by member epoch.
    five = [OffsetToCommit("orders", 0, 5, 0, None)]
    code, _ = await env.gc.commit_offsets(GROUP, "a", None, 1, five, 9)
    assert code == ErrorCode.STALE_MEMBER_EPOCH
    assert (await env.gc.commit_offsets(GROUP, "a", None, 1, five, 8))[0] == ErrorCode.UNSUPPORTED_VERSION
    code, per = await env.gc.commit_offsets(GROUP, "a", None, 2, five, 9)
    assert (code, per) == (ErrorCode.NONE, [ErrorCode.NONE])
    assert (await env.gc.commit_offsets(GROUP, "zz", None, 2, five, 9))[0] == ErrorCode.UNKNOWN_MEMBER_ID
    # KIP-447: a transactional commit with a stale member epoch is ILLEGAL_GENERATION.
    assert (await env.gc.commit_transactional_offsets(GROUP, 9, 0, "a", None, 1, five))[0] == \
        ErrorCode.ILLEGAL_GENERATION
    # OffsetDelete refuses topics the members subscribe to.
    assert await env.gc.delete_offsets(GROUP, [("orders", 0), ("elsewhere", 0)]) == (
        ErrorCode.NONE, [ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ErrorCode.NONE])
    # Everything comes back from the log.
    before = env.coord.describe(GROUP)
    again = env.new()
    await env.gc.load()
    after = again.describe(GROUP)
    assert (after.group_epoch, after.assignment_epoch, after.group_state) == (2, 2, "Stable")
    assert [(m.member_id, m.member_epoch, m.assignment) for m in after.members] == \
        [(m.member_id, m.member_epoch, m.assignment) for m in before.members]
    assert env.gc.fetch_offsets(GROUP, None, -1, None)[1][0][2].offset == 5  # type: ignore[union-attr]


async def test_fencing_leave_and_session_expiry(env: Env) -> None:
    await env.beat("a", 0, owned={})
    assert (await env.beat("a", 7)).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert (await env.beat("nobody", 1)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    await env.beat("b", 0, owned={})
    env.clock.now += 11
    await env.beat("a", 1, owned={T1: {0, 1, 2, 3}})  # a keeps its session; b's ends
    assert await env.coord.expire_members() == [(GROUP, "b")]
    left = await env.beat("a", -1)
    assert (left.error_code, left.member_epoch) == (ErrorCode.NONE, -1)
    assert env.coord.describe(GROUP).group_state == "Empty"
    assert await env.gc.delete_group(GROUP) == ErrorCode.NONE
    assert GROUP not in env.coord.groups


async def test_regex_subscription_and_bad_input(env: Env) -> None:
    a = await env.beat("a", 0, owned={}, topics=[], regex="ord.*")
    assert parts(a) == {0, 1, 2, 3}
    env.topics.by_name["orders-2"] = (T2, 2)
    a2 = await env.beat("a", 1, owned={T1: {0, 1, 2, 3}})
    assert a2.member_epoch == 2
    assert {tp.topic_id for tp in a2.assignment.topic_partitions} == {T1, T2}
    bad = await env.beat("c", 0, owned={}, regex="(")
    assert (bad.error_code, bad.error_message) == (
        ErrorCode.INVALID_REGULAR_EXPRESSION, "SubscribedTopicRegex `(` is not a valid regular expression: missing ): (.")
    # RE2 as Kafka: no backreferences, and a pattern that backtracks exponentially elsewhere is linear here.
    assert (await env.beat("c", 0, owned={}, regex="(o)\\1")).error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    env.topics.by_name["o" * 200] = (b"\x33" * 16, 1)
    slow = await env.beat("c", 0, owned={}, topics=[], regex="(o+)+x")
    assert (slow.error_code, parts(slow)) == (ErrorCode.NONE, set())
    assert (await env.beat("", 0, owned={})).error_code == ErrorCode.INVALID_REQUEST
    unsupported = Request(group_id=GROUP, member_id="d", member_epoch=0, rebalance_timeout_ms=1,
                          subscribed_topic_names=["orders"], server_assignor="sticky", topic_partitions=[])
    assert (await env.coord.heartbeat(unsupported, 1, "c", "h")).error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    # The id of a share group is not a consumer group's.
    share = messages.ShareGroupHeartbeatRequest(group_id="shared", member_id="s", member_epoch=0,
                                                subscribed_topic_names=["orders"])
    assert (await env.gc.share.heartbeat(share, "c", "h")).error_code == ErrorCode.NONE
    foreign = Request(group_id="shared", member_id="d", member_epoch=0, rebalance_timeout_ms=1,
                      subscribed_topic_names=["orders"], topic_partitions=[])
    assert (await env.coord.heartbeat(foreign, 1, "c", "h")).error_code == ErrorCode.GROUP_ID_NOT_FOUND


async def test_static_member_comes_back_without_a_rebalance(env: Env) -> None:
    async def beat(member_id: str, epoch: int, instance: str, owned: dict[bytes, set[int]] | None = None) -> Any:
        req = Request(group_id=GROUP, member_id=member_id, member_epoch=epoch, instance_id=instance,
                      rebalance_timeout_ms=30000, subscribed_topic_names=["orders"] if epoch == 0 else None,
                      topic_partitions=None if owned is None else [_TP(topic_id=t, partitions=sorted(ps))
                                                                   for t, ps in owned.items()])
        return await env.coord.heartbeat(req, 1, "cli", "/127.0.0.1")

    a = await beat("a1", 0, "A", owned={})
    b = await beat("b1", 0, "B", owned={})
    a = await beat("a1", 1, "A", owned={T1: {0, 1, 2, 3}})
    a = await beat("a1", 1, "A", owned={T1: parts(a)})
    b = await beat("b1", 2, "B", owned={})
    kept_b = parts(b)
    epoch = env.coord.groups[GROUP].group_epoch
    # Instance B is still owned by b1: another member cannot take it.
    assert (await beat("b2", 0, "B", owned={})).error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    left = await beat("b1", -2, "B")
    assert (left.error_code, left.member_epoch) == (ErrorCode.NONE, -2)
    back = await beat("b2", 0, "B", owned={})
    assert (back.error_code, parts(back), back.member_epoch) == (ErrorCode.NONE, kept_b, epoch)
    assert env.coord.groups[GROUP].group_epoch == epoch  # no rebalance
    assert sorted(env.coord.groups[GROUP].members) == ["a1", "b2"]
    assert (await beat("b1", 2, "B", owned={})).error_code == ErrorCode.FENCED_INSTANCE_ID


async def test_a_static_member_keeps_its_instance_id_when_later_heartbeats_leave_it_out(env: Env) -> None:
    """librdkafka sends InstanceId on the join only: the instance stays the member's, so another
    member joining with it gets UNRELEASED_INSTANCE_ID, and the member can still leave as static."""
    async def beat(member_id: str, epoch: int, instance: str | None, owned: dict[bytes, set[int]] | None = None
                   ) -> Any:
        req = Request(group_id=GROUP, member_id=member_id, member_epoch=epoch, instance_id=instance,
                      rebalance_timeout_ms=30000 if epoch == 0 else -1,
                      subscribed_topic_names=["orders"] if epoch == 0 else None,
                      topic_partitions=None if owned is None else [_TP(topic_id=t, partitions=sorted(ps))
                                                                   for t, ps in owned.items()])
        return await env.coord.heartbeat(req, 1, "cli", "/127.0.0.1")

    a = await beat("a1", 0, "A", owned={})
    assert a.error_code == ErrorCode.NONE
    a = await beat("a1", a.member_epoch, None, owned={T1: parts(a)})
    a = await beat("a1", a.member_epoch, None)
    assert a.error_code == ErrorCode.NONE
    member = env.coord.groups[GROUP].members["a1"]
    assert (member.instance_id, member.rebalance_timeout_ms, member.subscribed_topic_names) == ("A", 30000,
                                                                                                ("orders",))
    assert (await beat("a2", 0, "A", owned={})).error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert sorted(env.coord.groups[GROUP].members) == ["a1"]
    # The instance id survives a reload from the log too.
    await env.gc.stop()
    env.coord = env.new()
    await env.gc.load()
    assert env.coord.groups[GROUP].members["a1"].instance_id == "A"


async def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed(env: Env) -> None:
    await env.beat("a", 0, owned={})
    await env.beat("b", 0, owned={})
    a = await env.beat("a", 1, owned={T1: {0, 1, 2, 3}})
    assert env.coord.groups[GROUP].members["a"].state == 1  # UNREVOKED_PARTITIONS
    for _ in range(7):  # 35 s of heartbeats: both sessions stay alive, a never lets go
        env.clock.now += 5
        await env.beat("b", 2)
        await env.beat("a", 1, owned={T1: {0, 1, 2, 3}})
        assert await env.coord.expire_members() == ([(GROUP, "a")] if env.clock.now >= 1030 else [])
        if env.clock.now >= 1030:
            break
    b = await env.beat("b", env.coord.groups[GROUP].members["b"].member_epoch, owned={})
    assert parts(b) == {0, 1, 2, 3} and len(parts(a)) == 2
