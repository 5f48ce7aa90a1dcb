"""Coordinator records: the key/value framing Kafka uses on `__consumer_offsets` and `__share_group_state`.

key   = int16 record type, then the key struct at version 0 (classic, non-flexible encoding)
value = int16 value version, then the value struct (flexible where its spec says so)
A tombstone is the key with a null value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import DecodeError, MessageBase, MessageCodec
from .messages import CODECS

KEY_CODECS: dict[int, MessageCodec] = {}
VALUE_CODECS: dict[int, MessageCodec] = {}
for _codec in CODECS.values():
    if _codec.spec.type == "coordinator-key" and _codec.spec.api_key is not None:
        KEY_CODECS[_codec.spec.api_key] = _codec
    elif _codec.spec.type == "coordinator-value" and _codec.spec.api_key is not None:
        VALUE_CODECS[_codec.spec.api_key] = _codec

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


def key_class(record_type: int) -> Any:
    return KEY_CODECS[record_type].cls


def value_class(record_type: int) -> Any:
    return VALUE_CODECS[record_type].cls


def encode_key(record_type: int, key: MessageBase) -> bytes:
    out = bytearray(record_type.to_bytes(2, "big", signed=True))
    KEY_CODECS[record_type].encode(key, 0, out)
    return bytes(out)


def encode_value(record_type: int, value: MessageBase, version: int = 0) -> bytes:
    out = bytearray(version.to_bytes(2, "big", signed=True))
    VALUE_CODECS[record_type].encode(value, version, out)
    return bytes(out)


def encode_record(record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
    key = encode_key(record.record_type, record.key)
    value = None if record.value is None else encode_value(record.record_type, record.value, record.value_version)
    return key, value


def decode_record(key: bytes, value: bytes | None) -> CoordinatorRecord:
    """Decode a record read back from an internal topic; unknown types raise DecodeError."""
    if len(key) < 2:
        raise DecodeError("coordinator record key too short")
    record_type = int.from_bytes(key[0:2], "big", signed=True)
    key_codec = KEY_CODECS.get(record_type)
    if key_codec is None:
        raise DecodeError(f"unknown coordinator record type {record_type}")
    key_obj, _ = key_codec.decode(key, 0, 2)
    if value is None:
        return CoordinatorRecord(record_type, key_obj, None)
    version = int.from_bytes(value[0:2], "big", signed=True)
    value_obj, _ = VALUE_CODECS[record_type].decode(value, version, 2)
    return CoordinatorRecord(record_type, key_obj, value_obj, version)
