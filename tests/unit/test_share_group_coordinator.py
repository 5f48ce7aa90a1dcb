"""ShareGroupCoordinator (share groups in the group coordinator) over a real `__consumer_offsets` (InternalTopicLog on PartitionLogs in tmp_path)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.storage.internal_topic_log import InternalTopicLog
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.topic_registry import Topic
from shoal.coordinator.placement import java_string_hashcode
from shoal.coordinator.share_group import can_compute_next_target_assignment
from shoal.coordinator.share_group_coordinator import (
    ShareGroupConfig,
    ShareGroupCoordinator,
    partition_for_group,
)
from shoal.persister.persister import ReadStateResult, SharePartitionKey, StateSummary, WriteStateRequest
from shoal.protocol import coordinator_records as cr
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

from .cancellation import cancel_once_appended

GROUP = "g1"
T_ORDERS = b"\x10" * 16
T_OTHER = b"\x20" * 16
Request = messages.ShareGroupHeartbeatRequest


class Topics:
    """The test's topic metadata (name -> id, partition count)."""

    def __init__(self) -> None:
        self.by_name: dict[str, tuple[bytes, int]] = {"orders": (T_ORDERS, 4), "other": (T_OTHER, 2)}

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        return self.by_name.get(name)

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        for name, (tid, count) in self.by_name.items():
            if tid == topic_id:
                return name, count
        return None


class RecordingPersister:
    """Implements the Persister protocol for these tests: records calls, fails on demand."""

    def __init__(self) -> None:
        self.initialized: list[tuple[SharePartitionKey, int, int]] = []
        self.deleted: list[SharePartitionKey] = []
        self.fail_initialize = False
        self.fail_delete = False
        self.delete_calls = 0
        self.initialize_calls = 0

    async def initialize_state(self, key: SharePartitionKey, state_epoch: int, start_offset: int) -> int:
        await asyncio.sleep(0)
        self.initialize_calls += 1
        if self.fail_initialize:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        self.initialized.append((key, state_epoch, start_offset))
        return ErrorCode.NONE

    async def read_state(self, key: SharePartitionKey, leader_epoch: int) -> ReadStateResult:
        raise AssertionError("the group coordinator never reads share state")

    async def write_state(self, request: WriteStateRequest) -> int:
        raise AssertionError("the group coordinator never writes share state")

    async def delete_state(self, key: SharePartitionKey) -> int:
        self.delete_calls += 1
        if self.fail_delete:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        self.deleted.append(key)
        return ErrorCode.NONE

    async def read_state_summary(self, key: SharePartitionKey, leader_epoch: int) -> StateSummary:
        raise AssertionError("not used")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def open_log(path: Path, partitions: int = 3) -> InternalTopicLog:
    plogs = [PartitionLog.open(path / f"__consumer_offsets-{p}", LogConfig()) for p in range(partitions)]
    return InternalTopicLog(Topic("__consumer_offsets", b"\x01" * 16, plogs))


def close_log(log: InternalTopicLog) -> None:
    for plog in log.topic.partitions:
        plog.close()


class Env:
    def __init__(self, path: Path, config: ShareGroupConfig | None = None) -> None:
        self.path = path
        self.topics = Topics()
        self.persister = RecordingPersister()
        self.clock = Clock()
        # Assignment batching (KIP-1263) off unless a test turns it on, as in Kafka's request tests.
        self.config = config or ShareGroupConfig(assignment_interval_ms=0)
        self.log = open_log(path)
        self.coord = self.new_coordinator()

    def new_coordinator(self) -> ShareGroupCoordinator:
        return ShareGroupCoordinator(self.log, self.topics, self.persister, self.config, clock=self.clock,
                                wall_clock=self.clock)

    async def hb(self, member: str, epoch: int, topics: list[str] | None = None, group: str = GROUP,
                 rack: str | None = None) -> Any:
        req = Request(group_id=group, member_id=member, member_epoch=epoch, rack_id=rack, subscribed_topic_names=topics)
        return await self.coord.heartbeat(req, "client-" + member, "/127.0.0.1")

    async def join_initialised(self, member: str, topics: list[str]) -> Any:
        """Join, let initialisation finish, heartbeat again: the member now holds partitions."""
        first = await self.hb(member, 0, topics)
        assert first.error_code == 0
        await self.coord.wait_for_background()
        return await self.hb(member, first.member_epoch)


def parts(resp: Any) -> dict[bytes, set[int]]:
    assert resp.assignment is not None
    return {tp.topic_id: set(tp.partitions) for tp in resp.assignment.topic_partitions}


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    await e.coord.load()
    yield e
    await e.coord.stop()
    close_log(e.log)


