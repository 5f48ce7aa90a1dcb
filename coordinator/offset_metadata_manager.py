"""Committed offsets of every group on one `__consumer_offsets` partition, as Kafka's OffsetMetadataManager.

Offsets belong to the group id, not to a group object: a classic group, a KIP-848 consumer group, or no
group at all (assign() + commit) may hold them, and they stay when a group changes type. The state
changes only by replay, on load and after each durable append:

- an OffsetCommit record outside a transaction is the committed offset at once;
- one in a transactional batch (TxnOffsetCommit) is pending under its producer id until that producer's
  end-transaction marker is replayed: COMMIT makes it committed, unless a later record (by log offset)
  already committed that partition; ABORT drops it;
- a tombstone removes the committed offset and the pending ones of the same partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shoal.protocol import coordinator_records as cr
from shoal.protocol.coordinator_records import NO_PRODUCER_ID, CoordinatorRecord

# Kafka's offset-commit key has versions 0 (legacy) and 1; both are offset commits.
OFFSET_COMMIT_TYPES = frozenset({0, cr.OFFSET_COMMIT})
OFFSET_COMMIT_VALUE_VERSION = 3  # with leaderEpoch, as Kafka 4.x writes

_OffsetKey = cr.key_class(cr.OFFSET_COMMIT)
_OffsetValue = cr.value_class(cr.OFFSET_COMMIT)

TopicPartitionKey = tuple[str, int]


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    # Where the record sits in the log: of a transactional and a regular commit the later record wins.
    record_offset: int = -1
    expire_timestamp: int = -1  # set only by v1 records (OffsetCommit v1 with a retention time)


def offset_commit_record(group_id: str, topic: str, partition: int, committed: CommittedOffset) -> CoordinatorRecord:
    key = _OffsetKey(group=group_id, topic=topic, partition=partition)
    value = _OffsetValue(offset=committed.offset, leader_epoch=committed.leader_epoch, metadata=committed.metadata,
                         commit_timestamp=committed.commit_timestamp, expire_timestamp=-1)
    return CoordinatorRecord(cr.OFFSET_COMMIT, key, value, OFFSET_COMMIT_VALUE_VERSION)


def offset_tombstone(group_id: str, topic: str, partition: int) -> CoordinatorRecord:
    return CoordinatorRecord(cr.OFFSET_COMMIT, _OffsetKey(group=group_id, topic=topic, partition=partition), None)


class OffsetMetadataManager:
    """The committed and pending offsets of the groups on one partition (pure state, replayed)."""

    __slots__ = ("_offsets", "_pending", "_open_by_group")

    def __init__(self) -> None:
        self._offsets: dict[str, dict[TopicPartitionKey, CommittedOffset]] = {}
        # producer id -> group -> offsets its open transaction wrote
        self._pending: dict[int, dict[str, dict[TopicPartitionKey, CommittedOffset]]] = {}
        self._open_by_group: dict[str, set[int]] = {}

    # ---- views ---------------------------------------------------------------------------------------

    def offsets(self, group_id: str) -> Mapping[TopicPartitionKey, CommittedOffset]:
        return self._offsets.get(group_id, {})

    def has_offsets(self, group_id: str) -> bool:
        return bool(self._offsets.get(group_id))

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """Whether an open transaction holds an offset for this partition (OffsetFetch with RequireStable
        answers UNSTABLE_OFFSET_COMMIT then)."""
        return any((topic, partition) in self._pending.get(pid, {}).get(group_id, {})
                   for pid in self._open_by_group.get(group_id, ()))

    def has_open_transactions(self, group_id: str) -> bool:
        return bool(self._open_by_group.get(group_id))

    def group_ids(self) -> list[str]:
        return list(self._offsets)

    def groups_with_topics(self, topics: Iterable[str]) -> dict[str, list[TopicPartitionKey]]:
        """Committed and pending partitions of the given topics, per group (what topic deletion removes,
        as Kafka's onPartitionsDeleted)."""
        wanted = set(topics)
        found: dict[str, set[TopicPartitionKey]] = {}
        sources = [self._offsets, *self._pending.values()]
        for by_group in sources:
            for group_id, offsets in by_group.items():
                hit = {tp for tp in offsets if tp[0] in wanted}
                if hit:
                    found.setdefault(group_id, set()).update(hit)
        return {gid: sorted(tps) for gid, tps in found.items()}

    # ---- planning -------------------------------------------------------------------------------------

    def delete_group_records(self, group_id: str) -> list[CoordinatorRecord]:
        """Tombstones for every committed offset of the group (DeleteGroups writes them first)."""
        return [offset_tombstone(group_id, t, p) for t, p in sorted(self._offsets.get(group_id, {}))]

    def expired(self, group_id: str, now_ms: int, retention_ms: int, subscribed: set[str],
                base_timestamp_ms: int | None = None) -> list[TopicPartitionKey]:
        """Offsets past their retention, as Kafka's cleanupExpiredOffsets: never of a topic the group
        subscribes to nor while a transaction holds one; the retention runs from the commit, or from
        `base_timestamp_ms` (when an empty classic group became empty)."""
        out = []
        for (topic, partition), c in sorted(self._offsets.get(group_id, {}).items()):
            if topic in subscribed or self.has_pending(group_id, topic, partition):
                continue
            base = c.commit_timestamp if base_timestamp_ms is None else base_timestamp_ms
            deadline = c.expire_timestamp if c.expire_timestamp >= 0 else base + retention_ms
            if now_ms >= deadline:
                out.append((topic, partition))
        return out

    # ---- replay -----------------------------------------------------------------------------------------

    def replay(self, offset: int, producer_id: int, record: CoordinatorRecord) -> None:
        key, value = record.key, record.value
        group_id, where = str(key.group), (str(key.topic), int(key.partition))
        if value is None:
            offsets = self._offsets.get(group_id)
            if offsets is not None:
                offsets.pop(where, None)
                if not offsets:
                    del self._offsets[group_id]
            for pid in self._open_by_group.get(group_id, ()):
                self._pending.get(pid, {}).get(group_id, {}).pop(where, None)
            return
        committed = CommittedOffset(value.offset, value.leader_epoch, value.metadata or "", value.commit_timestamp,
                                    offset, getattr(value, "expire_timestamp", -1))
        if producer_id == NO_PRODUCER_ID:
            self._offsets.setdefault(group_id, {})[where] = committed
        else:
            self._pending.setdefault(producer_id, {}).setdefault(group_id, {})[where] = committed
            self._open_by_group.setdefault(group_id, set()).add(producer_id)

    def replay_end_transaction(self, producer_id: int, commit: bool) -> list[str]:
        """Completes the producer's transaction; returns the groups whose offsets it committed."""
        pending = self._pending.pop(producer_id, None)
        if pending is None:
            return []
        for group_id, offsets in pending.items():
            open_ids = self._open_by_group.get(group_id)
            if open_ids is not None:
                open_ids.discard(producer_id)
                if not open_ids:
                    del self._open_by_group[group_id]
            if not commit:
                continue
            committed = self._offsets.setdefault(group_id, {})
            for where, c in offsets.items():
                existing = committed.get(where)
                if existing is None or c.record_offset > existing.record_offset:
                    committed[where] = c
            if not committed:
                del self._offsets[group_id]
        return sorted(pending) if commit else []
