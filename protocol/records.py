"""The record level of v2 batches: varints, record encode/decode, and produce-time batch validation.

A record inside a batch is
    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headerCount varint |
    headerCount x (keyLength varint | key utf-8 | valueLength varint | value)
where every varint is zigzag-encoded and a length of -1 means null. Compressed batches wrap the
concatenated records in one codec stream.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from .compression import (
    NONE,
    ZSTD,
    CompressionError,
    compress,
    decompress,
)
from .record_batch import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    DELETE_HORIZON_FLAG,
    HEADER_SIZE,
    LENGTH_POS,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    CorruptRecordBatch,
    InvalidRecordBatch,
    parse_batch_header,
    verify_crc,
)


def _load_compiled_walk() -> Callable[[bytes | memoryview, int, bool], tuple[int, int] | None] | None:
    """The record walk compiled (protocol/_record_walk.c), or None when it was installed without a C compiler."""
    try:
        from ._record_walk import walk
    except ImportError:
        return None
    return walk


_compiled_walk = _load_compiled_walk()


def compiled_walk_loaded() -> bool:
    """Whether produce walks records with the compiled walk (the broker says so when it starts)."""
    return _compiled_walk is not None

LOG_APPEND_TIME = 1
CREATE_TIME = 0

# Control record types (key = int16 version, int16 type).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

# Header fields before the CRC: base offset, length, partition leader epoch, magic, crc.
_PREFIX = struct.Struct(">qiibI")
# Header fields the CRC covers: attributes .. records count.
_TAIL = struct.Struct(">hiqqqhii")
_LENGTH = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">hh")
_TXN_MARKER_VALUE = struct.Struct(">hi")
_NULL_LENGTH = b"\x01"  # zigzag(-1)
_ZERO = b"\x00"


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class InvalidRecord(CorruptRecordBatch):
    """A CRC-valid batch that Kafka's log validator refuses with INVALID_RECORD (87).

    It subclasses CorruptRecordBatch so callers that only know CORRUPT_MESSAGE still reject it, but
    INVALID_RECORD is the better answer: producers treat CORRUPT_MESSAGE as retriable.

    `keyless` lists the records (their index in the batch) a compacted topic refuses for want of a key:
    Kafka answers those as the Produce response's RecordErrors, so a client fails only those records with
    INVALID_RECORD and the rest of the batch as collateral, to be sent again.
    """

    def __init__(self, message: str, keyless: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.keyless = keyless


class _KeylessRecords(InvalidRecordBatch):
    """Raised by the record walk once every record was read, naming each keyless one."""

    def __init__(self, indexes: list[int]) -> None:
        super().__init__(KEYLESS_RECORD_MESSAGE)
        self.indexes = tuple(indexes)


KEYLESS_RECORD_MESSAGE = "Compacted topic cannot accept message without key"


class InvalidTimestamp(InvalidRecord):
    """A CreateTime record outside the broker's accepted timestamp window (INVALID_TIMESTAMP, 32)."""


@dataclass(slots=True)
class Header:
    key: str
    value: bytes | None


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class RecordInput(NamedTuple):
    """A record to write; `timestamp=None` means "now" (CreateTime as the producer would set it)."""

    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[Header | tuple[str, bytes | None]] = ()
    timestamp: int | None = None


# ---------------------------------------------------------------------------------------------
# Varints. Kafka's "varint"/"varlong" are zigzag-encoded base-128; the unsigned form is used by
# flexible protocol versions. Encodings of values below 2**14 (one or two bytes) come from a table
# because record lengths, deltas and key/value sizes nearly always fall there.

_UVARINT_TABLE: list[bytes] = [bytes([u]) for u in range(0x80)] + [
    bytes([(u & 0x7F) | 0x80, u >> 7]) for u in range(0x80, 1 << 14)
]


def _uvarint_bytes(u: int) -> bytes:
    if u < 0:
        raise ValueError(f"varint out of range: {u}")
    if u < 1 << 14:
        return _UVARINT_TABLE[u]
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _zz(value: int) -> bytes:
    """Zigzag varlong bytes for `value` (int64 range)."""
    u = (value << 1) ^ (value >> 63)
    if 0 <= u < 1 << 14:
        return _UVARINT_TABLE[u]
    if value < -(1 << 63) or value >= 1 << 63:
        raise ValueError(f"varlong out of range: {value}")
    return _uvarint_bytes(u)