async def test_join_then_assignment_after_initialisation(env: Env) -> None:
    resp = await env.hb("m1", 0, ["orders"])
    assert resp.error_code == 0
    assert resp.member_id == "m1"
    assert resp.member_epoch == 1
    assert resp.heartbeat_interval_ms == 5000
    # Nothing is initialised yet: an empty (but present) assignment.
    assert parts(resp) == {}
    await env.coord.wait_for_background()
    assert sorted(k.partition for k, _, _ in env.persister.initialized) == [0, 1, 2, 3]
    assert {(k.group_id, k.topic_id, epoch, start) for k, epoch, start in env.persister.initialized} == {
        (GROUP, T_ORDERS, 1, -1)
    }
    resp = await env.hb("m1", 1)
    assert resp.member_epoch == 2
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}
    # Steady state: same epoch, no assignment in the response.
    resp = await env.hb("m1", 2)
    assert (resp.error_code, resp.member_epoch, resp.assignment) == (0, 2, None)
    # A full request (subscription present) always carries the assignment.
    resp = await env.hb("m1", 2, ["orders"])
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}
    assert env.coord.rebalances == 2


async def test_two_members_split_partitions(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    b = await env.hb("b", 0, ["orders"])
    assert b.member_epoch == a.member_epoch + 1
    assert len(parts(b)[T_ORDERS]) == 2
    a2 = await env.hb("a", a.member_epoch)
    assert a2.member_epoch == b.member_epoch
    assert parts(a2)[T_ORDERS] | parts(b)[T_ORDERS] == {0, 1, 2, 3}
    assert parts(a2)[T_ORDERS].isdisjoint(parts(b)[T_ORDERS])


async def test_more_members_than_partitions_share(env: Env) -> None:
    env.topics.by_name["one"] = (b"\x30" * 16, 1)
    first = await env.join_initialised("a", ["one"])
    second = await env.hb("b", 0, ["one"])
    assert parts(second) == {b"\x30" * 16: {0}}
    again = await env.hb("a", first.member_epoch)
    assert again.member_epoch == second.member_epoch
    assert again.assignment is None  # still holds partition 0, shared with b


async def test_leave_bumps_epoch_and_rebalances(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    b = await env.hb("b", 0, ["orders"])
    a1 = await env.hb("a", a.member_epoch)
    assert len(parts(a1)[T_ORDERS]) == 2
    leave = await env.hb("b", -1)
    assert (leave.error_code, leave.member_id, leave.member_epoch) == (0, "b", -1)
    a2 = await env.hb("a", a1.member_epoch)
    # The leave bumped the epoch; a's next heartbeat recomputes the target at that epoch.
    assert a2.member_epoch == b.member_epoch + 1
    assert parts(a2) == {T_ORDERS: {0, 1, 2, 3}}
    [described] = env.coord.describe([GROUP])
    assert [m.member_id for m in described.members] == ["a"]
    # Leaving twice is an unknown member.
    assert (await env.hb("b", -1)).error_code == ErrorCode.UNKNOWN_MEMBER_ID


async def test_last_member_leaving_empties_group(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    await env.hb("a", -1)
    [described] = env.coord.describe([GROUP])
    assert described.group_state == "Empty"
    assert described.group_epoch == a.member_epoch + 1
    assert described.assignment_epoch == described.group_epoch


async def test_fenced_member_epoch(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    assert a.member_epoch == 2
    too_new = await env.hb("a", 7)
    assert too_new.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    # The previous epoch is tolerated (a lost response) ...
    assert (await env.hb("a", 1)).error_code == 0
    # ... anything older is not.
    b = await env.hb("b", 0, ["orders"])
    a_now = await env.hb("a", 2)
    assert a_now.member_epoch == b.member_epoch
    assert (await env.hb("a", 1)).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    # Rejoining with epoch 0 and the same member id works.
    rejoin = await env.hb("a", 0, ["orders"])
    assert rejoin.error_code == 0 and rejoin.member_epoch == b.member_epoch


async def test_unknown_member_and_group(env: Env) -> None:
    assert (await env.hb("ghost", 3, group="nope")).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    await env.hb("a", 0, ["orders"])
    resp = await env.hb("ghost", 3)
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert resp.member_id is None


async def test_invalid_requests(env: Env) -> None:
    assert (await env.hb("", 0, ["orders"])).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("x" * 37, 0, ["orders"])).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("a", 0, ["orders"], group="")).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("a", 0, ["orders"], rack="")).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("a", 0, None)).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("a", 0, [])).error_code == ErrorCode.INVALID_REQUEST
    assert (await env.hb("a", -2, ["orders"])).error_code == ErrorCode.INVALID_REQUEST
    assert env.coord.group_ids() == []


async def test_max_size(tmp_path: Path) -> None:
    e = Env(tmp_path, ShareGroupConfig(max_size=2, assignment_interval_ms=0))
    await e.coord.load()
    assert (await e.hb("a", 0, ["orders"])).error_code == 0
    b = await e.hb("b", 0, ["orders"])
    assert b.error_code == 0
    assert (await e.hb("c", 0, ["orders"])).error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    # Existing members keep working.
    assert (await e.hb("b", b.member_epoch)).error_code == 0
    await e.coord.stop()
    close_log(e.log)


