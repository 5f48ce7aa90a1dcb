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
   survives a restart. Transactions follow Kafka's CleanedTransactionMetadata: an aborted
   transaction's records never enter the offset map (they must not supersede a committed value) and
   are removed; a transaction marker whose transaction has no batch left in the log is stamped with a
   delete horizon like a tombstone, and dropped by a clean after it (an ABORT marker then leaves the
   list of aborted transactions too, or a read_committed consumer would drop the producer's later
   batches);
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
from collections import deque
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
from shoal.broker.storage.producer_state import AbortedTxn
from shoal.protocol.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecordBatch,
    parse_batch_header,
)
from shoal.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    Record,
    control_record_type,
    decode_records,
    encode_retained_batch,
)

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
    # Aborted transactions with records in the planned range (all of it is below the last stable
    # offset, so every transaction there is decided).
    aborted: list[AbortedTxn] = field(default_factory=list)
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
    # Aborted transactions whose ABORT marker this group no longer holds.
    dropped_aborted: list[AbortedTxn] = field(default_factory=list)


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
        aborted=plog.aborted_transactions(plog.log_start_offset, sources[-1].segment.next_offset),
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


class _OpenAborted:
    __slots__ = ("txn", "batch_seen")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.batch_seen = False


class TxnTracker:
    """Which transaction each batch belongs to, walking a log range in offset order (Kafka's
    CleanedTransactionMetadata): an aborted transaction becomes current for its producer once the walk
    reaches its first offset, and ends at the producer's ABORT marker."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._pending = deque(sorted(aborted, key=lambda t: t.first_offset))
        self._aborted: dict[int, _OpenAborted] = {}
        self._committed: set[int] = set()  # producers with a batch of a committed transaction seen

    def _reach(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            txn = self._pending.popleft()
            if txn.last_offset < offset:
                # Its ABORT marker lies before this batch, in a part the walk skipped (the offset map
                # starts at the first dirty offset): the transaction ended there. Making it current
                # would take the producer's later, committed batches for aborted ones.
                continue
            self._aborted[txn.producer_id] = _OpenAborted(txn)

    def on_batch(self, header: BatchHeader) -> bool:
        """True if this data batch belongs to an aborted transaction."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        open_txn = self._aborted.get(header.producer_id)
        if open_txn is not None and open_txn.txn.last_offset < header.base_offset:
            del self._aborted[header.producer_id]  # ended at a marker the walk did not see
            open_txn = None
        if open_txn is not None:
            open_txn.batch_seen = True
            return True
        self._committed.add(header.producer_id)
        return False

    def on_marker(self, header: BatchHeader, view: memoryview) -> tuple[bool, AbortedTxn | None]:
        """(whether the marker may go, its aborted transaction if it is an ABORT that ends one): a
        marker stays while a batch of its transaction was seen in this walk."""
        self._reach(header.last_offset)
        try:
            records = decode_records(view, 0, header)
            kind = control_record_type(records[0]) if records else None
        except (InvalidRecordBatch, ValueError):
            return False, None
        if kind is None:
            return True, None
        if kind == CONTROL_ABORT:
            open_txn = self._aborted.pop(header.producer_id, None)
            if open_txn is None:
                return True, None
            return not open_txn.batch_seen, open_txn.txn
        if kind == CONTROL_COMMIT:
            if header.producer_id in self._committed:
                self._committed.discard(header.producer_id)
                return False, None
            return True, None
        return False, None


def build_offset_map(plan: CleanPlan) -> tuple[dict[bytes, int], int, dict[int, int]]:
    """(key -> latest offset, end offset of the mapped range, producer id -> base offset of its last
    data batch).

    Whole segments only: a segment whose keys would overflow the map ends the range, unless it is the
    first dirty one (Kafka needs at least one segment per clean too). Records of aborted transactions
    are left out, so they never remove a committed record of the same key.
    """
    offset_map: dict[bytes, int] = {}
    end = plan.first_dirty_offset
    last_batches: dict[int, int] = {}
    # As Kafka's collectAbortedTransactions from the first dirty offset: only transactions whose ABORT
    # marker is in the mapped part.
    txns = TxnTracker([t for t in plan.aborted if t.last_offset >= plan.first_dirty_offset])
    for src in plan.sources:
        if src.base_offset < plan.first_dirty_offset or end < src.base_offset:
            continue  # already clean, or past a segment that did not fit the map
        seg_map: dict[bytes, int] = {}
        for header, view in _batches(src, plan):
            if header.is_control:
                txns.on_marker(header, view)
                continue
            if txns.on_batch(header):
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
            if header.producer_id >= 0 and not header.is_control:
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
    txns: TxnTracker
    removed: int = 0
    earliest_horizon: int | None = None
    dropped_aborted: list[AbortedTxn] = field(default_factory=list)

    def _note_horizon(self, horizon: int) -> None:
        self.earliest_horizon = horizon if self.earliest_horizon is None else min(self.earliest_horizon, horizon)

    def _marker(self, header: BatchHeader, view: memoryview) -> bytes | None:
        """Kafka's rule for a transaction marker: once no batch of its transaction is left it may go,
        but only after delete.retention.ms, so a consumer part-way through still sees it."""
        discardable, aborted = self.txns.on_marker(header, view)
        if not discardable:
            return bytes(view)
        horizon = header.delete_horizon_ms
        if horizon is not None and self.now_ms >= horizon:
            if aborted is not None:
                self.dropped_aborted.append(aborted)
            return None
        if horizon is not None:
            self._note_horizon(horizon)
            return bytes(view)
        self._note_horizon(self.horizon_ms)
        return encode_retained_batch(header, decode_records(view, 0, header), delete_horizon_ms=self.horizon_ms)

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
            return self._marker(header, view)
        records = decode_records(view, 0, header)
        if self.txns.on_batch(header):
            kept: list[Record] = []  # an aborted transaction's records
        else:
            kept = [r for r in records if self.retain(header, r)]
        self.removed += len(records) - len(kept)
        has_tombstone = any(r.value is None for r in kept)
        if has_tombstone:
            self._note_horizon(header.delete_horizon_ms if header.delete_horizon_ms is not None else self.horizon_ms)
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
        filt = _Filter(offset_map, last_batches, plan.now_ms, plan.now_ms + plan.delete_retention_ms,
                       TxnTracker(plan.aborted))
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
    dropped_before = len(filt.dropped_aborted)
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
        gone = {(t.producer_id, t.first_offset, t.last_offset) for t in filt.dropped_aborted[dropped_before:]}
        new.txn_entries = [e for src in group for e in src.segment.txn_entries if e[:3] not in gone]
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
    return CleanedGroup([src.segment for src in group], new, swap_path, filt.dropped_aborted[dropped_before:])


def swap_in(plog: PartitionLog, result: CleanResult) -> bool:
    """Swap every cleaned group into `plog` (event loop). True if all went in, so the checkpoint may move
    to `result.end_offset`; a group whose segments changed meanwhile is dropped and cleaned next time."""
    swapped = [plog.replace_segments(g.old, g.new, g.swap_path, flush=False) for g in result.groups]
    for group, done in zip(result.groups, swapped, strict=True):
        if done and group.dropped_aborted:
            plog.forget_aborted(group.dropped_aborted)
    if any(swapped):
        plog.schedule_metadata_flush()  # one flush round for all groups
    if all(swapped) and not plog.closed:
        plog.tombstone_horizon_ms = result.tombstone_horizon_ms
        return True
    return False