def write_uvarint(out: bytearray, value: int) -> None:
    out += _uvarint_bytes(value)


def write_varint(out: bytearray, value: int) -> None:
    """Append a zigzag varint (int32 range)."""
    if value < -(1 << 31) or value >= 1 << 31:
        raise ValueError(f"varint out of range: {value}")
    out += _uvarint_bytes((value << 1) ^ (value >> 31))


def write_varlong(out: bytearray, value: int) -> None:
    """Append a zigzag varlong (int64 range)."""
    out += _zz(value)


def varint_size(value: int) -> int:
    """Bytes a zigzag varint/varlong of `value` takes."""
    u = (value << 1) ^ (value >> 63)
    size = 1
    while u >= 0x80:
        u >>= 7
        size += 1
    return size


def _read_uvarint_n(buf: bytes | bytearray | memoryview, pos: int, max_bytes: int) -> tuple[int, int]:
    result = 0
    shift = 0
    limit = pos + max_bytes
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if pos >= limit:
                raise InvalidRecordBatch(f"varint longer than {max_bytes} bytes")
    except IndexError:
        raise InvalidRecordBatch("truncated varint") from None


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read an unsigned varint (up to 5 bytes); return (value, position after it)."""
    # One byte is by far the common case (lengths in flexible messages, small record fields).
    try:
        b = buf[pos]
    except IndexError:
        raise InvalidRecordBatch("truncated varint") from None
    if b < 0x80:
        return b, pos + 1
    return _read_uvarint_n(buf, pos, 5)


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read a zigzag varint (up to 5 bytes); return (value, position after it)."""
    u, pos = _read_uvarint_n(buf, pos, 5)
    return (u >> 1) ^ -(u & 1), pos