async def test_subscription_change_bumps_epoch(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    resp = await env.hb("a", a.member_epoch, ["orders", "other"])
    assert resp.member_epoch == a.member_epoch + 1
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}  # "other" is still being initialised
    await env.coord.wait_for_background()
    resp = await env.hb("a", resp.member_epoch)
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}, T_OTHER: {0, 1}}
    resp = await env.hb("a", resp.member_epoch, ["other"])
    assert parts(resp) == {T_OTHER: {0, 1}}


async def test_session_timeout_explicit(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    b = await env.hb("b", 0, ["orders"])
    env.clock.now += 30
    await env.hb("a", a.member_epoch)  # a stays alive
    env.clock.now += 20  # b is 50 s silent, a only 20 s
    assert await env.coord.expire_members() == [(GROUP, "b")]
    [described] = env.coord.describe([GROUP])
    assert [m.member_id for m in described.members] == ["a"]
    assert described.group_epoch == b.member_epoch + 1
    assert (await env.hb("b", b.member_epoch)).error_code == ErrorCode.UNKNOWN_MEMBER_ID


async def test_session_timeout_background_loop(tmp_path: Path) -> None:
    config = ShareGroupConfig(session_timeout_ms=50, maintenance_interval_ms=10, assignment_interval_ms=0)
    log = open_log(tmp_path)
    coord = ShareGroupCoordinator(log, Topics(), RecordingPersister(), config)
    await coord.load()
    coord.start()
    req = Request(group_id=GROUP, member_id="a", member_epoch=0, subscribed_topic_names=["orders"])
    assert (await coord.heartbeat(req, "c", "/h")).error_code == 0
    for _ in range(100):
        if coord.is_empty(GROUP):
            break
        await asyncio.sleep(0.01)
    assert coord.is_empty(GROUP)
    assert coord.list_groups() == [(GROUP, "Empty")]
    await coord.stop()
    close_log(log)


async def test_failed_initialisation_is_retried_after_partition_0_went_to_another_instance(tmp_path: Path) -> None:
    """Sidecar mode: the retry timer was partition 0's, so giving that partition to another instance took
    the timer along, and a group this instance kept had its failed initialisation never retried."""
    env = Env(tmp_path, ShareGroupConfig(maintenance_interval_ms=10, assignment_interval_ms=0))
    await env.coord.load()
    env.coord.start()
    group = next(g for g in (f"group-{i}" for i in range(100)) if env.coord.partition_for(g) != 0)
    env.persister.fail_initialize = True
    await env.hb("a", 0, ["orders"], group=group)
    await env.coord.wait_for_background()
    env.coord.runtime.unload(0)
    env.persister.fail_initialize = False
    env.clock.now += 31  # past the retry interval and the backoff; no heartbeat comes
    for _ in range(500):
        if len(env.persister.initialized) == 4:
            break
        await asyncio.sleep(0.01)
    assert sorted(k.partition for k, _, _ in env.persister.initialized) == [0, 1, 2, 3]
    await env.coord.stop()
    close_log(env.log)


async def test_restart_restores_state(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    b = await env.hb("b", 0, ["orders"], rack="r1")
    a2 = await env.hb("a", a.member_epoch)
    before = env.coord.describe([GROUP])
    await env.coord.stop()
    close_log(env.log)

    env.log = open_log(env.path)
    env.persister.initialized.clear()
    env.coord = env.new_coordinator()
    await env.coord.load()
    assert env.coord.describe([GROUP]) == before
    group = env.coord.groups[GROUP]
    assert group.initialized[T_ORDERS].partitions == {0, 1, 2, 3}
    assert group.members["b"].rack_id == "r1"
    assert group.target_assignment["a"] == {T_ORDERS: frozenset(parts(a2)[T_ORDERS])}
    # Members carry on with their epochs; nothing needs re-initialising.
    again = await env.hb("b", b.member_epoch)
    assert (again.error_code, again.member_epoch, again.assignment) == (0, b.member_epoch, None)
    await env.coord.wait_for_background()
    assert env.persister.initialized == []
    # Restored members got a fresh session: not expired right away, expired after the timeout.
    assert await env.coord.expire_members() == []
    env.clock.now += 46
    assert sorted(await env.coord.expire_members()) == [(GROUP, "a"), (GROUP, "b")]


async def test_heartbeats_cancelled_mid_append_leave_no_ghosts(env: Env) -> None:
    await env.join_initialised("a", ["orders"])
    plog = env.log.topic.partitions[partition_for_group(GROUP, env.log.num_partitions)]
    await cancel_once_appended(plog, env.hb("a", -1))  # a leave: "a" must not linger in memory
    await cancel_once_appended(plog, env.hb("b", 0, ["orders"]))  # a join: "b" must not appear only after a restart
    await env.coord.stop()  # operations already started run to completion
    assert sorted(env.coord.groups[GROUP].members) == ["b"]
    reloaded = env.new_coordinator()
    await reloaded.load()
    assert reloaded.describe([GROUP]) == env.coord.describe([GROUP])


async def test_records_on_the_log(env: Env) -> None:
    await env.join_initialised("a", ["orders"])
    partition = partition_for_group(GROUP, env.log.num_partitions)
    types = [rec.record_type for _, rec in env.log.replay(partition)]
    assert set(types) == {
        cr.SHARE_GROUP_MEMBER_METADATA, cr.SHARE_GROUP_METADATA, cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
        cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        cr.SHARE_GROUP_STATE_PARTITION_METADATA,
    }
    other = [p for p in range(env.log.num_partitions) if p != partition]
    assert all(not list(env.log.replay(p)) for p in other)
    states = [rec.value for _, rec in env.log.replay(partition) if rec.record_type == cr.SHARE_GROUP_STATE_PARTITION_METADATA]
    assert [t.partitions for t in states[0].initializing_topics] == [[0, 1, 2, 3]]
    assert states[-1].initializing_topics == [] and states[-1].initialized_topics[0].topic_name == "orders"


async def test_describe_and_list(env: Env) -> None:
    await env.join_initialised("a", ["orders"])
    await env.hb("b", 0, ["orders"], group="g2")
    await env.hb("b", -1, group="g2")
    described, missing = env.coord.describe([GROUP, "missing"])
    assert missing.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert (described.error_code, described.group_state, described.assignor_name) == (0, "Stable", "simple")
    [member] = described.members
    assert (member.member_id, member.client_id, member.client_host) == ("a", "client-a", "/127.0.0.1")
    assert member.subscribed_topic_names == ["orders"]
    [tp] = member.assignment.topic_partitions
    assert (tp.topic_id, tp.topic_name, tp.partitions) == (T_ORDERS, "orders", [0, 1, 2, 3])
    assert env.coord.list_groups() == [(GROUP, "Stable"), ("g2", "Empty")]
    assert env.coord.groups_by_state() == {"Empty": 1, "Stable": 1, "Dead": 0}
    assert not env.coord.is_empty(GROUP) and env.coord.is_empty("g2")


async def test_delete_group(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    assert await env.coord.delete_group(GROUP) == ErrorCode.NON_EMPTY_GROUP
    assert await env.coord.delete_group("missing") == ErrorCode.GROUP_ID_NOT_FOUND
    await env.hb("a", -1)
    env.persister.fail_delete = True
    assert await env.coord.delete_group(GROUP) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert env.coord.group_ids() == [GROUP]
    assert env.coord.groups[GROUP].deleting == {T_ORDERS: "orders"}
    env.persister.fail_delete = False
    assert await env.coord.delete_group(GROUP) == ErrorCode.NONE
    assert sorted(k.partition for k in env.persister.deleted) == [0, 1, 2, 3]
    assert env.coord.group_ids() == []
    assert env.coord.describe([GROUP])[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND
    # Gone after a restart too; a new join starts a fresh group.
    reloaded = env.new_coordinator()
    await reloaded.load()
    assert reloaded.group_ids() == []
    env.coord = reloaded
    fresh = await env.hb("a", 0, ["orders"])
    assert fresh.member_epoch == 1 and a.member_epoch == 2


async def test_initialisation_failure_is_retried(env: Env) -> None:
    env.persister.fail_initialize = True
    resp = await env.hb("a", 0, ["orders"])
    await env.coord.wait_for_background()
    assert env.coord.groups[GROUP].initializing[T_ORDERS].partitions == {0, 1, 2, 3}
    env.persister.fail_initialize = False
    # Not before the retry interval ...
    await env.coord.retry_pending()
    await env.hb("a", resp.member_epoch)
    await env.coord.wait_for_background()
    assert env.persister.initialized == []
    # ... but after it.
    env.clock.now += 31
    await env.coord.retry_pending()
    await env.coord.wait_for_background()
    assert len(env.persister.initialized) == 4
    resp = await env.hb("a", resp.member_epoch)
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}


async def test_failed_initialisation_is_retried_by_a_heartbeat_once_its_backoff_passed(env: Env) -> None:
    """As Kafka, which uninitialises failed partitions so that the next heartbeat retries them: a transient
    failure costs the backoff (1 s at first), not the whole retry interval."""
    env.persister.fail_initialize = True
    resp = await env.hb("a", 0, ["orders"])
    await env.coord.wait_for_background()
    env.persister.fail_initialize = False
    env.clock.now += 1.5
    resp = await env.hb("a", resp.member_epoch)
    await env.coord.wait_for_background()
    assert len(env.persister.initialized) == 4
    resp = await env.hb("a", resp.member_epoch)
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}


async def test_added_partitions_are_initialised_and_assigned(env: Env) -> None:
    a = await env.join_initialised("a", ["orders"])
    env.topics.by_name["orders"] = (T_ORDERS, 6)
    env.coord.on_topics_changed("created")
    await env.coord.wait_for_background()
    assert sorted(k.partition for k, _, _ in env.persister.initialized[4:]) == [4, 5]
    resp = await env.hb("a", a.member_epoch)
    assert parts(resp) == {T_ORDERS: set(range(6))}


async def test_deleted_topic_is_forgotten(env: Env) -> None:
    """As in Kafka: the topic leaves the group's maps; its state was tombstoned with the topic, so the group
    asks for no deletion that could fail forever (UNKNOWN_TOPIC_OR_PARTITION) and retries nothing."""
    a = await env.join_initialised("a", ["orders", "other"])
    del env.topics.by_name["other"]
    await env.coord.refresh_topic_metadata()
    await env.coord.wait_for_background()
    group = env.coord.groups[GROUP]
    assert T_OTHER not in group.initialized and T_OTHER not in group.initializing and group.deleting == {}
    for _ in range(5):
        env.clock.now += 60
        await env.coord.retry_pending()
    assert env.persister.delete_calls == 0
    resp = await env.hb("a", a.member_epoch)
    assert resp.member_epoch > a.member_epoch
    assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}
    # The group can be deleted, and a restart sees the same maps.
    await env.hb("a", -1)
    assert await env.coord.delete_group(GROUP) == ErrorCode.NONE
    assert {k.topic_id for k in env.persister.deleted} == {T_ORDERS}


async def test_stuck_deletion_of_a_deleted_topic_is_dropped(env: Env) -> None:
    """A "deleting" entry left for a topic that is gone (older data) is dropped, not retried."""
    await env.join_initialised("a", ["orders", "other"])
    await env.hb("a", -1)
    env.persister.fail_delete = True
    code, errors = await env.coord.delete_offsets(GROUP, [T_OTHER])
    assert errors[T_OTHER] != ErrorCode.NONE and GROUP in env.coord._pending_state_deletes
    del env.topics.by_name["other"]
    await env.coord.refresh_topic_metadata()
    assert env.coord.groups[GROUP].deleting == {} and GROUP not in env.coord._pending_state_deletes
    calls = env.persister.delete_calls
    env.clock.now += 3600
    await env.coord.retry_pending()
    assert env.persister.delete_calls == calls
    env.persister.fail_delete = False
    assert await env.coord.delete_group(GROUP) == ErrorCode.NONE


async def test_failing_initialisation_backs_off(env: Env) -> None:
    env.persister.fail_initialize = True
    await env.hb("a", 0, ["orders"])
    await env.coord.wait_for_background()
    first = env.persister.initialize_calls
    for _ in range(3600):  # an hour of one-second maintenance ticks
        env.clock.now += 1
        await env.coord.retry_pending()
        await env.coord.wait_for_background()
    attempts = (env.persister.initialize_calls - first) // 4  # four partitions per attempt
    assert 0 < attempts <= 3600 // 30  # never more often than the retry interval, and less as failures go on
    env.persister.fail_initialize = False
    env.clock.now += 61
    await env.coord.retry_pending()
    await env.coord.wait_for_background()
    assert len(env.persister.initialized) == 4


async def test_failing_state_deletion_backs_off(env: Env) -> None:
    await env.join_initialised("a", ["orders"])
    await env.hb("a", -1)
    env.persister.fail_delete = True
    await env.coord.delete_offsets(GROUP, [T_ORDERS])
    first = env.persister.delete_calls
    # Ten simulated minutes of one-second maintenance ticks: exponential backoff, not 600 retries.
    for _ in range(600):
        env.clock.now += 1
        await env.coord.retry_pending()
    retries = env.persister.delete_calls - first
    assert 0 < retries <= 4 * 20  # each attempt sends at most the 4 partitions; about 15 attempts
    env.persister.fail_delete = False
    env.clock.now += 61
    await env.coord.retry_pending()
    assert GROUP not in env.coord._pending_state_deletes


async def test_load_in_progress(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    coord = ShareGroupCoordinator(log, Topics(), RecordingPersister())
    req = Request(group_id=GROUP, member_id="a", member_epoch=0, subscribed_topic_names=["orders"])
    assert (await coord.heartbeat(req, "c", "/h")).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    close_log(log)


def test_group_placement_matches_kafka() -> None:
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("") == 0
    # A string whose Java hashCode is Integer.MIN_VALUE maps to partition 0 (Utils.abs).
    assert java_string_hashcode("polygenelubricants") == -(2**31)
    assert partition_for_group("polygenelubricants", 50) == 0
    assert partition_for_group("hello", 50) == 99162322 % 50
    assert partition_for_group("\u00e9t\u00e9", 7) == abs(java_string_hashcode("\u00e9t\u00e9")) % 7


# ---- the API layer (broker/apis/share_group_apis.py) over a real broker object ------------------------------


class DenyingAuthorizer:
    """Allows everything except the listed (operation, resource type, name) triples."""

    def __init__(self) -> None:
        self.denied: set[tuple[int, int, str]] = set()

    def authorize(self, principal: Any, host: str, operation: Any, resource_type: Any, name: str) -> bool:
        return (int(operation), int(resource_type), name) not in self.denied


@pytest.fixture
async def api_env(tmp_path: Path) -> Any:
    from shoal.broker.apis.services import ShareGroupServices
    from shoal.broker.apis.share_group_apis import ShareGroupApis
    from shoal.broker.common.config import BrokerConfig
    from shoal.broker.network.connection import KafkaConnection, RequestContext
    from shoal.broker.security.authorizer import Operation, ResourceType
    from shoal.broker.server.adapters import BrokerTopicMetadata
    from shoal.broker.server.server import Broker

    config = BrokerConfig.from_strings({"log.dirs": str(tmp_path / "data"), "offsets.topic.num.partitions": "3",
                                        "share.coordinator.state.topic.num.partitions": "3",
                                        "group.share.assignment.interval.ms": "0"})
    broker = Broker(config)
    broker.topics.load()
    broker.ensure_internal_topics()
    broker.topics.create("orders", 2)
    auth = DenyingAuthorizer()
    broker.authorizer = auth
    persister = RecordingPersister()
    offsets = broker.topics.get("__consumer_offsets")
    assert offsets is not None
    share_groups = ShareGroupCoordinator(
        InternalTopicLog(offsets), BrokerTopicMetadata(broker.topics), persister, group_configs=broker.group_configs
    )
    await share_groups.load()
    conn = KafkaConnection(broker, config.listeners()[0])
    conn.client_host = "10.0.0.1"

    def ctx(api_key: int, version: int) -> RequestContext:
        return RequestContext(messages.RequestHeader(api_key, version, 1, "cli"), conn)

    apis = ShareGroupApis(ShareGroupServices(config, share_groups, None, None))
    yield broker, apis, ctx, auth, (Operation, ResourceType)
    await share_groups.stop()
    broker.topics.close()


def roundtrip(body: Any, api_key: int, version: int) -> Any:
    frame = messages.encode_response(body, api_key, version, 7, framed=False)
    return messages.decode_response(frame, api_key, version)[1]


async def test_api_heartbeat_describe_list(api_env: Any) -> None:
    broker, apis, ctx, auth, (Operation, ResourceType) = api_env
    req = Request(group_id="ag", member_id="m", member_epoch=0, subscribed_topic_names=["orders"])
    resp = roundtrip(await apis.share_group_heartbeat(ctx(76, 1), req), 76, 1)
    assert (resp.error_code, resp.member_epoch) == (0, 1)
    await apis.services.share_groups.wait_for_background()
    resp = roundtrip(await apis.share_group_heartbeat(ctx(76, 1), Request(group_id="ag", member_id="m", member_epoch=1)), 76, 1)
    assert [sorted(tp.partitions) for tp in resp.assignment.topic_partitions] == [[0, 1]]

    describe = messages.ShareGroupDescribeRequest(group_ids=["ag", "nope", ""], include_authorized_operations=True)
    body = roundtrip(apis.share_group_describe(ctx(77, 1), describe), 77, 1)
    ag, nope, empty = body.groups
    assert (ag.error_code, ag.group_state, ag.members[0].client_id, ag.members[0].client_host) == (0, "Stable", "cli", "/10.0.0.1")
    assert ag.members[0].assignment.topic_partitions[0].topic_name == "orders"
    assert ag.authorized_operations == sum(1 << op for op in (3, 8, 6, 10, 11))
    assert nope.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert empty.error_code == ErrorCode.INVALID_GROUP_ID

    def listed(version: int, states: list[str] | None = None, types: list[str] | None = None) -> list[Any]:
        req = messages.ListGroupsRequest(states_filter=states or [], types_filter=types or [])
        return list(roundtrip(apis.list_groups(ctx(16, version), req), 16, version).groups)

    [g] = listed(5)
    assert (g.group_id, g.protocol_type, g.group_state, g.group_type) == ("ag", "share", "Stable", "share")
    assert [x.group_id for x in listed(0)] == ["ag"]
    assert listed(4, states=["empty"]) == []
    assert [x.group_id for x in listed(4, states=["STABLE"])] == ["ag"]
    assert listed(5, types=["consumer"]) == []
    assert [x.group_id for x in listed(5, types=["Share"])] == ["ag"]

    # Authorization failures.
    auth.denied.add((Operation.DESCRIBE, ResourceType.TOPIC, "orders"))
    assert (await apis.share_group_heartbeat(ctx(76, 1), req)).error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert apis.share_group_describe(ctx(77, 1), describe).groups[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    auth.denied.add((Operation.READ, ResourceType.GROUP, "ag"))
    assert (await apis.share_group_heartbeat(ctx(76, 1), req)).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    auth.denied.add((Operation.DESCRIBE, ResourceType.GROUP, "ag"))
    assert apis.share_group_describe(ctx(77, 1), describe).groups[0].error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    auth.denied.add((Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster"))
    assert listed(5) == []


async def test_api_disabled(api_env: Any) -> None:
    broker, apis, ctx, _auth, _ = api_env
    broker.config._values["group.share.enable"] = False
    req = Request(group_id="ag", member_id="m", member_epoch=0, subscribed_topic_names=["orders"])
    assert (await apis.share_group_heartbeat(ctx(76, 1), req)).error_code == ErrorCode.UNSUPPORTED_VERSION
    describe = messages.ShareGroupDescribeRequest(group_ids=["ag"])
    assert apis.share_group_describe(ctx(77, 1), describe).groups[0].error_code == ErrorCode.UNSUPPORTED_VERSION
    assert apis.services.share_groups.group_ids() == []


# ---- KIP-1263: the target assignment is recomputed at most once per share.assignment.interval.ms ----


class IntervalConfigs:
    """GroupConfigSource with a per-group share.assignment.interval.ms over the broker's defaults."""

    def __init__(self, intervals: dict[str, int]) -> None:
        self.intervals = intervals

    def get_int(self, group_id: str, key: str) -> int:
        defaults = {"share.session.timeout.ms": 45000, "share.heartbeat.interval.ms": 5000,
                    "share.assignment.interval.ms": 1000}
        if key == "share.assignment.interval.ms" and group_id in self.intervals:
            return self.intervals[group_id]
        return defaults[key]


@pytest.mark.parametrize(("timestamp", "interval", "now", "expected"), [
    (0, 5000, 1, True),  # no earlier computation known
    (1000, 0, 1001, True),  # batching off (also the way out if the wall clock jumped back)
    (1000, 5000, 5999, False),
    (1000, 5000, 6000, True),
    (1000, 5000, 999, False),  # clock went back: wait, as Kafka does
])
def test_can_compute_next_target_assignment(timestamp: int, interval: int, now: int, expected: bool) -> None:
    assert can_compute_next_target_assignment(timestamp, interval, now) is expected


async def test_assignment_interval_batches_target_assignments(tmp_path: Path) -> None:
    e = Env(tmp_path, ShareGroupConfig(assignment_interval_ms=5000))
    await e.coord.load()
    try:
        # The first target assignment is computed at once (there is none before it), at the wall clock.
        first = await e.hb("a", 0, ["orders"])
        assert (first.member_epoch, parts(first)) == (1, {})
        group = e.coord.groups[GROUP]
        assert (group.assignment_epoch, group.assignment_timestamp_ms) == (1, 1_000_000)
        await e.coord.wait_for_background()
        # The partitions are now initialised: the group epoch moves to 2, the assignment waits.
        waiting = await e.hb("a", 1)
        assert (waiting.member_epoch, waiting.assignment) == (1, None)
        assert (group.group_epoch, group.assignment_epoch) == (2, 1)
        # Heartbeats while waiting do not bump the epoch again.
        e.clock.now += 4.999
        assert (await e.hb("a", 1)).member_epoch == 1
        assert (group.group_epoch, e.coord.rebalances) == (2, 2)
        # Once the interval has passed since the last computation, the next heartbeat computes it.
        e.clock.now += 0.001
        ready = await e.hb("a", 1)
        assert (ready.member_epoch, parts(ready)) == (2, {T_ORDERS: {0, 1, 2, 3}})
        assert (group.assignment_epoch, group.assignment_timestamp_ms) == (2, 1_005_000)
        # A member joining within the interval gets the last target assignment's epoch and nothing yet.
        b = await e.hb("b", 0, ["orders"])
        assert (b.member_epoch, parts(b)) == (2, {})
        assert group.group_epoch == 3
        assert (await e.hb("a", 2)).assignment is None
        e.clock.now += 5
        b2 = await e.hb("b", 2)
        a2 = await e.hb("a", 2)
        assert b2.member_epoch == a2.member_epoch == 3
        assert parts(a2)[T_ORDERS] | parts(b2)[T_ORDERS] == {0, 1, 2, 3}
        assert parts(a2)[T_ORDERS].isdisjoint(parts(b2)[T_ORDERS])
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_assignment_interval_group_config_wins(tmp_path: Path) -> None:
    e = Env(tmp_path)
    e.coord = ShareGroupCoordinator(e.log, e.topics, e.persister, ShareGroupConfig(), clock=e.clock,
                               wall_clock=e.clock, group_configs=IntervalConfigs({"batched": 15000, GROUP: 0}))
    await e.coord.load()
    try:
        for group_id in (GROUP, "batched"):
            await e.hb("a", 0, ["orders"], group=group_id)
        await e.coord.wait_for_background()
        e.clock.now += 1  # past the broker default (1000 ms), within the group's 15000 ms
        assert parts(await e.hb("a", 1, group=GROUP)) == {T_ORDERS: {0, 1, 2, 3}}
        assert (await e.hb("a", 1, group="batched")).assignment is None
        e.clock.now += 14
        assert parts(await e.hb("a", 1, group="batched")) == {T_ORDERS: {0, 1, 2, 3}}
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_assignment_timestamp_is_persisted(tmp_path: Path) -> None:
    e = Env(tmp_path, ShareGroupConfig(assignment_interval_ms=5000))
    await e.coord.load()
    await e.hb("a", 0, ["orders"])
    await e.coord.wait_for_background()
    partition = partition_for_group(GROUP, e.log.num_partitions)
    [meta] = [rec.value for _, rec in e.log.replay(partition)
              if rec.record_type == cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA]
    assert (meta.assignment_epoch, meta.assignment_timestamp) == (1, 1_000_000)
    await e.coord.stop()
    close_log(e.log)
    # After a restart the interval still counts from the persisted computation.
    e.log = open_log(tmp_path)
    e.coord = e.new_coordinator()
    await e.coord.load()
    try:
        assert e.coord.groups[GROUP].assignment_timestamp_ms == 1_000_000
        e.clock.now += 2
        assert (await e.hb("a", 1)).assignment is None
        e.clock.now += 3
        assert parts(await e.hb("a", 1)) == {T_ORDERS: {0, 1, 2, 3}}
    finally:
        await e.coord.stop()
        close_log(e.log)


# ---- sidecar mode: assignment in the heartbeat that initialised the partitions --------------------------


class LearningTopics(Topics):
    """Topic metadata that knows a topic only once asked to re-read it (as the upstream's metadata is
    learnt by the sidecar), counting the re-reads."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = {"late": (b"\x30" * 16, 3)}
        self.learnt: list[list[str]] = []

    async def learn_topics(self, names: Any) -> None:
        wanted = sorted(names)
        self.learnt.append(wanted)
        for name in wanted:
            if name in self.hidden:
                self.by_name[name] = self.hidden.pop(name)


async def test_sidecar_join_is_answered_with_its_initialised_assignment(tmp_path: Path) -> None:
    # The assignment interval (KIP-1263) is on: the step after the initialisation is part of the same heartbeat.
    e = Env(tmp_path, ShareGroupConfig(assignment_interval_ms=1000, assign_after_initialization=True))
    await e.coord.load()
    try:
        resp = await e.hb("m1", 0, ["orders"])
        assert (resp.error_code, resp.member_epoch) == (0, 2)
        assert parts(resp) == {T_ORDERS: {0, 1, 2, 3}}
        # Initialised at the epoch of the join, as Kafka initialises them.
        assert {(k.partition, epoch) for k, epoch, _ in e.persister.initialized} == {(p, 1) for p in range(4)}
        # Steady state afterwards, as after Kafka's second heartbeat.
        again = await e.hb("m1", 2)
        assert (again.error_code, again.member_epoch, again.assignment) == (0, 2, None)
        # A second member joins partitions that are initialised already: nothing to wait for (past the
        # assignment interval, which holds back a target computed across heartbeats).
        calls = e.persister.initialize_calls
        e.clock.now += 2
        other = await e.hb("m2", 0, ["orders"])
        assert other.member_epoch == 3 and len(parts(other)[T_ORDERS]) == 2
        assert e.persister.initialize_calls == calls
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_sidecar_join_keeps_kafkas_answer_when_initialisation_fails(tmp_path: Path) -> None:
    e = Env(tmp_path, ShareGroupConfig(assignment_interval_ms=0, assign_after_initialization=True))
    e.persister.fail_initialize = True
    await e.coord.load()
    try:
        resp = await e.hb("m1", 0, ["orders"])
        assert (resp.error_code, resp.member_epoch, parts(resp)) == (0, 1, {})
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_heartbeat_learns_a_topic_it_does_not_know(tmp_path: Path) -> None:
    e = Env(tmp_path, ShareGroupConfig(assignment_interval_ms=0, assign_after_initialization=True))
    e.topics = LearningTopics()
    e.coord = e.new_coordinator()
    await e.coord.load()
    try:
        resp = await e.hb("m1", 0, ["late"])
        assert e.topics.learnt == [["late"]]
        assert parts(resp) == {b"\x30" * 16: {0, 1, 2}}
        # Regular heartbeats name no topics and re-read nothing.
        await e.hb("m1", resp.member_epoch)
        assert e.topics.learnt == [["late"]]
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_topic_created_later_reaches_the_group_through_the_metadata_listener(tmp_path: Path) -> None:
    e = Env(tmp_path)
    e.topics = LearningTopics()
    e.coord = e.new_coordinator()
    await e.coord.load()
    try:
        first = await e.hb("m1", 0, ["later"])  # not created yet
        assert (first.member_epoch, parts(first)) == (1, {})
        assert e.persister.initialized == []
        # Created, and the upstream's metadata now names it (a periodic re-read): the group bumps and
        # initialises at once.
        e.topics.by_name["later"] = e.topics.hidden.pop("late")
        e.coord.on_upstream_topics_changed()
        await e.coord.wait_for_background()
        assert sorted(k.partition for k, _, _ in e.persister.initialized) == [0, 1, 2]
        resp = await e.hb("m1", first.member_epoch)
        assert resp.member_epoch > first.member_epoch
        assert parts(resp) == {b"\x30" * 16: {0, 1, 2}}
    finally:
        await e.coord.stop()
        close_log(e.log)


async def test_upstream_metadata_change_keeps_state_of_topics_it_no_longer_names(tmp_path: Path) -> None:
    e = Env(tmp_path)
    await e.coord.load()
    try:
        await e.join_initialised("m1", ["orders"])
        del e.topics.by_name["orders"]  # missing from one upstream metadata answer
        e.coord.on_upstream_topics_changed()
        await e.coord.wait_for_background()
        assert T_ORDERS in e.coord.initialized_partitions(GROUP)  # type: ignore[operator]
    finally:
        await e.coord.stop()
        close_log(e.log)
