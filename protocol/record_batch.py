"""Record batch v2 framing: the 61-byte header, CRC32C validation, and in-place offset assignment.

The broker's append and fetch paths only ever touch batch headers: records stay as the client's
bytes from produce to fetch. Decoding individual records lives in `records.py`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

# Field offsets within a v2 batch (see Kafka's DefaultRecordBatch layout).
BASE_OFFSET_POS = 0
LENGTH_POS = 8
PARTITION_LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
BASE_TIMESTAMP_POS = 27
MAX_TIMESTAMP_POS = 35
PRODUCER_ID_POS = 43
PRODUCER_EPOCH_POS = 51
BASE_SEQUENCE_POS = 53
RECORDS_COUNT_POS = 57
HEADER_SIZE = 61
# Bytes before the `length` field ends: base offset (8) + length (4).
LOG_OVERHEAD = 12

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
# Set by log compaction: base_timestamp holds the time after which tombstones may be removed (KIP-534).
DELETE_HORIZON_FLAG = 0x40

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")


class InvalidRecordBatch(ValueError):
    """A batch that cannot be framed: wrong magic, bad length, truncated."""


class CorruptRecordBatch(InvalidRecordBatch):
    """A batch whose CRC32C does not match its contents."""


@dataclass(slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on the wire and on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0


def parse_batch_header(buf: bytes | bytearray | memoryview, pos: int = 0, *, whole: bool = True) -> BatchHeader:
    """Parse the header of the batch starting at `pos`; raise InvalidRecordBatch if it cannot be framed.
    With `whole=False` only the header need be in `buf` (a walk that reads headers alone)."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidRecordBatch(f"truncated batch header: {len(buf) - pos} bytes")
    fields = _HEADER.unpack_from(buf, pos)
    header = BatchHeader(*fields)
    if header.magic != 2:
        raise InvalidRecordBatch(f"unsupported record batch magic {header.magic}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatch(f"batch length {header.batch_length} below the header size")
    if whole and len(buf) - pos < header.size:
        raise InvalidRecordBatch(f"truncated batch: need {header.size} bytes, have {len(buf) - pos}")
    return header


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC32C over attributes..end, the span the batch's CRC field covers."""
    return crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_POS : pos + size])


def verify_crc(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> None:
    if compute_crc(buf, pos, header.size) != header.crc:
        raise CorruptRecordBatch(f"CRC mismatch in batch at byte {pos}")


def iter_batches(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (byte position, header) for each whole batch in `buf`; raise on a partial or corrupt one."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = parse_batch_header(buf, pos)
        if check_crc:
            verify_crc(buf, pos, header)
        yield pos, header
        pos += header.size


def iter_packed_headers(buf: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """The batch headers of `buf`, HEADER_SIZE bytes each, back to back with no records after them (what
    a Shoal broker answers a header-only ShareFetch with); raise InvalidRecordBatch on a cut one."""
    if len(buf) % HEADER_SIZE:
        raise InvalidRecordBatch(f"{len(buf)} bytes of batch headers is not a whole number of headers")
    for pos in range(0, len(buf), HEADER_SIZE):
        yield parse_batch_header(buf, pos, whole=False)


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign the broker's offset; the CRC does not cover the base offset, so it stays valid."""
    struct.pack_into(">q", buf, pos + BASE_OFFSET_POS, base_offset)


def set_log_append_time(buf: bytearray | memoryview, pos: int, header: BatchHeader, timestamp_ms: int) -> None:
    """Stamp LogAppendTime: set the timestamp-type bit and max timestamp, then recompute the CRC."""
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    struct.pack_into(">h", buf, pos + ATTRIBUTES_POS, attributes)
    struct.pack_into(">q", buf, pos + MAX_TIMESTAMP_POS, timestamp_ms)
    header.attributes = attributes
    header.max_timestamp = timestamp_ms
    header.crc = compute_crc(buf, pos, header.size)
    struct.pack_into(">I", buf, pos + CRC_POS, header.crc)
