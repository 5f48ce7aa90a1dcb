"""Placement: where an internal topic's keys live, the one answer lookups and replay share (issue 34)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.classic_coordinator import OffsetToCommit
from shoal.coordinator.classic_group import ClassicGroup
from shoal.coordinator.group_coordinator import GroupCoordinator
from shoal.coordinator.group_coordinator_shard import GroupCoordinatorShard, GroupsView
from shoal.coordinator.placement import Placement, coordinator_partition
from shoal.coordinator.transaction_coordinator import TransactionCoordinator

from .test_group_coordinator import Topics
from .test_share_group_coordinator import RecordingPersister, close_log, open_log

keys = st.text(min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(created=st.integers(1, 6), added=st.integers(0, 3),
       held=st.lists(st.tuples(keys, st.integers(0, 8)), max_size=30), probes=st.lists(keys, max_size=10))
def test_lookups_and_iteration_agree_whatever_partitions_hold_the_keys(
        created: int, added: int, held: list[tuple[str, int]], probes: list[str]) -> None:
    """Keys in any partitions (as replay of a data directory may find them): after `settle`, every key held
    somewhere is seen exactly once, a lookup finds the copy iteration yields, and a key at home stays there."""
    shards = [GroupCoordinatorShard() for _ in range(created + added)]
    for key, partition in held:
        # The group's generation names the partition holding it, so a lookup shows which copy it found.
        shards[partition % len(shards)].groups[key] = ClassicGroup(key, generation_id=partition % len(shards))
    placement: Placement[str] = Placement(created)
    placement.settle([set(s.groups) for s in shards])
    view: GroupsView[ClassicGroup] = GroupsView(shards, placement.partition_for, ClassicGroup)

    listed = list(view)
    assert len(listed) == len(set(listed)) == len(view)
    everywhere = {k for s in shards for k in s.groups}
    assert set(listed) == everywhere  # nothing held is lost
    for key in listed:
        owner = placement.partition_for(key)
        assert view[key].generation_id == owner and key in shards[owner].groups
        if key in shards[placement.home(key)].groups:
            assert owner == placement.home(key)  # the home copy wins
    for key in probes:
        if key not in everywhere:
            # A new key goes home, by the count the topic was created with.
            assert key not in view
            assert placement.partition_for(key) == coordinator_partition(key, created) < created


def test_a_key_found_away_from_home_stays_there() -> None:
    key = "\U0001f475"
    home = coordinator_partition(key, 50)
    shards: list[dict[str, int]] = [{} for _ in range(51)]
    shards[50][key] = 1
    placement: Placement[str] = Placement(50, topic="__consumer_offsets")
    assert placement.settle(shards) == 1
    assert placement.partition_for(key) == 50 != home
    assert placement.misplaced == {key: 50}
    assert placement.settle(shards) == 0  # a second settle (another coordinator) finds it placed


def _coordinator(log: Any, placement: Placement[str] | None = None) -> GroupCoordinator:
    return GroupCoordinator(log, Topics(), RecordingPersister(), placement=placement)


async def _commit(coord: GroupCoordinator, group: str, offset: int) -> None:
    assert await coord.commit_offsets(group, "", None, -1, [OffsetToCommit("t", 0, offset, -1, None)], 8) == (0, [0])


def _fetch(coord: GroupCoordinator, group: str) -> int | None:
    committed = coord.fetch_offsets(group, None, -1, [("t", [0])])[1][0][2]
    return None if committed is None else committed.offset


async def test_groups_written_under_another_count_load_and_stay_where_they_are(tmp_path: Path) -> None:
    """The data directory of issue 34: group records written with 4 partitions, then one partition more
    and a coordinator placing by 5. Main's GroupsView raised KeyError here."""
    groups = [g for g in ("\U0001f475", "a", "b", "c", "d", "e", "gr\u00fcn") if
              coordinator_partition(g, 4) != coordinator_partition(g, 5)]
    assert len(groups) >= 3
    log = open_log(tmp_path, partitions=4)
    coord = _coordinator(log)
    await coord.load()
    for i, group in enumerate(groups):
        await _commit(coord, group, i + 10)
    await coord.stop()
    close_log(log)

    log = open_log(tmp_path, partitions=5)
    placement: Placement[str] = Placement(5)
    coord = _coordinator(log, placement)
    await coord.load()
    assert sorted(coord.classic.groups) == sorted(groups)
    assert [_fetch(coord, g) for g in groups] == [i + 10 for i in range(len(groups))]
    assert placement.misplaced == {g: coordinator_partition(g, 4) for g in groups}
    # Later writes go to the partition the group's records are in, so the next load agrees.
    await _commit(coord, groups[0], 99)
    assert [rec.key.group for _o, rec in log.replay(coordinator_partition(groups[0], 4))][-1] == groups[0]
    assert not list(log.replay(4))
    # A new group goes home.
    fresh = next(g for g in ("n1", "n2", "n3", "n4", "n5", "n6") if coordinator_partition(g, 5) == 4)
    await _commit(coord, fresh, 5)
    assert [rec.key.group for _o, rec in log.replay(4)] == [fresh]
    await coord.stop()

    again = _coordinator(log, Placement(5))
    await again.load()
    assert _fetch(again, groups[0]) == 99 and _fetch(again, fresh) == 5
    assert sorted(again.classic.groups) == sorted([*groups, fresh])
    await again.stop()
    close_log(log)


async def test_transactional_offsets_go_where_the_group_coordinator_keeps_the_group(tmp_path: Path) -> None:
    """AddOffsetsToTxn's partition, TxnOffsetCommit's partition and the group's shard are one answer."""
    group = "\U0001f475"
    placement: Placement[str] = Placement(3)
    placement.settle([{}, {}, {}, {group: None}])  # replay found the group in a fourth partition
    log = open_log(tmp_path, partitions=4)
    groups = _coordinator(log, placement)
    await groups.load()
    coordinator = TransactionCoordinator(log, _NoMarkers(), lambda: 1, max_timeout_ms=1000,
                                         offsets_placement=placement)
    assert coordinator.offsets_partition(group) == ("__consumer_offsets", 3) == (
        "__consumer_offsets", groups.partition_for(group))
    assert await groups.commit_transactional_offsets(group, 7, 0, "", None, -1, [OffsetToCommit("t", 0, 5, -1, "")]) \
        == (0, [0])
    assert groups.runtime.shard(3).offsets.has_pending(group, "t", 0) and groups.has_pending_offset(group, "t", 0)
    await groups.stop()
    close_log(log)


class _NoMarkers:
    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool, partitions: Any,
                            coordinator_epoch: int = 0, transaction_version: int = 0) -> None:
        raise AssertionError("not used")


def test_placement_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError):
        Placement(0)
