"""Coordinator records: the key/value framing Kafka uses on its internal topics (`__consumer_offsets`,
`__share_group_state`, `__transaction_state`).

key   = int16 record type, then the key struct at version 0 (classic, non-flexible encoding)
value = int16 value version, then the value struct (flexible where its spec says so)
A tombstone is the key with a null value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import DecodeError, MessageCodec
from .messages import CODECS

CONSUMER_OFFSETS = "__consumer_offsets"
SHARE_GROUP_STATE = "__share_group_state"
TRANSACTION_STATE = "__transaction_state"

# Record types are numbered per internal topic (the key spec's apiKey): on `__share_group_state` 0 and 1 are
# share snapshots and updates, on `__consumer_offsets` 0 and 1 are offset commits, 2 group metadata, and 3+
# the newer groups; on `__transaction_state` 0 is the TransactionLog record.
_TOPIC_BY_KEY_SPEC = {"ShareSnapshotKey": SHARE_GROUP_STATE, "ShareUpdateKey": SHARE_GROUP_STATE,
                      "TransactionLogKey": TRANSACTION_STATE}
_TABLES: dict[str, dict[int, tuple[MessageCodec, MessageCodec]]] = {
    CONSUMER_OFFSETS: {}, SHARE_GROUP_STATE: {}, TRANSACTION_STATE: {}}
_BY_KEY_CLASS: dict[type, tuple[MessageCodec, MessageCodec]] = {}
for _codec in CODECS.values():
    if _codec.spec.type == "coordinator-key" and _codec.spec.api_key is not None:
        _pair = (_codec, CODECS[_codec.spec.name.removesuffix("Key") + "Value"])
        _BY_KEY_CLASS[_codec.cls] = _pair
        _TABLES[_TOPIC_BY_KEY_SPEC.get(_codec.spec.name, CONSUMER_OFFSETS)][_codec.spec.api_key] = _pair
_TABLES[CONSUMER_OFFSETS][0] = _TABLES[CONSUMER_OFFSETS][1]  # Kafka's offset-commit key has versions 0 and 1

# Record types by name (the specs' apiKey).
SHARE_SNAPSHOT = 0
SHARE_UPDATE = 1
OFFSET_COMMIT = 1
GROUP_METADATA = 2
SHARE_GROUP_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
SHARE_GROUP_STATE_PARTITION_METADATA = 15
TRANSACTION_LOG = 0


# Record keys use the classic encoding: their strings (group ids, member ids) carry an int16 length.
MAX_KEY_STRING_BYTES = 0x7FFF


def fits_key_string(text: str) -> bool:
    """Whether `text` can be written in a coordinator record key."""
    return len(text) <= MAX_KEY_STRING_BYTES // 3 or len(text.encode("utf-8")) <= MAX_KEY_STRING_BYTES


@dataclass(slots=True)
class CoordinatorRecord:
    record_type: int
    # The key and value classes of `record_type`; Any because replay reads them by record type.
    key: Any
    value: Any | None  # None = tombstone
    value_version: int = 0


def _codecs(record_type: int, topic: str) -> tuple[MessageCodec, MessageCodec]:
    found = _TABLES[topic].get(record_type)
    if found is None:
        raise DecodeError(f"unknown coordinator record type {record_type} on {topic}")
    return found


def key_class(record_type: int, *, topic: str = CONSUMER_OFFSETS) -> Any:
    return _codecs(record_type, topic)[0].cls


def value_class(record_type: int, *, topic: str = CONSUMER_OFFSETS) -> Any:
    return _codecs(record_type, topic)[1].cls


def encode_record(record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
    key_codec, value_codec = _BY_KEY_CLASS[type(record.key)]
    key = bytearray(record.record_type.to_bytes(2, "big", signed=True))
    key_codec.encode(record.key, 0, key)
    if record.value is None:
        return bytes(key), None
    value = bytearray(record.value_version.to_bytes(2, "big", signed=True))
    value_codec.encode(record.value, record.value_version, value)
    return bytes(key), bytes(value)


def decode_record(key: bytes, value: bytes | None, *, topic: str) -> CoordinatorRecord:
    """Decode a record read back from an internal topic; unknown types raise DecodeError."""
    if len(key) < 2:
        raise DecodeError("coordinator record key too short")
    record_type = int.from_bytes(key[0:2], "big", signed=True)
    key_codec, value_codec = _codecs(record_type, topic)
    key_obj, _ = key_codec.decode(key, 0, 2)
    if value is None:
        return CoordinatorRecord(record_type, key_obj, None)
    version = int.from_bytes(value[0:2], "big", signed=True)
    value_obj, _ = value_codec.decode(value, version, 2)
    return CoordinatorRecord(record_type, key_obj, value_obj, version)


NO_PRODUCER_ID = -1


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """A coordinator record at its offset; `producer_id` is set when it was written in a transaction."""

    offset: int
    record: CoordinatorRecord
    producer_id: int = NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class EndTransactionMarker:
    """A COMMIT or ABORT control record of a producer's transaction."""

    offset: int
    producer_id: int
    commit: bool
