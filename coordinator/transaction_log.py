"""`__transaction_state` records in Kafka's TransactionLog format, and the transaction metadata they carry.

key   = int16 key version (0), then TransactionLogKey v0 (the transactional id)
value = int16 value version, then TransactionLogValue; a null value is a tombstone. A transaction of a
        transaction.version 2 client is written at value version 1 (flexible), whose tagged fields carry
        the previous and next producer ids, the next epoch and the client's transaction version (KIP-890);
        the others at version 0, as before.
The coordinator records' framing is the same (the key version plays the record type's part), so these
are `CoordinatorRecord`s of type TRANSACTION_LOG on that topic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

from shoal.protocol import messages
from shoal.protocol.codec import DecodeError
from shoal.protocol.coordinator_records import TRANSACTION_LOG, CoordinatorRecord

_VALUE_VERSION = 0
_FLEXIBLE_VALUE_VERSION = 1


class TxnState(IntEnum):
    """Kafka's TransactionState ids, as stored in TransactionStatus."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use."""
        return "".join(part.capitalize() for part in self.name.split("_"))


STATE_BY_NAME = {s.display_name: s for s in TxnState}


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    start_ms: int = -1
    update_ms: int = -1
    # KIP-890 part 2: a transaction.version 2 client's epoch is bumped by every EndTxn; when the epoch runs
    # out the Prepare record names the producer id the Complete record switches to.
    client_transaction_version: int = 0
    previous_producer_id: int = -1
    next_producer_id: int = -1
    next_producer_epoch: int = -1

    def but(self, **changes: object) -> TxnMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]  # keyword changes are checked by the dataclass at run time


def to_record(meta: TxnMetadata) -> CoordinatorRecord:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    schema = messages.TransactionLogValue.PartitionsSchema
    value = messages.TransactionLogValue(
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        transaction_timeout_ms=meta.timeout_ms,
        transaction_status=int(meta.state),
        transaction_partitions=[schema(topic=t, partition_ids=ps) for t, ps in by_topic.items()],
        transaction_last_update_timestamp_ms=meta.update_ms,
        transaction_start_timestamp_ms=meta.start_ms,
        client_transaction_version=meta.client_transaction_version,
        previous_producer_id=meta.previous_producer_id,
        next_producer_id=meta.next_producer_id,
        next_producer_epoch=meta.next_producer_epoch,
    )
    version = _FLEXIBLE_VALUE_VERSION if meta.client_transaction_version >= 2 else _VALUE_VERSION
    return CoordinatorRecord(TRANSACTION_LOG, messages.TransactionLogKey(transactional_id=meta.transactional_id),
                             value, version)


def tombstone(transactional_id: str) -> CoordinatorRecord:
    """The record that removes a transactional id (Kafka writes one when the id expires)."""
    return CoordinatorRecord(TRANSACTION_LOG, messages.TransactionLogKey(transactional_id=transactional_id), None,
                             _VALUE_VERSION)


def from_record(record: CoordinatorRecord) -> tuple[str, TxnMetadata | None]:
    """(transactional id, metadata or None for a tombstone); DecodeError for a state no Kafka has."""
    transactional_id: str = record.key.transactional_id
    v = record.value
    if v is None:
        return transactional_id, None
    partitions = frozenset((p.topic, i) for p in (v.transaction_partitions or []) for i in p.partition_ids)
    try:
        state = TxnState(v.transaction_status)
    except ValueError as exc:
        raise DecodeError(f"unknown transaction state {v.transaction_status}") from exc
    return transactional_id, TxnMetadata(
        transactional_id=transactional_id,
        producer_id=v.producer_id,
        producer_epoch=v.producer_epoch,
        timeout_ms=v.transaction_timeout_ms,
        state=state,
        partitions=partitions,
        start_ms=v.transaction_start_timestamp_ms,
        update_ms=v.transaction_last_update_timestamp_ms,
        client_transaction_version=v.client_transaction_version,
        previous_producer_id=v.previous_producer_id,
        next_producer_id=v.next_producer_id,
        next_producer_epoch=v.next_producer_epoch,
    )
