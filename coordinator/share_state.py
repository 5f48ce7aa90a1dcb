"""Share-partition state as the share coordinator keeps it, and the records that change it.

Pure logic, no I/O: the coordinator builds records with the functions here, appends them to
`__share_group_state`, and only then feeds them back through `ShareStateMap.replay` — the same path a
restart takes — so memory can never hold anything the log does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from shoal.coordinator.placement import coordinator_partition
from shoal.persister.persister import PersistedStateBatch, SharePartitionKey
from shoal.protocol.coordinator_records import SHARE_SNAPSHOT, SHARE_UPDATE, CoordinatorRecord
from shoal.protocol.message_classes import (
    ShareSnapshotKey,
    ShareSnapshotValue,
    ShareUpdateKey,
    ShareUpdateValue,
)
from shoal.protocol.uuids import uuid_to_str

UNINITIALIZED_START_OFFSET = -1
UNINITIALIZED_DELIVERY_COMPLETE_COUNT = -1

StateBatchT = TypeVar("StateBatchT", ShareSnapshotValue.StateBatch, ShareUpdateValue.StateBatch)


# ---- partitioning --------------------------------------------------------------------------------


def state_key_string(key: SharePartitionKey) -> str:
    """The string Kafka hashes to place a share-partition key: group:topic-id:partition."""
    return f"{key.group_id}:{uuid_to_str(key.topic_id)}:{key.partition}"


def state_partition_for(key: SharePartitionKey, num_partitions: int) -> int:
    """The home `__share_group_state` partition of a key: Utils.abs(hashCode) % n, where abs(MIN_VALUE) is 0."""
    return coordinator_partition(state_key_string(key), num_partitions)


# ---- the batch combiner --------------------------------------------------------------------------

# Delivery states a persisted batch may carry (Kafka's RecordState: AVAILABLE, ACQUIRED, ACKNOWLEDGED,
# ARCHIVING of KIP-1191, ARCHIVED).
_DELIVERY_STATES = frozenset({0, 1, 2, 3, 4})


def state_batches_problem(batches: Iterable[PersistedStateBatch]) -> str | None:
    """Why a write's state batches cannot be combined (the reason for INVALID_REQUEST), or None if they can.

    Overlapping batches are fine (the combiner resolves them); inverted or negative ranges are not.
    """
    for b in batches:
        if b.first_offset < 0 or b.last_offset < b.first_offset:
            return f"State batch [{b.first_offset}, {b.last_offset}] is not a valid offset range."
        if b.delivery_state not in _DELIVERY_STATES:
            return f"State batch [{b.first_offset}, {b.last_offset}] has unknown delivery state {b.delivery_state}."
        if b.delivery_count < 0:
            return f"State batch [{b.first_offset}, {b.last_offset}] has negative delivery count {b.delivery_count}."
    return None



def combine_state_batches(
    so_far: Iterable[PersistedStateBatch], new: Iterable[PersistedStateBatch], start_offset: int
) -> list[PersistedStateBatch]:
    """Merge `new` into `so_far`: drop/trim what lies below `start_offset` (-1 = keep all), and where ranges
    overlap keep the one with the higher delivery count, ties to the higher state id (terminal beats
    AVAILABLE, so a late-arriving stale update cannot resurrect acknowledged records). Adjacent pieces
    with equal state and count come out coalesced, sorted by offset."""
    pruned: list[PersistedStateBatch] = []
    for b in (*so_far, *new):
        if start_offset != -1:
            if b.last_offset < start_offset:
                continue
            if b.first_offset < start_offset:
                b = replace(b, first_offset=start_offset)
        pruned.append(b)
    if len(pruned) <= 1:
        return pruned

    # Sweep over range boundaries; at each point the winner among the covering ranges owns the offsets
    # up to the next boundary. Ends sort before begins so touching ranges meet without a gap.
    events: list[tuple[int, int, tuple[int, int]]] = []
    for b in pruned:
        prio = (b.delivery_count, b.delivery_state)
        events.append((b.first_offset, 1, prio))
        events.append((b.last_offset + 1, 0, prio))
    events.sort(key=lambda e: (e[0], e[1]))

    active: dict[tuple[int, int], int] = {}
    out: list[PersistedStateBatch] = []
    open_from = 0
    winner: tuple[int, int] | None = None
    i = 0
    while i < len(events):
        offset = events[i][0]
        if winner is not None and offset > open_from:
            _append_coalesced(out, open_from, offset - 1, winner)
        while i < len(events) and events[i][0] == offset:
            _, is_begin, prio = events[i]
            i += 1
            if is_begin:
                active[prio] = active.get(prio, 0) + 1
            elif active[prio] == 1:
                del active[prio]
            else:
                active[prio] -= 1
        winner = max(active) if active else None
        open_from = offset
    return out


def _append_coalesced(out: list[PersistedStateBatch], first: int, last: int, prio: tuple[int, int]) -> None:
    count, state = prio
    if out:
        tail = out[-1]
        if tail.last_offset + 1 == first and tail.delivery_state == state and tail.delivery_count == count:
            out[-1] = replace(tail, last_offset=last)
            return
    out.append(PersistedStateBatch(first, last, state, count))


# ---- per-share-partition state -------------------------------------------------------------------


@dataclass(slots=True)
class ShareState:
    """What the coordinator knows about one share partition (group, topic, partition)."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    state_batches: list[PersistedStateBatch]
    create_timestamp: int
    write_timestamp: int
    updates_since_snapshot: int = 0
    # Offset of the latest ShareSnapshot in the state topic; -1 if only updates were seen so far.
    snapshot_offset: int = -1


