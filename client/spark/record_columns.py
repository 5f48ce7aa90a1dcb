"""Records of fetched v2 batches decoded straight into Arrow columns, without a Python object per record.

Only the walk from one record to the next is a Python loop (one varint per record); every field is then
read for all records at once with numpy, and keys and values are cut out of the batch bytes by Arrow.
`protocol.records` stays the reference decoder: this one must give the same records, which the unit tests
check against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shoal.protocol.compression import NONE, CompressionError, decompress
from shoal.protocol.record_batch import HEADER_SIZE, TIMESTAMP_TYPE_MASK, BatchHeader, InvalidRecordBatch

_INT32_LIMIT = (1 << 31) - 1
_EMPTY_INT64: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(0, np.int64)
# The record-start walk: the most records one check covers, the shortest run worth checking for, and
# how many records are walked one by one after a shorter one.
_GALLOP_MAX = 4096
_GALLOP_MIN_RUN = 16
_WALK_AFTER_SHORT_RUN = 256


@dataclass
class RecordColumns:
    """The records kept from some batches: `keys`/`values` are Arrow binary arrays (null for a null key
    or value), `offsets` and `timestamps` (ms, -1 = none) numpy int64, `batch_index[i]` the position of
    record i's batch in the sections it came from, `record_index[i]` its index inside that batch."""

    offsets: np.ndarray[Any, np.dtype[np.int64]]
    timestamps: np.ndarray[Any, np.dtype[np.int64]]
    keys: pa.Array
    values: pa.Array
    batch_index: np.ndarray[Any, np.dtype[np.int64]]
    record_index: np.ndarray[Any, np.dtype[np.int64]]

    def __len__(self) -> int:
        return len(self.offsets)


