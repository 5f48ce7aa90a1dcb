"""The group coordinator's share-offset admin operations, lag arithmetic and the metrics' windowed max."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.apis.share_group_admin import compute_lag
from shoal.broker.common.share_metrics import WindowedMax
from shoal.persister.persister import StateSummary
from shoal.protocol.errors import ErrorCode

from .test_share_group_coordinator import GROUP, T_ORDERS, T_OTHER, Env, close_log


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = Env(tmp_path)
    await e.coord.load()
    yield e
    await e.coord.stop()
    close_log(e.log)


async def test_alter_offsets_needs_an_empty_group(env: Env) -> None:
    await env.join_initialised("a", ["orders"])
    assert await env.coord.alter_offsets(GROUP, {T_ORDERS: {0: 5}}) == (ErrorCode.NON_EMPTY_GROUP, {})
    await env.hb("a", -1)
    epoch_before = env.coord.groups[GROUP].group_epoch
    code, errors = await env.coord.alter_offsets(GROUP, {T_ORDERS: {0: 5, 2: 7}})
    assert (code, errors) == (ErrorCode.NONE, {(T_ORDERS, 0): ErrorCode.NONE, (T_ORDERS, 2): ErrorCode.NONE})
    # As in Kafka the group epoch stays as it is and is the state epoch of the re-initialisation.
    group = env.coord.groups[GROUP]
    assert group.group_epoch == epoch_before and group.assignment_epoch == group.group_epoch
    altered = [(k.partition, epoch, offset) for k, epoch, offset in env.persister.initialized[-2:]]
    assert altered == [(0, group.group_epoch, 5), (2, group.group_epoch, 7)]


async def test_alter_offsets_creates_the_group_and_marks_partitions_initialised(env: Env) -> None:
    code, _ = await env.coord.alter_offsets("seeded", {T_OTHER: {1: 3}}, min_state_epoch=9)
    assert code == ErrorCode.NONE
    group = env.coord.groups["seeded"]
    assert group.state.value == "Empty" and group.group_epoch == 9
    assert env.coord.initialized_partitions("seeded") == {T_OTHER: {1}}
    # A joining member only initialises the partitions not altered, and the altered one is not reset.
    await env.hb("m", 0, ["other"], group="seeded")
    await env.coord.wait_for_background()
    reset = [(k.partition, offset) for k, _e, offset in env.persister.initialized if k.group_id == "seeded"]
    assert reset == [(1, 3), (0, -1)]
    # Survives a restart (everything went through the log).
    reloaded = env.new_coordinator()
    await reloaded.load()
    assert reloaded.initialized_partitions("seeded") == {T_OTHER: {0, 1}}


async def test_alter_offsets_failure_is_reported_per_partition(env: Env) -> None:
    env.persister.fail_initialize = True
    code, errors = await env.coord.alter_offsets("g2", {T_ORDERS: {0: 1}})
    assert code == ErrorCode.NONE and errors == {(T_ORDERS, 0): ErrorCode.COORDINATOR_NOT_AVAILABLE}
    assert env.coord.initialized_partitions("g2") == {}


async def test_delete_offsets_two_phases_and_retry(env: Env) -> None:
    await env.join_initialised("a", ["orders", "other"])
    assert await env.coord.delete_offsets(GROUP, {T_ORDERS}) == (ErrorCode.NON_EMPTY_GROUP, {})
    assert await env.coord.delete_offsets("missing", {T_ORDERS}) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
    await env.hb("a", -1)

    env.persister.fail_delete = True
    code, errors = await env.coord.delete_offsets(GROUP, {T_ORDERS})
    assert (code, errors) == (ErrorCode.NONE, {T_ORDERS: ErrorCode.COORDINATOR_NOT_AVAILABLE})
    group = env.coord.groups[GROUP]
    # Phase one stuck: no longer initialised, still recorded as being deleted.
    assert T_ORDERS not in group.initialized and group.deleting == {T_ORDERS: "orders"}
    assert env.coord.initialized_partitions(GROUP) == {T_OTHER: {0, 1}}

    env.persister.fail_delete = False
    await env.coord.retry_pending()
    assert sorted(k.partition for k in env.persister.deleted if k.topic_id == T_ORDERS) == [0, 1, 2, 3]
    assert env.coord.groups[GROUP].deleting == {}

    # The next member re-initialises the topic from scratch (start offset -1 = reset policy).
    before = len(env.persister.initialized)
    await env.hb("b", 0, ["orders"])
    await env.coord.wait_for_background()
    assert sorted((k.partition, o) for k, _e, o in env.persister.initialized[before:]) == [(p, -1) for p in range(4)]


async def test_delete_offsets_touches_only_initialised_state(env: Env) -> None:
    """As Kafka: a topic with initialised partitions has exactly those deleted; a topic whose state is
    only being initialised has nothing to delete (UNKNOWN_TOPIC_OR_PARTITION) and stays as it is."""
    await env.join_initialised("a", ["orders"])
    env.persister.fail_initialize = True
    await env.hb("b", 0, ["other"])
    await env.coord.wait_for_background()
    await env.hb("a", -1)
    await env.hb("b", -1)
    group = env.coord.groups[GROUP]
    assert set(group.initialized) == {T_ORDERS} and set(group.initializing) == {T_OTHER}
    code, errors = await env.coord.delete_offsets(GROUP, {T_ORDERS, T_OTHER})
    assert (code, errors) == (ErrorCode.NONE, {T_ORDERS: ErrorCode.NONE, T_OTHER: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
    assert sorted((k.topic_id, k.partition) for k in env.persister.deleted) == [(T_ORDERS, p) for p in range(4)]
    group = env.coord.groups[GROUP]
    assert group.initialized == {} and set(group.initializing) == {T_OTHER} and group.deleting == {}
    # Nothing initialised any more: the same request deletes nothing.
    before = len(env.persister.deleted)
    code, errors = await env.coord.delete_offsets(GROUP, {T_ORDERS})
    assert (code, errors, len(env.persister.deleted)) == (
        ErrorCode.NONE, {T_ORDERS: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}, before)


def test_compute_lag() -> None:
    assert compute_lag(100, StateSummary(0, start_offset=50, delivery_complete_count=10)) == 40
    assert compute_lag(100, StateSummary(0, start_offset=-1, delivery_complete_count=0)) == -1
    assert compute_lag(100, StateSummary(0, start_offset=50, delivery_complete_count=-1)) == -1
    # Log truncated below the start offset: never negative.
    assert compute_lag(10, StateSummary(0, start_offset=50, delivery_complete_count=0)) == 0


def test_windowed_max_ages_out() -> None:
    now = [0.0]
    wm = WindowedMax(window_s=30, clock=lambda: now[0])
    assert math.isnan(wm.value())
    wm.record(5)
    now[0] = 10
    wm.record(3)
    assert wm.value() == 5
    now[0] = 35  # a second window starts; the first still counts
    wm.record(1)
    assert wm.value() == 5
    now[0] = 65  # the first window expired
    assert wm.value() == 1
    now[0] = 200
    assert math.isnan(wm.value())
