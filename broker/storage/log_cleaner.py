"""Log compaction: the cleaning of one partition log, as Kafka's Cleaner does it.

`plan_clean` (event loop) picks the range: from the log start to the first uncleanable offset (the
last stable offset, the active segment, a segment younger than min.compaction.lag.ms, or one whose
indexes are not yet durable).
`clean` (the cleaner thread) reads that range through duplicated file descriptors, so retention closing
a segment meanwhile cannot pull a file out from under it:

1. an offset map, key -> latest offset, over the dirty part [first dirty offset, end);
2. every segment below `end`, grouped up to segment.bytes, is rewritten keeping a record only if no
   later offset of its key is in the map, it has a key, and it is not a tombstone past its delete
   horizon. Offsets never change, so consumers see gaps. A batch keeps its producer id, epoch, base
   sequence and offset span; a producer's last batch stays even when emptied, so idempotence state
   survives a restart. Control batches are kept as they are;
3. each group is written to `<base>.log.cleaned`, fsynced, and renamed to `<base>.<end>.log.swap`
   (the commit point: a restart finishes the swap), and handed back.

`PartitionLog.replace_segments` (event loop) swaps each group in. Tombstones follow KIP-534: the first
clean that keeps a tombstone stamps its batch with a delete horizon (now + delete.retention.ms); a
clean after that horizon drops it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shoal.broker.storage.log_segment import (
    CLEANED_SUFFIX,
    INT32_MAX,
    LogSegment,
    segment_file_name,
    swap_file_name,
)
from shoal.broker.storage.partition_log import PartitionLog, fsync_directory
from shoal.protocol.record_batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, parse_batch_header
from shoal.protocol.records import Record, decode_records, encode_retained_batch

# Kafka's SkimpyOffsetMap spends 24 bytes per entry (a 16-byte MD5 and an 8-byte offset).
OFFSET_MAP_ENTRY_BYTES = 24
_READ_CHUNK = 1 << 20


# The cleaner thread gives up the GIL at least this often, so the event loop never waits the
# interpreter's 5 ms switch interval for it: produce and fetch latency stay flat while it works.
_SLICE_S = 0.001
_PAUSE_S = 0.0001


class _Slicer:
    def __init__(self) -> None:
        self._since = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        if now - self._since >= _SLICE_S:
            time.sleep(_PAUSE_S)  # a real sleep: a waiting event loop thread takes the GIL
            self._since = time.perf_counter()


class Throttler:
    """Kafka's log.cleaner.io.max.bytes.per.second: bytes read and written by all cleaner threads are
    held to the rate by sleeping the thread that went over it."""

    def __init__(self, bytes_per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._bytes = 0.0

    def throttle(self, nbytes: int) -> None:
        if self.rate >= 1e300:  # Kafka's default, Double.MAX_VALUE: unthrottled
            return
        with self._lock:
            now = self._clock()
            if now - self._start > 1.0:  # a fresh window, so an idle spell earns no burst
                self._start, self._bytes = now, 0.0
            self._bytes += nbytes
            ahead = self._bytes / self.rate - (now - self._start)
        if ahead > 0:
            self._sleep(ahead)


UNTHROTTLED = Throttler(float("inf"))


class CleanAborted(Exception):
    """The broker is shutting down; the clean's files are left for start-up to drop or finish."""


@dataclass
class SegmentSource:
    """A sealed segment as the cleaner thread sees it: a private fd and the size at planning time."""

    segment: LogSegment
    fd: int
    size: int

    @property
    def base_offset(self) -> int:
        return self.segment.base_offset


@dataclass
class CleanPlan:
    plog: PartitionLog
    directory: Path
    first_dirty_offset: int
    sources: list[SegmentSource]  # sealed segments from the log start to the first uncleanable offset
    later: list[SegmentSource]  # the rest up to the log end: read for producers' last batches only
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_interval_bytes: int
    max_map_entries: int
    directory_inode: int
    abort: threading.Event = field(default_factory=threading.Event)
    slicer: _Slicer = field(default_factory=_Slicer)
    throttler: Throttler = UNTHROTTLED

    def close(self) -> None:
        for src in (*self.sources, *self.later):
            with contextlib.suppress(OSError):
                os.close(src.fd)


@dataclass
class CleanedGroup:
    old: list[LogSegment]
    new: LogSegment
    swap_path: Path


@dataclass
class CleanResult:
    groups: list[CleanedGroup]
    end_offset: int  # the next first dirty offset
    tombstone_horizon_ms: int | None
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0


def plan_clean(
    plog: PartitionLog, now_ms: int, max_map_entries: int, throttler: Throttler = UNTHROTTLED
) -> CleanPlan | None:
    """Snapshot what a clean of `plog` may touch; None if nothing is cleanable. Event loop only."""
    sources: list[SegmentSource] = []
    later: list[SegmentSource] = []
    try:
        for seg in cleanable_segments(plog, now_ms):
            sources.append(SegmentSource(seg, os.dup(seg.fd), seg.size))
        if not sources:
            return None
        for seg in plog.segments[len(sources) :]:
            later.append(SegmentSource(seg, os.dup(seg.fd), seg.size))
    except BaseException:
        for src in (*sources, *later):
            os.close(src.fd)
        raise
    cfg = plog.config
    return CleanPlan(
        plog, plog.directory, first_dirty_offset(plog), sources, later, now_ms, cfg.delete_retention_ms,
        cfg.segment_bytes, cfg.index_interval_bytes, max_map_entries, os.stat(plog.directory).st_ino,
        throttler=throttler,
    )