def _batches_from_record(value: ShareSnapshotValue | ShareUpdateValue) -> list[PersistedStateBatch]:
    return [
        PersistedStateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        for b in value.state_batches
    ]


def _to_record_batches(cls: type[StateBatchT], batches: Iterable[PersistedStateBatch]) -> list[StateBatchT]:
    return [
        cls(first_offset=b.first_offset, last_offset=b.last_offset, delivery_state=b.delivery_state,
            delivery_count=b.delivery_count)
        for b in batches
    ]


def key_of(record: CoordinatorRecord) -> SharePartitionKey:
    return SharePartitionKey(record.key.group_id, record.key.topic_id, record.key.partition)


@dataclass(slots=True)
class ShareStateMap:
    """All share-partition states held by one `__share_group_state` partition, built only by `replay`."""

    states: dict[SharePartitionKey, ShareState] = field(default_factory=dict)
    # Offset just past the last record replayed: the partition's end as far as this map knows.
    next_offset: int = 0
    # share.coordinator.snapshot.update.records.per.snapshot: a snapshot resets a key's update count
    # only once that many updates piled up (the snapshot they triggered), as in Kafka; cold and
    # initialising snapshots leave the count alone.
    updates_per_snapshot: int = 500

    def get(self, key: SharePartitionKey) -> ShareState | None:
        return self.states.get(key)

    def __iter__(self) -> Iterator[tuple[SharePartitionKey, ShareState]]:
        return iter(self.states.items())

    def replay(self, offset: int, record: CoordinatorRecord) -> None:
        """Replay one record read back from (or just appended to) the state topic."""
        self.next_offset = max(self.next_offset, offset + 1)
        if record.record_type == SHARE_SNAPSHOT:
            key = key_of(record)
            if record.value is None:
                self.states.pop(key, None)
                return
            v = record.value
            previous = self.states.get(key)
            updates = 0
            if previous is not None and previous.updates_since_snapshot < self.updates_per_snapshot:
                updates = previous.updates_since_snapshot
            self.states[key] = ShareState(
                snapshot_epoch=v.snapshot_epoch,
                state_epoch=v.state_epoch,
                leader_epoch=v.leader_epoch,
                start_offset=v.start_offset,
                delivery_complete_count=v.delivery_complete_count,
                state_batches=_batches_from_record(v),
                create_timestamp=v.create_timestamp,
                write_timestamp=v.write_timestamp,
                updates_since_snapshot=updates,
                snapshot_offset=offset,
            )
        elif record.record_type == SHARE_UPDATE:
            key = key_of(record)
            v = record.value
            if v is None:  # updates are never tombstoned; a stray one carries nothing to replay
                return
            current = self.states.get(key)
            if current is None:
                # An update whose snapshot is gone (pruned history of a since-deleted key): take it as it is.
                self.states[key] = ShareState(
                    snapshot_epoch=v.snapshot_epoch, state_epoch=0, leader_epoch=v.leader_epoch,
                    start_offset=v.start_offset, delivery_complete_count=v.delivery_complete_count,
                    state_batches=_batches_from_record(v), create_timestamp=0, write_timestamp=0,
                    updates_since_snapshot=1,
                )
                return
            start = current.start_offset if v.start_offset == -1 else v.start_offset
            current.start_offset = start
            if v.leader_epoch != -1:
                current.leader_epoch = v.leader_epoch
            current.delivery_complete_count = v.delivery_complete_count
            current.state_batches = combine_state_batches(current.state_batches, _batches_from_record(v), start)
            current.updates_since_snapshot += 1
        # Other record types do not belong to the share coordinator; ignore them as Kafka does.

    def prunable_offset(self) -> int:
        """Records below this offset are no longer needed to rebuild the live states: every live key's
        latest snapshot (and what follows it) lies at or above it; deleted keys need nothing."""
        live = [s.snapshot_offset for s in self.states.values()]
        if not live:
            return self.next_offset
        if min(live) < 0:
            return 0
        return min(live)