def read_varlong(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read a zigzag varlong (up to 10 bytes); return (value, position after it)."""
    u, pos = _read_uvarint_n(buf, pos, 10)
    return (u >> 1) ^ -(u & 1), pos


# ---------------------------------------------------------------------------------------------
# Encoding


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _encode_records(
    records: Sequence[RecordInput | Record], timestamps: Sequence[int], base_timestamp: int,
    deltas: Iterable[int],
) -> bytes:
    """The uncompressed records section: each record at its offset delta, timestamps relative to the base."""
    table = _UVARINT_TABLE
    zz = _zz
    parts: list[bytes] = []
    append = parts.append
    for rec, ts, delta in zip(records, timestamps, deltas, strict=True):
        key = rec.key
        value = rec.value
        body = [
            _ZERO,
            zz(ts - base_timestamp),
            table[delta << 1] if delta < 8192 else zz(delta),
        ]
        if key is None:
            body.append(_NULL_LENGTH)
        else:
            body.append(zz(len(key)))
            body.append(key)
        if value is None:
            body.append(_NULL_LENGTH)
        else:
            body.append(zz(len(value)))
            body.append(value)
        headers = rec.headers
        if headers:
            body.append(zz(len(headers)))
            for header in headers:
                if isinstance(header, Header):
                    hkey, hvalue = header.key, header.value
                else:
                    hkey, hvalue = header
                raw_key = hkey.encode("utf-8", "surrogateescape")
                body.append(zz(len(raw_key)))
                body.append(raw_key)
                if hvalue is None:
                    body.append(_NULL_LENGTH)
                else:
                    body.append(zz(len(hvalue)))
                    body.append(hvalue)
        else:
            body.append(_ZERO)
        blob = b"".join(body)
        append(zz(len(blob)))
        append(blob)
    return b"".join(parts)


def encode_batch(
    records: Sequence[RecordInput | Record],
    *,
    base_offset: int = 0,
    compression: int = NONE,
    base_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    timestamp_type: int = CREATE_TIME,
    is_control: bool = False,
) -> bytes:
    """Build one v2 batch holding `records` at offset deltas 0..n-1, with its CRC32C filled in."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    now: int | None = None
    timestamps: list[int] = []
    for rec in records:
        ts = rec.timestamp
        if ts is None:
            if now is None:
                now = _now_ms()
            ts = now
        timestamps.append(ts)
    if base_timestamp is None:
        base_timestamp = timestamps[0]

    raw = _encode_records(records, timestamps, base_timestamp, range(len(records)))
    payload = raw if compression == NONE else compress(compression, raw)

    attributes = compression
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG
    if is_control:
        attributes |= CONTROL_FLAG
    count = len(records)
    return _assemble(base_offset, partition_leader_epoch, attributes, count - 1, base_timestamp, max(timestamps),
                     producer_id, producer_epoch, base_sequence, count, payload)


def _assemble(
    base_offset: int, partition_leader_epoch: int, attributes: int, last_offset_delta: int, base_timestamp: int,
    max_timestamp: int, producer_id: int, producer_epoch: int, base_sequence: int, count: int, payload: bytes,
) -> bytes:
    tail = _TAIL.pack(attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
                      base_sequence, count) + payload
    # Batch length counts everything after the length field: leader epoch, magic and CRC (9 bytes) + tail.
    prefix = _PREFIX.pack(base_offset, 9 + len(tail), partition_leader_epoch, 2, crc32c.crc32c(tail))
    return prefix + tail


def encode_retained_batch(
    header: BatchHeader, records: Sequence[Record], *, delete_horizon_ms: int | None = None
) -> bytes:
    """Rewrite a batch keeping only `records` (a subsequence of its own), as log compaction does.

    The batch keeps its base offset, last offset delta, producer id/epoch, base sequence, leader epoch,
    codec and flags, so offsets and idempotence state survive. With `delete_horizon_ms` the base
    timestamp holds the delete horizon (DELETE_HORIZON_FLAG set) and record timestamps are re-based on it.
    With no records left an empty batch remains (Kafka keeps one for a producer's last batch).
    """
    attributes = header.attributes
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
    if not records:
        # Kafka's empty header: uncompressed, the original timestamps, no records.
        base_ts = header.base_timestamp if delete_horizon_ms is None else delete_horizon_ms
        return _assemble(header.base_offset, header.partition_leader_epoch, attributes & ~COMPRESSION_MASK,
                         header.last_offset_delta, base_ts, header.max_timestamp, header.producer_id,
                         header.producer_epoch, header.base_sequence, 0, b"")
    timestamps = [rec.timestamp for rec in records]
    if delete_horizon_ms is not None:
        base_ts = delete_horizon_ms
    elif header.attributes & DELETE_HORIZON_FLAG:
        base_ts = header.base_timestamp  # keep the horizon set by an earlier cleaning
    else:
        base_ts = timestamps[0]
    raw = _encode_records(records, timestamps, base_ts, [rec.offset - header.base_offset for rec in records])
    codec = header.compression
    payload = raw if codec == NONE else compress(codec, raw)
    # LogAppendTime batches carry the broker's time in max_timestamp, whatever records remain.
    max_ts = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else max(timestamps)
    return _assemble(header.base_offset, header.partition_leader_epoch, attributes, header.last_offset_delta,
                     base_ts, max_ts, header.producer_id, header.producer_epoch, header.base_sequence,
                     len(records), payload)


def encode_txn_marker(
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    base_offset: int = 0,
    timestamp: int | None = None,
    partition_leader_epoch: int = -1,
) -> bytes:
    """The control batch a transaction coordinator writes to end a transaction on a partition."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _TXN_MARKER_VALUE.pack(0, coordinator_epoch)
    return encode_batch(
        [RecordInput(key, value, (), timestamp)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
    )


def txn_marker_coordinator_epoch(record: Record) -> int:
    """The coordinator epoch an end-transaction marker's value carries (Kafka's EndTransactionMarker)."""
    if record.value is None or len(record.value) < _TXN_MARKER_VALUE.size:
        raise InvalidRecordBatch("transaction marker without a valid value")
    _version, coordinator_epoch = _TXN_MARKER_VALUE.unpack_from(record.value)
    return int(coordinator_epoch)


def control_record_type(record: Record) -> int:
    """CONTROL_ABORT / CONTROL_COMMIT (or another type id) from a control record's key."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise InvalidRecordBatch("control record without a valid key")
    _version, record_type = _CONTROL_KEY.unpack_from(record.key)
    return int(record_type)