def first_dirty_offset(plog: PartitionLog) -> int:
    """Kafka resets a checkpoint outside the log to the log start."""
    checkpoint = plog.cleaner_checkpoint
    if not plog.log_start_offset <= checkpoint <= plog.log_end_offset:
        return plog.log_start_offset
    return checkpoint


def cleanable_segments(plog: PartitionLog, now_ms: int) -> list[LogSegment]:
    """Leading sealed segments below the first uncleanable offset: never the active segment, nor one
    with a record younger than min.compaction.lag.ms, nor one whose indexes are not yet durable."""
    dirty = first_dirty_offset(plog)
    lag = plog.config.min_compaction_lag_ms
    # Nor past the last stable offset: an open transaction's records must stay until it ends (Kafka's
    # first unstable offset bounds cleaning too).
    lso = plog.last_stable_offset
    out: list[LogSegment] = []
    for seg in plog.segments[:-1]:
        if not (seg.sealed and seg.indexes_persisted) or seg.next_offset > lso:
            break
        if seg.base_offset >= dirty and lag > 0 and seg.max_timestamp > now_ms - lag:
            break
        out.append(seg)
    return out


def dirty_ratio(plog: PartitionLog, now_ms: int) -> tuple[float, int]:
    """(dirty bytes / cleanable bytes, dirty bytes) over the cleanable segments."""
    dirty = first_dirty_offset(plog)
    total = dirty_bytes = 0
    for seg in cleanable_segments(plog, now_ms):
        total += seg.size
        if seg.base_offset >= dirty:
            dirty_bytes += seg.size
    return (dirty_bytes / total if total else 0.0), dirty_bytes


# -- the cleaner thread ----------------------------------------------------------------------------


def _batches(src: SegmentSource, plan: CleanPlan) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every whole batch of a segment, read through the plan's own fd in large chunks."""
    pos = 0
    while pos < src.size:
        if plan.abort.is_set():
            raise CleanAborted()
        chunk = memoryview(os.pread(src.fd, min(_READ_CHUNK, src.size - pos), pos))
        if len(chunk) >= LOG_OVERHEAD:
            need = int.from_bytes(chunk[8:12], "big") + LOG_OVERHEAD
            if need > len(chunk):
                chunk = memoryview(os.pread(src.fd, need, pos))  # one batch larger than the chunk
        used = 0
        for at, header in _whole_batches(chunk):
            yield header, chunk[at : at + header.size]
            used = at + header.size
            plan.slicer.tick()
        if used == 0:
            raise ValueError(f"unreadable batch at byte {pos} of segment {src.base_offset}")
        pos += used
        plan.throttler.throttle(used)


def _whole_batches(chunk: memoryview) -> Iterator[tuple[int, BatchHeader]]:
    pos = 0
    while pos + LOG_OVERHEAD <= len(chunk) and pos + int.from_bytes(chunk[pos + 8 : pos + 12], "big") + LOG_OVERHEAD <= len(chunk):
        header = parse_batch_header(chunk, pos)
        yield pos, header
        pos += header.size


def build_offset_map(plan: CleanPlan) -> tuple[dict[bytes, int], int, dict[int, int]]:
    """(key -> latest offset, end offset of the mapped range, producer id -> base offset of its last batch).

    Whole segments only: a segment whose keys would overflow the map ends the range, unless it is the
    first dirty one (Kafka needs at least one segment per clean too).
    """
    offset_map: dict[bytes, int] = {}
    end = plan.first_dirty_offset
    last_batches: dict[int, int] = {}
    for src in plan.sources:
        if src.base_offset < plan.first_dirty_offset or end < src.base_offset:
            continue  # already clean, or past a segment that did not fit the map
        seg_map: dict[bytes, int] = {}
        for header, view in _batches(src, plan):
            if header.is_control:
                continue
            for record in decode_records(view, 0, header):
                if record.key is not None:
                    seg_map[record.key] = record.offset
        if offset_map and len(offset_map) + len(seg_map) > plan.max_map_entries:
            break
        offset_map.update(seg_map)
        end = src.segment.next_offset
    # Producers' last batches, over the whole log: batch headers only.
    for src in (*plan.sources, *plan.later):
        for header in _headers(src, plan):
            if header.producer_id >= 0:
                last_batches[header.producer_id] = header.base_offset
    return offset_map, end, last_batches


def _headers(src: SegmentSource, plan: CleanPlan) -> Iterator[BatchHeader]:
    """Each batch's header, reading only its first bytes (no record data)."""
    pos = 0
    while pos + HEADER_SIZE <= src.size:
        if plan.abort.is_set():
            raise CleanAborted()
        header = parse_batch_header(os.pread(src.fd, HEADER_SIZE, pos), whole=False)
        yield header
        pos += header.size
        plan.slicer.tick()