# ---- building records ----------------------------------------------------------------------------


def _snapshot_record(key: SharePartitionKey, s: ShareState) -> CoordinatorRecord:
    value = ShareSnapshotValue(
        snapshot_epoch=s.snapshot_epoch,
        state_epoch=s.state_epoch,
        leader_epoch=s.leader_epoch,
        start_offset=s.start_offset,
        delivery_complete_count=s.delivery_complete_count,
        create_timestamp=s.create_timestamp,
        write_timestamp=s.write_timestamp,
        state_batches=_to_record_batches(ShareSnapshotValue.StateBatch, s.state_batches),
    )
    return CoordinatorRecord(SHARE_SNAPSHOT, _snapshot_key(key), value)


def _snapshot_key(key: SharePartitionKey) -> ShareSnapshotKey:
    return ShareSnapshotKey(group_id=key.group_id, topic_id=key.topic_id, partition=key.partition)


def initialize_record(
    key: SharePartitionKey, current: ShareState | None, state_epoch: int, start_offset: int, now_ms: int
) -> CoordinatorRecord:
    """Initialize is a fresh start: always a full snapshot without batches, snapshot epoch bumped."""
    return _snapshot_record(key, ShareState(
        snapshot_epoch=0 if current is None else current.snapshot_epoch + 1,
        state_epoch=state_epoch,
        # Kafka's in-memory fencing map keeps the highest leader epoch across a re-initialise; writing it
        # into the snapshot keeps that fence intact even once older records are pruned away.
        leader_epoch=0 if current is None else current.leader_epoch,
        start_offset=start_offset,
        # Lag is only meaningful once a start offset is known.
        delivery_complete_count=(
            UNINITIALIZED_DELIVERY_COMPLETE_COUNT if start_offset == UNINITIALIZED_START_OFFSET else 0
        ),
        state_batches=[],
        create_timestamp=now_ms,
        write_timestamp=now_ms,
    ))


def write_record(
    key: SharePartitionKey,
    current: ShareState,
    *,
    leader_epoch: int,
    start_offset: int,
    delivery_complete_count: int,
    batches: list[PersistedStateBatch],
    updates_per_snapshot: int,
    now_ms: int,
) -> CoordinatorRecord:
    """A write (or a read that raises the leader epoch, with no batches): an update carrying only the
    request's batches, or — once enough updates piled up since the last snapshot — a merged snapshot."""
    # The start offset never regresses; -1 ("unchanged") falls out of the max.
    new_start = max(start_offset, current.start_offset)
    if start_offset == current.start_offset:
        dcc = max(delivery_complete_count, current.delivery_complete_count)
    elif start_offset < current.start_offset:
        dcc = current.delivery_complete_count  # the request describes an older window; keep ours
    else:
        dcc = delivery_complete_count
    if current.updates_since_snapshot >= updates_per_snapshot:
        return _snapshot_record(key, ShareState(
            snapshot_epoch=current.snapshot_epoch + 1,
            state_epoch=current.state_epoch,
            leader_epoch=leader_epoch,
            start_offset=new_start,
            delivery_complete_count=dcc,
            state_batches=combine_state_batches(current.state_batches, batches, new_start),
            create_timestamp=now_ms,
            write_timestamp=now_ms,
        ))
    value = ShareUpdateValue(
        snapshot_epoch=current.snapshot_epoch,
        leader_epoch=leader_epoch,
        start_offset=new_start,
        delivery_complete_count=dcc,
        state_batches=_to_record_batches(ShareUpdateValue.StateBatch, combine_state_batches((), batches, new_start)),
    )
    return CoordinatorRecord(
        SHARE_UPDATE, ShareUpdateKey(group_id=key.group_id, topic_id=key.topic_id, partition=key.partition), value
    )


def cold_snapshot_record(key: SharePartitionKey, current: ShareState, now_ms: int) -> CoordinatorRecord:
    """A fresh snapshot of unchanged state, so the partition can be pruned past this key's old records.
    Create timestamp is kept, so create != write marks "last snapshot was a cold one"."""
    return _snapshot_record(key, replace(
        current, snapshot_epoch=current.snapshot_epoch + 1, write_timestamp=now_ms, state_batches=list(current.state_batches)
    ))


def tombstone_record(key: SharePartitionKey) -> CoordinatorRecord:
    return CoordinatorRecord(SHARE_SNAPSHOT, _snapshot_key(key), None)
