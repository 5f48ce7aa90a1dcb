"""The leader-epoch rule for share partitions whose leadership moves (several sidecars): every load takes an
epoch above the stored one, and the share coordinator then refuses the earlier leader's writes. Over real
parts: a partition log and the share coordinator on disk, the default persister between them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share.share_partition import AckBatch
from shoal.broker.share.share_partition_leader import LEADER_EPOCH, SharePartitionLeader, next_leader_epoch
from shoal.broker.storage.partition_source import LocalPartitionSource
from shoal.protocol.errors import ErrorCode

from .test_share_partition_leader import ACCEPT, KEY, Parts, acquire, close_parts, open_parts

INT32_MAX = 2**31 - 1


@given(st.integers(min_value=-1, max_value=INT32_MAX - 1))
def test_the_next_epoch_is_above_the_stored_one(stored: int) -> None:
    nxt = next_leader_epoch(stored)
    assert nxt is not None and nxt > stored and 0 <= nxt <= INT32_MAX


@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=30))
def test_epochs_taken_load_after_load_only_grow(gaps: list[int]) -> None:
    # Whatever else raised the stored epoch between two loads, each load takes one above it.
    stored, taken = 0, []
    for gap in gaps:
        stored += gap
        epoch = next_leader_epoch(stored)
        assert epoch is not None
        taken.append(epoch)
        stored = epoch
    assert taken == sorted(set(taken))


def test_a_spent_epoch_gives_none() -> None:
    assert next_leader_epoch(INT32_MAX) is None


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    opened = await open_parts(tmp_path, [[f"v{i}".encode() for i in range(5)]])
    opened.leader.bump_leader_epoch = True
    yield opened
    close_parts(opened)


def second_leader(parts: Parts) -> SharePartitionLeader:
    first = parts.leader
    return SharePartitionLeader(KEY, LocalPartitionSource(parts.plog), first.persister, first.group_configs,
                                first.purgatory, bump_leader_epoch=True)


async def stored_leader_epoch(parts: Parts) -> int:
    summary = await parts.leader.persister.read_state_summary(KEY, LEADER_EPOCH)
    assert summary.error_code == ErrorCode.NONE
    return summary.leader_epoch


async def test_a_new_leader_fences_the_earlier_ones_acknowledgement(parts: Parts) -> None:
    old = parts.leader
    assert await acquire(old, "m1") == [(0, 4, 1)]
    before = await stored_leader_epoch(parts)
    assert old.leader_epoch == before

    new = second_leader(parts)
    # The new leader's read records its higher epoch; the records the old one holds are not persisted as
    # acquired, so the new leader may hand them out.
    assert await acquire(new, "m2") == [(0, 4, 1)]
    assert new.leader_epoch == before + 1 == await stored_leader_epoch(parts)

    # The old leader's ACCEPT is refused, not confirmed, and it drops the partition.
    assert await old.acknowledge("m1", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert old.state is None
    # Nothing of it reached the state: the new leader's ACCEPT is the one that counts.
    assert await new.acknowledge("m2", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NONE
    state = await old.persister.read_state(KEY, new.leader_epoch)
    assert state.error_code == ErrorCode.NONE and state.start_offset == 5


async def test_a_reload_takes_a_higher_epoch_and_fences_the_leader_it_replaced(parts: Parts) -> None:
    old = parts.leader
    assert await acquire(old, "m1") == [(0, 4, 1)]
    new = second_leader(parts)
    assert await acquire(new, "m2") == [(0, 4, 1)]
    assert await old.acknowledge("m1", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # Ownership came back to the first instance: its load goes above the second's epoch (acquisitions are
    # not persisted, so the records are handed out as on a first delivery).
    assert await acquire(old, "m1") == [(0, 4, 1)]
    assert old.leader_epoch == new.leader_epoch + 1
    assert await new.acknowledge("m2", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert await old.acknowledge("m1", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NONE


async def test_a_leader_that_cannot_move_keeps_the_fixed_epoch(parts: Parts) -> None:
    leader = parts.leader
    leader.bump_leader_epoch = False
    for _ in range(2):
        assert await acquire(leader, "m1") == [(0, 4, 1)]
        assert leader.leader_epoch == LEADER_EPOCH
        leader.drop()
    assert await stored_leader_epoch(parts) == LEADER_EPOCH