# ---------------------------------------------------------------------------------------------
# Decoding


def _read_zz_slow(data: bytes, pos: int) -> tuple[int, int]:
    """Multi-byte zigzag varlong; the single-byte case is inlined by callers."""
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise InvalidRecordBatch("varlong longer than 10 bytes")


def _parse_records(
    data: bytes, count: int, base_offset: int, base_timestamp: int, fixed_timestamp: int | None
) -> list[Record]:
    """Decode `count` records that must exactly fill `data`."""
    records: list[Record] = []
    append = records.append
    slow = _read_zz_slow
    end = len(data)
    pos = 0
    try:
        for _ in range(count):
            # Varint reads are inlined: one byte always, two bytes for fields that often need them
            # (lengths, timestamp delta); longer ones fall back to `slow`.
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = slow(data, pos)
            record_end = pos + length
            if length <= 0 or record_end > end:
                raise InvalidRecordBatch(f"record length {length} does not fit the batch")
            pos += 1  # attributes: unused in v2 records

            b = data[pos]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                timestamp_delta, pos = slow(data, pos)

            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:  # batches of more than 64 records
                b = (b & 0x7F) | (data[pos + 1] << 7)
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                offset_delta, pos = slow(data, pos)

            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                size = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                size, pos = slow(data, pos)
            if size >= 0:
                key: bytes | None = data[pos : pos + size]
                pos += size
            elif size == -1:
                key = None
            else:
                raise InvalidRecordBatch(f"invalid key length {size}")

            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                size = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                size, pos = slow(data, pos)
            if size >= 0:
                value: bytes | None = data[pos : pos + size]
                pos += size
            elif size == -1:
                value = None
            else:
                raise InvalidRecordBatch(f"invalid value length {size}")

            b = data[pos]
            if b < 0x80:
                header_count = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                header_count, pos = slow(data, pos)
            headers: list[Header] = []
            if header_count:
                if header_count < 0 or header_count > record_end - pos:
                    raise InvalidRecordBatch(f"invalid header count {header_count}")
                for _ in range(header_count):
                    b = data[pos]
                    if b < 0x80:
                        size = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        size, pos = slow(data, pos)
                    if size < 0:
                        raise InvalidRecordBatch(f"invalid header key length {size}")
                    hkey = data[pos : pos + size].decode("utf-8", "surrogateescape")
                    pos += size
                    b = data[pos]
                    if b < 0x80:
                        size = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        size, pos = slow(data, pos)
                    if size >= 0:
                        hvalue: bytes | None = data[pos : pos + size]
                        pos += size
                    elif size == -1:
                        hvalue = None
                    else:
                        raise InvalidRecordBatch(f"invalid header value length {size}")
                    headers.append(Header(hkey, hvalue))

            if pos != record_end:
                raise InvalidRecordBatch(f"record ends at {pos}, its length says {record_end}")
            timestamp = base_timestamp + timestamp_delta if fixed_timestamp is None else fixed_timestamp
            append(Record(base_offset + offset_delta, timestamp, key, value, headers))
    except IndexError:
        raise InvalidRecordBatch("truncated record") from None
    if pos != end:
        raise InvalidRecordBatch(f"{end - pos} bytes left after the last of {count} records")
    return records


def decode_records(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> list[Record]:
    """Records of the batch at `pos` whose header was already parsed (no CRC check here)."""
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    codec = header.compression
    if codec == NONE:
        data = bytes(body)
    else:
        try:
            data = decompress(codec, body)
        except CompressionError as exc:
            raise InvalidRecordBatch(f"batch at byte {pos}: {exc}") from exc
    # LogAppendTime batches carry the broker's time in max_timestamp; record deltas are ignored.
    fixed = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    return _parse_records(data, header.records_count, header.base_offset, header.base_timestamp, fixed)


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True
) -> tuple[BatchHeader, list[Record]]:
    """Parse the batch at `pos` and all its records (decompressing as needed)."""
    header = parse_batch_header(buf, pos)
    if check_crc:
        verify_crc(buf, pos, header)
    return header, decode_records(buf, pos, header)


