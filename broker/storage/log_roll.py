"""When the active segment rolls besides size (Kafka's LogSegment.shouldRoll), preallocation of new
segments, and the KAFKA-16310 lookup of the first record carrying a batch's max timestamp."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from shoal.protocol.record_batch import BatchHeader, InvalidRecordBatch
from shoal.protocol.records import decode_records

if TYPE_CHECKING:
    from .log_segment import LogSegment

# Reads whole batches: (offset, max bytes) -> (header, batch bytes) pairs, as PartitionLog.read_batch_headers.
BatchReader = Callable[[int, int], list[tuple[BatchHeader, memoryview]]]

log = structlog.get_logger(__name__)

_OFFSET_INDEX_ENTRY = 8
_TIME_INDEX_ENTRY = 12
_FALLOC_FL_KEEP_SIZE = 1
_fallocate_failed = False


def roll_due(seg: LogSegment, segment_ms: int, segment_index_bytes: int, headers: list[tuple[int, BatchHeader]],
             jitter_ms: int) -> bool:
    """Whether a non-empty active segment must roll before `headers` are appended: segment.ms (less this
    segment's jitter) has passed since its first batch, or its offset or time index is full."""
    if seg.size == 0:
        return False
    offsets, stamps = seg.index_entries()
    if offsets >= segment_index_bytes // _OFFSET_INDEX_ENTRY or stamps >= segment_index_bytes // _TIME_INDEX_ENTRY:
        return True
    first = seg.first_timestamp
    if first is not None and first >= 0:
        # Kafka measures from the first batch's timestamp to the incoming batches' largest.
        waited = max(h.max_timestamp for _p, h in headers) - first
    else:
        waited = int(time.time() * 1000) - seg.created_ms
    return waited > segment_ms - jitter_ms


def preallocate(seg: LogSegment, size: int) -> None:
    """Reserve `size` bytes of disk for a new segment without changing its length (fallocate with
    FALLOC_FL_KEEP_SIZE), so recovery still sees only what was written. Best effort, as the space is."""
    global _fallocate_failed
    if _fallocate_failed:
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        if fallocate(seg.fd, _FALLOC_FL_KEEP_SIZE, 0, size) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        _fallocate_failed = True
        log.warning("log.preallocate_unavailable", dir=str(seg.directory), error=repr(exc))


def first_record_with_timestamp(read: BatchReader, log_start_offset: int, header: BatchHeader, timestamp: int) -> int:
    """Offset of the first record of the batch `header` whose timestamp is `timestamp` (the batch's max):
    with LogAppendTime every record carries it, so the first one."""
    start = max(header.base_offset, log_start_offset)
    if header.timestamp_type == 1:
        return start
    try:
        for h, view in read(start, header.size):
            if h.base_offset != header.base_offset:
                continue
            for record in decode_records(view, 0, h):
                if record.offset >= start and record.timestamp == timestamp:
                    return record.offset
    except InvalidRecordBatch:
        pass
    return start