def _walk(data: bytes | memoryview, pos: int, count: int, starts: list[int]) -> int:
    """Step over `count` records from `pos`, noting where each starts; the position after them."""
    append = starts.append
    for _ in range(count):
        append(pos)
        b = data[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            u = b & 0x7F
            shift = 7
            pos += 1
            while True:
                b = data[pos]
                pos += 1
                u |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 28:
                    raise InvalidRecordBatch("record length varint longer than 5 bytes")
            length = (u >> 1) ^ -(u & 1)
        if length <= 0:
            raise InvalidRecordBatch(f"record length {length} at byte {pos}")
        pos += length
    return pos


def _record_starts(
    data: bytes | memoryview, buf: np.ndarray[Any, np.dtype[np.uint8]], sections: Sequence[tuple[BatchHeader, int, int]]
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Where each record's length varint starts: the one step that must go record by record.

    Records often come in runs of one length (same-sized keys and values): from a record, the places
    where the next ones would start if they had its length are checked all at once, by comparing the
    bytes of their length varints with its own. A short run is followed by a stretch walked one by one,
    so records of all different lengths cost about what the plain walk costs."""
    pieces: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    try:
        for header, pos, end in sections:
            left = header.records_count
            # The smallest record takes 7 bytes: a bad count must not make the walk run for long.
            if not 0 <= left <= (end - pos) // 7:
                raise InvalidRecordBatch(f"batch at offset {header.base_offset} cannot hold {left} records")
            while left:
                walked: list[int] = []
                after = _walk(data, pos, 1, walked)
                stride = after - pos
                fit = min(left, _GALLOP_MAX, (end - pos) // stride)
                run = 1
                if fit > 1:
                    at = pos + stride * np.arange(fit, dtype=np.int64)
                    same = np.ones(fit, np.bool_)
                    for j in range(_varint_size(data, pos)):
                        same &= buf[at + j] == buf[pos + j]
                    misses = np.flatnonzero(~same)
                    run = int(misses[0]) if misses.size else fit
                    pieces.append(at[:run])
                else:
                    pieces.append(np.array(walked, np.int64))
                pos += stride * run
                left -= run
                if run < _GALLOP_MIN_RUN and left:
                    walked = []
                    pos = _walk(data, pos, min(left, _WALK_AFTER_SHORT_RUN), walked)
                    left -= len(walked)
                    pieces.append(np.array(walked, np.int64))
            if pos != end:
                raise InvalidRecordBatch(
                    f"records of the batch at offset {header.base_offset} end at byte {pos}, not {end}"
                )
    except IndexError:
        raise InvalidRecordBatch("truncated record") from None
    return np.concatenate(pieces) if pieces else _EMPTY_INT64


def _varint_size(data: bytes | memoryview, pos: int) -> int:
    size = 1
    while data[pos + size - 1] >= 0x80:
        size += 1
    return size


def _zigzag_at(
    buf: np.ndarray[Any, np.dtype[np.uint8]], at: np.ndarray[Any, np.dtype[np.int64]], max_bytes: int
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """The zigzag varints starting at each position of `at`: (values, positions after them)."""
    first = buf[at]
    u = (first & 0x7F).astype(np.uint64)
    after = at + 1
    more = np.flatnonzero(first >= 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * max_bytes:
            raise InvalidRecordBatch(f"varint longer than {max_bytes} bytes")
        b = buf[after[more]]
        u[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] += 1
        more = more[b >= 0x80]
        shift += 7
    values = (u >> np.uint64(1)).astype(np.int64) ^ -(u & np.uint64(1)).astype(np.int64)
    return values, after


def _binary_at(
    data: bytes | memoryview, start: np.ndarray[Any, np.dtype[np.int64]], size: np.ndarray[Any, np.dtype[np.int64]]
) -> pa.Array:
    """Arrow binary array of data[start:start+size] (null where size is -1), copied out by Arrow.

    The slices are laid over `data` as the even elements of one binary array whose odd elements are the
    bytes between them; `take` then picks the even ones into a fresh array."""
    n = len(start)
    if n == 0:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = start
    bounds[1::2] = start + np.maximum(size, 0)
    if len(data) <= _INT32_LIMIT:
        kind, offsets = pa.binary(), pa.py_buffer(bounds.astype(np.int32))
    else:
        kind, offsets = pa.large_binary(), pa.py_buffer(bounds)
    laid = pa.Array.from_buffers(kind, 2 * n - 1, [None, offsets, pa.py_buffer(data)])
    picks = pa.array(np.arange(0, 2 * n, 2, dtype=np.int32), mask=size < 0)
    taken = pc.take(laid, picks)
    return taken if kind == pa.binary() else taken.cast(pa.binary())


def decode_columns(
    data: bytes | memoryview, sections: Sequence[tuple[BatchHeader, int, int]], first: int, last: int
) -> RecordColumns:
    """Decode the records of `sections` (header, start, end: each batch's uncompressed records section
    inside `data`) and keep those with first <= offset <= last."""
    buf = np.frombuffer(data, np.uint8)
    at = _record_starts(data, buf, sections)
    n = len(at)
    if n == 0:
        empty = pa.array([], pa.binary())
        return RecordColumns(_EMPTY_INT64, _EMPTY_INT64, empty, empty, _EMPTY_INT64, _EMPTY_INT64)
    counts = np.fromiter((h.records_count for h, _, _ in sections), np.int64, len(sections))
    batch_index = np.repeat(np.arange(len(sections), dtype=np.int64), counts)
    try:
        length, pos = _zigzag_at(buf, at, 5)
        record_end = pos + length
        ts_delta, pos = _zigzag_at(buf, pos + 1, 10)  # after the attributes byte
        offset_delta, pos = _zigzag_at(buf, pos, 5)
        key_size, pos = _zigzag_at(buf, pos, 5)
        key_start = pos
        value_size, pos = _zigzag_at(buf, pos + np.maximum(key_size, 0), 5)
        value_start = pos
        header_count, pos = _zigzag_at(buf, pos + np.maximum(value_size, 0), 5)
    except IndexError:
        raise InvalidRecordBatch("truncated record") from None
    # Records with headers end after them; those without must end right here.
    if (
        (length <= 0).any()
        or (key_size < -1).any()
        or (value_size < -1).any()
        or (header_count < 0).any()
        or (pos > record_end).any()
        or ((header_count == 0) & (pos != record_end)).any()
    ):
        raise InvalidRecordBatch("a record's lengths do not fit its frame")

    base_offsets = np.fromiter((h.base_offset for h, _, _ in sections), np.int64, len(sections))
    offsets = base_offsets[batch_index] + offset_delta
    # LogAppendTime batches carry the broker's time in max_timestamp; record deltas are ignored.
    base_ts = np.fromiter(
        (h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else h.base_timestamp for h, _, _ in sections),
        np.int64,
        len(sections),
    )
    log_append = np.fromiter(
        (bool(h.attributes & TIMESTAMP_TYPE_MASK) for h, _, _ in sections), np.bool_, len(sections)
    )
    timestamps = base_ts[batch_index] + np.where(log_append[batch_index], 0, ts_delta)
    record_index = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)

    keep = (offsets >= first) & (offsets <= last)
    if not keep.all():
        kept = np.flatnonzero(keep)
        offsets, timestamps = offsets[kept], timestamps[kept]
        key_start, key_size = key_start[kept], key_size[kept]
        value_start, value_size = value_start[kept], value_size[kept]
        batch_index, record_index = batch_index[kept], record_index[kept]
    return RecordColumns(
        offsets,
        timestamps,
        _binary_at(data, key_start, key_size),
        _binary_at(data, value_start, value_size),
        batch_index,
        record_index,
    )


def record_sections(
    data: bytes | memoryview, batches: Sequence[tuple[BatchHeader, int]]
) -> tuple[bytes | memoryview, list[tuple[BatchHeader, int, int]]]:
    """The records sections of `batches` (header, byte position in `data`) as one buffer and each batch's
    (header, start, end) in it: `data` itself when no batch is compressed, else the sections joined."""
    if all(h.compression == NONE for h, _ in batches):
        return data, [(h, at + HEADER_SIZE, at + h.size) for h, at in batches]
    pieces: list[bytes | memoryview] = []
    sections: list[tuple[BatchHeader, int, int]] = []
    size = 0
    view = memoryview(data)
    for h, at in batches:
        body = view[at + HEADER_SIZE : at + h.size]
        if h.compression != NONE:
            try:
                body = memoryview(decompress(h.compression, body))
            except CompressionError as exc:
                raise InvalidRecordBatch(f"batch at offset {h.base_offset}: {exc}") from exc
        pieces.append(body)
        sections.append((h, size, size + len(body)))
        size += len(body)
    return b"".join(pieces), sections