def iter_complete_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[BatchHeader, int]]:
    """(header, byte position) of each whole batch of a fetch payload, without checking CRCs; a truncated
    trailing batch (a fetch cut at its byte limit) ends the iteration, as consumers do."""
    pos = 0
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        (length,) = _LENGTH.unpack_from(buf, pos + LENGTH_POS)
        if pos + LOG_OVERHEAD + length > end:
            return
        header = parse_batch_header(buf, pos)
        yield header, pos
        pos += header.size


def iter_decoded_batches(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True, allow_partial: bool = False
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Decode each batch of a log segment or fetch payload in order.

    With `allow_partial`, a truncated trailing batch (a fetch cut at its byte limit) ends the
    iteration instead of raising, as consumers do.
    """
    if allow_partial:
        for header, pos in iter_complete_batches(buf):
            if check_crc:
                verify_crc(buf, pos, header)
            yield header, decode_records(buf, pos, header)
        return
    pos = 0
    end = len(buf)
    while pos < end:
        header, records = decode_batch(buf, pos, check_crc=check_crc)
        yield header, records
        pos += header.size


def decode_batches(
    buf: bytes | bytearray | memoryview,
    *,
    include_control: bool = False,
    check_crc: bool = True,
    allow_partial: bool = False,
) -> list[Record]:
    """All records of a fetch payload, in offset order; control batches' records only on request."""
    out: list[Record] = []
    for header, records in iter_decoded_batches(buf, check_crc=check_crc, allow_partial=allow_partial):
        if include_control or not header.is_control:
            out.extend(records)
    return out


# ---------------------------------------------------------------------------------------------
# Produce-time validation


def validate_batch_for_append(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    check_records: bool = True,
    timestamp_bounds: TimestampBounds | None = None,
    require_keys: bool = False,
    from_client: bool = True,
) -> None:
    """The per-batch checks Kafka's log validator makes on a client's produce before appending it.

    Raises CorruptRecordBatch (CORRUPT_MESSAGE) for a bad CRC, an unknown codec or a payload that
    does not decompress; its subclass InvalidRecord (INVALID_RECORD) for the validator's refusals
    (counts, offsets, record framing: lengths, header counts); InvalidTimestamp (INVALID_TIMESTAMP)
    for a CreateTime record outside `timestamp_bounds`. `require_keys` (a compacted topic) refuses a
    record without a key with INVALID_RECORD. Every record is walked, as Kafka does: a
    batch whose CRC is right but whose records cannot be read must never reach the log, where
    consumers and coordinators replaying it would fail on it. `from_client=False` (the broker's own
    writers: coordinators, transaction markers) drops the checks Kafka makes only of clients: a zero base
    offset, no control batch, a sequence with every producer id.
    """
    verify_crc(buf, pos, header)
    if header.compression > ZSTD:
        raise CorruptRecordBatch(f"unknown compression codec {header.compression} in batch at byte {pos}")
    if from_client and header.base_offset != 0:
        raise InvalidRecord(f"the base offset of a produced batch must be 0, not {header.base_offset}")
    if header.records_count <= 0:
        raise InvalidRecord(f"invalid record count {header.records_count}")
    if header.last_offset_delta + 1 != header.records_count:
        raise InvalidRecord(
            f"last offset delta {header.last_offset_delta} disagrees with record count {header.records_count}"
        )
    if from_client and header.is_control:
        raise InvalidRecord("clients may not write control batches")
    if from_client and header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecord(f"invalid base sequence {header.base_sequence} for producer {header.producer_id}")
    if not check_records:
        return
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    data: bytes | memoryview
    if header.compression != NONE:
        try:
            data = decompress(header.compression, body)
        except CompressionError as exc:
            raise CorruptRecordBatch(f"batch at byte {pos} does not decompress: {exc}") from exc
    else:
        data = body
    deltas = _compiled_walk(data, header.records_count, require_keys) if _compiled_walk is not None else None
    if deltas is None:
        # No compiled walk, or it found a fault: the Python walk decides and words the error.
        try:
            deltas = _walk_records(bytes(data), header.records_count, require_keys=require_keys)
        except _KeylessRecords as exc:
            raise InvalidRecord(str(exc), exc.indexes) from exc
        except InvalidRecordBatch as exc:
            raise InvalidRecord(str(exc)) from exc
    min_delta, max_delta = deltas
    if timestamp_bounds is not None and not header.attributes & TIMESTAMP_TYPE_MASK:
        # Every record's timestamp lies between these two, so checking them checks all.
        timestamp_bounds.check(header.base_timestamp + min_delta)
        timestamp_bounds.check(header.base_timestamp + max_delta)


def _read_zz(data: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varlong with the one- and two-byte cases (nearly every record field) first."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    c = data[pos + 1]
    if c < 0x80:
        u = (b & 0x7F) | (c << 7)
        return (u >> 1) ^ -(u & 1), pos + 2
    return _read_zz_slow(data, pos)


def _walk_records(data: bytes, count: int, *, require_keys: bool = False) -> tuple[int, int]:
    """Check that `count` records exactly fill `data` (lengths, key/value/header framing, offset deltas
    0..count-1) without building them; returns the smallest and largest timestamp delta."""
    read = _read_zz
    end = len(data)
    pos = 0
    min_delta = max_delta = 0
    keyless: list[int] = []
    try:
        for index in range(count):
            length, pos = read(data, pos)
            record_end = pos + length
            if length <= 0 or record_end > end:
                raise InvalidRecordBatch(f"record {index} length {length} does not fit the batch")
            delta, pos = read(data, pos + 1)  # after the attributes byte
            if index == 0:
                min_delta = max_delta = delta
            elif delta < min_delta:
                min_delta = delta
            elif delta > max_delta:
                max_delta = delta
            offset_delta, pos = read(data, pos)
            if offset_delta != index:
                # Offsets are assigned by patching the batch's base offset only, so deltas must be 0..n-1.
                raise InvalidRecordBatch(f"record {index} has offset delta {offset_delta}")
            # Key and value, then each header's key and value: a length (-1 = null) and that many bytes.
            key_size, pos = read(data, pos)
            value_size, pos = read(data, pos + key_size if key_size > 0 else pos)
            header_count, pos = read(data, pos + value_size if value_size > 0 else pos)
            if key_size < -1 or value_size < -1:
                raise InvalidRecordBatch(f"record {index} has invalid key or value length")
            if require_keys and key_size < 0:
                # Kafka names every keyless record of the batch, so the walk goes on (framing first).
                keyless.append(index)
            # Each header takes at least two bytes (two length varints).
            if header_count < 0 or 2 * header_count > record_end - pos:
                raise InvalidRecordBatch(f"record {index} has invalid header count {header_count}")
            for _ in range(header_count):
                key_size, pos = read(data, pos)
                value_size, pos = read(data, pos + key_size if key_size > 0 else pos)
                if key_size < 0 or value_size < -1:
                    raise InvalidRecordBatch(f"record {index} has an invalid header length")
                if value_size > 0:
                    pos += value_size
            if pos != record_end:
                raise InvalidRecordBatch(f"record {index} ends at {pos}, its length says {record_end}")
    except IndexError:
        raise InvalidRecordBatch("truncated record") from None
    if pos != end:
        raise InvalidRecordBatch(f"{end - pos} bytes left after the last of {count} records")
    if keyless:
        raise _KeylessRecords(keyless)
    return min_delta, max_delta


@dataclass(frozen=True, slots=True)
class TimestampBounds:
    """Kafka's message.timestamp.before/after.max.ms window around the broker's clock for CreateTime records."""

    now_ms: int
    before_max_ms: int
    after_max_ms: int

    def check(self, timestamp: int) -> None:
        if not _INT64_MIN <= timestamp <= _INT64_MAX:
            raise InvalidTimestamp(f"a record's timestamp {timestamp} is outside the int64 range")
        if self.now_ms - timestamp > self.before_max_ms:
            raise InvalidTimestamp(
                f"timestamp {timestamp} is more than {self.before_max_ms} ms before the broker's time"
            )
        if timestamp - self.now_ms > self.after_max_ms:
            raise InvalidTimestamp(
                f"timestamp {timestamp} is more than {self.after_max_ms} ms after the broker's time"
            )