def group_by_size(sources: list[SegmentSource], max_bytes: int) -> list[list[SegmentSource]]:
    """Consecutive segments merged while their combined size fits segment.bytes and their offsets fit
    an int32 index relative to the first (Kafka's groupSegmentsBySize)."""
    groups: list[list[SegmentSource]] = []
    for src in sources:
        if groups:
            group = groups[-1]
            size = sum(s.size for s in group)
            if size + src.size <= max_bytes and src.segment.next_offset - 1 - group[0].base_offset <= INT32_MAX:
                group.append(src)
                continue
        groups.append([src])
    return groups


@dataclass
class _Filter:
    offset_map: dict[bytes, int]
    last_batches: dict[int, int]
    now_ms: int
    horizon_ms: int
    removed: int = 0
    earliest_horizon: int | None = None

    def retain(self, header: BatchHeader, record: Record) -> bool:
        """Kafka's shouldRetainRecord: a key, the latest offset of that key, a tombstone not yet expired."""
        if record.key is None:
            return False
        latest = self.offset_map.get(record.key)
        if latest is not None and record.offset < latest:
            return False
        horizon = header.delete_horizon_ms
        return not (record.value is None and horizon is not None and self.now_ms >= horizon)

    def filter(self, header: BatchHeader, view: memoryview) -> bytes | None:
        """The batch as it should stay: its own bytes, a rewritten copy, or None to drop it."""
        if header.is_control:
            return bytes(view)
        records = decode_records(view, 0, header)
        kept = [r for r in records if self.retain(header, r)]
        self.removed += len(records) - len(kept)
        has_tombstone = any(r.value is None for r in kept)
        if has_tombstone:
            horizon = header.delete_horizon_ms if header.delete_horizon_ms is not None else self.horizon_ms
            self.earliest_horizon = horizon if self.earliest_horizon is None else min(self.earliest_horizon, horizon)
        stamp = has_tombstone and header.delete_horizon_ms is None
        if len(kept) == len(records) and not stamp:
            return bytes(view)
        if not kept and self.last_batches.get(header.producer_id) != header.base_offset:
            return None
        return encode_retained_batch(header, kept, delete_horizon_ms=self.horizon_ms if stamp else None)


def clean(plan: CleanPlan) -> CleanResult:
    """Compact the planned range into swap files (the cleaner thread's part). Closes the plan's fds."""
    try:
        offset_map, end, last_batches = build_offset_map(plan)
        filt = _Filter(offset_map, last_batches, plan.now_ms, plan.now_ms + plan.delete_retention_ms)
        result = CleanResult([], end, None)
        to_clean = [src for src in plan.sources if src.segment.next_offset <= end]
        for group in group_by_size(to_clean, plan.segment_bytes):
            result.groups.append(_clean_group(plan, group, filt, result))
        result.tombstone_horizon_ms = filt.earliest_horizon
        result.records_removed = filt.removed
        return result
    finally:
        plan.close()


def _clean_group(plan: CleanPlan, group: list[SegmentSource], filt: _Filter, result: CleanResult) -> CleanedGroup:
    base = group[0].base_offset
    end = group[-1].segment.next_offset
    cleaned_path = plan.directory / segment_file_name(base, CLEANED_SUFFIX)
    new = LogSegment.create(plan.directory, base, index_interval_bytes=plan.index_interval_bytes, path=cleaned_path)
    try:
        out = bytearray()
        headers: list[tuple[int, BatchHeader]] = []
        for src in group:
            result.bytes_read += src.size
            for header, view in _batches(src, plan):
                kept = filt.filter(header, view)
                if kept is None:
                    continue
                headers.append((len(out), parse_batch_header(kept)))
                out += kept
                if len(out) >= _READ_CHUNK:
                    new.append(out, headers)
                    plan.throttler.throttle(len(out))
                    out, headers = bytearray(), []
        if out:
            new.append(out, headers)
        new.seal()
        new.fsync()
        result.bytes_written += new.size
        if plan.plog.closed or os.stat(plan.directory).st_ino != plan.directory_inode:
            # The partition was deleted (perhaps re-created under the same name): never commit here.
            raise CleanAborted()
        swap_path = plan.directory / swap_file_name(base, end)
        os.replace(cleaned_path, swap_path)
        fsync_directory(plan.directory)
    except BaseException:
        new.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cleaned_path)
        raise
    return CleanedGroup([src.segment for src in group], new, swap_path)


def swap_in(plog: PartitionLog, result: CleanResult) -> bool:
    """Swap every cleaned group into `plog` (event loop). True if all went in, so the checkpoint may move
    to `result.end_offset`; a group whose segments changed meanwhile is dropped and cleaned next time."""
    swapped = [plog.replace_segments(g.old, g.new, g.swap_path, flush=False) for g in result.groups]
    if any(swapped):
        plog.schedule_metadata_flush()  # one flush round for all groups
    if all(swapped) and not plog.closed:
        plog.tombstone_horizon_ms = result.tombstone_horizon_ms
        return True
    return False
