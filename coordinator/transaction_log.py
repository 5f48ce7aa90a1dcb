"""`__transaction_state` records in Kafka's TransactionLog format, and the transaction metadata they carry.

key   = int16 key version (0), then TransactionLogKey v0 (the transactional id)
value = int16 value version (0), then TransactionLogValue v0; a null value is a tombstone
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

from shoal.protocol import messages
from shoal.protocol.codec import DecodeError

_KEY = messages.CODECS["TransactionLogKey"]
_VALUE = messages.CODECS["TransactionLogValue"]
_VALUE_VERSION = 0


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

    def but(self, **changes: object) -> TxnMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]  # keyword changes are checked by the dataclass at run time


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(b"\x00\x00")
    _KEY.encode(_KEY.cls(transactional_id=transactional_id), 0, out)
    return bytes(out)


def encode_value(meta: TxnMetadata) -> bytes:
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
    )
    out = bytearray(_VALUE_VERSION.to_bytes(2, "big"))
    _VALUE.encode(value, _VALUE_VERSION, out)
    return bytes(out)


def decode(key: bytes, value: bytes | None) -> tuple[str, TxnMetadata | None]:
    """(transactional id, metadata or None for a tombstone); DecodeError for bytes of another format."""
    if len(key) < 2 or int.from_bytes(key[:2], "big", signed=True) != 0:
        raise DecodeError("not a transaction log key")
    k, _ = _KEY.decode(key, 0, 2)
    if value is None:
        return k.transactional_id, None
    version = int.from_bytes(value[:2], "big", signed=True)
    if version not in (0, 1):
        raise DecodeError(f"unknown transaction log value version {version}")
    v, _ = _VALUE.decode(value, version, 2)
    partitions = frozenset((p.topic, i) for p in (v.transaction_partitions or []) for i in p.partition_ids)
    try:
        state = TxnState(v.transaction_status)
    except ValueError as exc:
        raise DecodeError(f"unknown transaction state {v.transaction_status}") from exc
    return k.transactional_id, TxnMetadata(
        transactional_id=k.transactional_id,
        producer_id=v.producer_id,
        producer_epoch=v.producer_epoch,
        timeout_ms=v.transaction_timeout_ms,
        state=state,
        partitions=partitions,
        start_ms=v.transaction_start_timestamp_ms,
        update_ms=v.transaction_last_update_timestamp_ms,
    )
