"""Transactional offset commits (TxnOffsetCommit), as Kafka's group coordinator keeps them.

The offsets are written at once to `__consumer_offsets` as OffsetCommit records in a transactional batch
of the producer, so they are durable but pending; the transaction's COMMIT marker on that partition makes
them the group's committed offsets, an ABORT drops them. Replay of the topic applies the same rule, so a
restart finds committed ones applied and open ones still pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog

from shoal.coordinator.placement import Placement
from shoal.protocol.codec import DecodeError
from shoal.protocol.messages import CODECS

log = structlog.get_logger("shoal.txn_offsets")

# OffsetCommit records in Kafka's __consumer_offsets format: key version 1, value version 3 (with
# leaderEpoch, without the expire timestamp).
_KEY_VERSION = 1
_VALUE_VERSION = 3
_KEY = CODECS["OffsetCommitKey"]
_VALUE = CODECS["OffsetCommitValue"]
RawRecord = tuple[bytes, bytes | None]


class TransactionalRecordLog(Protocol):
    @property
    def num_partitions(self) -> int: ...

    async def append_raw(self, partition: int, records: list[tuple[bytes, bytes | None]], *,
                         producer_id: int = -1, producer_epoch: int = -1) -> int: ...

    def replay_raw(self, partition: int, open_transactions: dict[int, list[tuple[int, bytes, bytes | None]]] | None = None,
                   start: int | None = None) -> Iterator[tuple[int, bytes, bytes | None]]: ...

    def first_unstable_offset(self, partition: int) -> int | None: ...


@dataclass(frozen=True, slots=True)
class TxnOffset:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str


class TxnOffsetStore:
    def __init__(self, record_log: TransactionalRecordLog, on_committed: Callable[[list[RawRecord]], None],
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000), *,
                 placement: Placement[str] | None = None):
        self.log = record_log
        # The group coordinators' placement: the offsets go to the partition whose shard holds the group.
        self.placement = placement or Placement(record_log.num_partitions)
        # Hands offsets made final by a COMMIT marker to the group coordinator's in-memory state.
        self.on_committed = on_committed
        self.wall_ms = wall_ms
        # __consumer_offsets partition -> producer id -> pending OffsetCommit records, and what they are for
        self.pending: dict[int, dict[int, list[RawRecord]]] = {}
        self._pending_keys: dict[int, dict[int, set[tuple[str, str, int]]]] = {}

    def partition_for(self, group_id: str) -> int:
        return self.placement.partition_for(group_id)

    def load(self) -> None:
        """Pending offsets of transactions still open: read from where the oldest of them starts."""
        for partition in range(self.log.num_partitions):
            start = self.log.first_unstable_offset(partition)
            if start is None:
                continue
            open_txns: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
            for _ in self.log.replay_raw(partition, open_txns, start=start):
                pass
            for pid, raw in open_txns.items():
                self._add_pending(partition, pid, [(k, v) for _o, k, v in raw])

    def _add_pending(self, partition: int, producer_id: int, records: list[RawRecord]) -> None:
        keys = self._pending_keys.setdefault(partition, {}).setdefault(producer_id, set())
        kept = self.pending.setdefault(partition, {}).setdefault(producer_id, [])
        for key, value in records:
            if int.from_bytes(key[:2], "big", signed=True) not in (0, 1):
                continue  # only offset commits go into transactions
            try:
                k, _ = _KEY.decode(key, 0, 2)
            except DecodeError:
                log.warning("skipping undecodable transactional offset commit", partition=partition)
                continue
            keys.add((k.group, k.topic, k.partition))
            kept.append((key, value))

    async def commit(self, group_id: str, producer_id: int, producer_epoch: int, offsets: list[TxnOffset]) -> None:
        now = self.wall_ms()
        records: list[RawRecord] = []
        for o in offsets:
            key = bytearray(_KEY_VERSION.to_bytes(2, "big"))
            _KEY.encode(_KEY.cls(group=group_id, topic=o.topic, partition=o.partition), 0, key)
            value = bytearray(_VALUE_VERSION.to_bytes(2, "big"))
            _VALUE.encode(_VALUE.cls(offset=o.offset, leader_epoch=o.leader_epoch, metadata=o.metadata,
                                     commit_timestamp=now), _VALUE_VERSION, value)
            records.append((bytes(key), bytes(value)))
        partition = self.partition_for(group_id)
        await self.log.append_raw(partition, records, producer_id=producer_id, producer_epoch=producer_epoch)
        self._add_pending(partition, producer_id, records)

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """Whether an open transaction holds an offset for this group and partition (OffsetFetch
        with RequireStable answers UNSTABLE_OFFSET_COMMIT then)."""
        wanted = (group_id, topic, partition)
        # Every partition: an open transaction's offsets are wherever they were written.
        return any(wanted in keys for by_producer in self._pending_keys.values() for keys in by_producer.values())

    def on_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker is durable on this partition: its offsets become final or go away."""
        records = self.pending.get(partition, {}).pop(producer_id, [])
        self._pending_keys.get(partition, {}).pop(producer_id, None)
        if commit and records:
            self.on_committed(records)
        log.debug("txn offsets completed", partition=partition, producer_id=producer_id, commit=commit,
                  offsets=len(records))
