"""One segment of a partition log: a `.log` file of record batches plus its sparse indexes.

The log treats batches as opaque bytes apart from their 61-byte header. Offsets inside a segment rise
from batch to batch; log compaction leaves gaps between (and inside) batches, so an offset lookup walks
batches reading only their first 27 bytes (base offset, length, last offset delta).

Indexes live in memory. They are written to `<base>.index` / `<base>.timeindex` only once the segment
is sealed and its `.log` has been fsynced, so the presence of valid index files means "this segment is
durable and complete" and lets a restart skip the CRC scan for it.

Transactions (Kafka's TransactionIndex and producer snapshots): `<base>.txnindex` lists the aborted
transactions whose ABORT marker is in this segment, appended to as markers are written and fsynced
with the `.log`; a sealed segment's is complete before its index files are written. `<offset>.snapshot`
holds the open transactions (producer id, first offset) at a sealed segment's end, so recovery can
rebuild the transaction index of the segments it re-scans without reading the log from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import time
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path

from shoal.protocol.record_batch import (
    BASE_OFFSET_POS,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_POS,
    LENGTH_POS,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_POS,
    BatchHeader,
    InvalidRecordBatch,
    parse_batch_header,
    verify_crc,
)

INT32_MAX = 2**31 - 1
NO_TIMESTAMP = -1

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
TMP_SUFFIX = ".tmp"
# A retired segment's files wait under this suffix for file.delete.delay.ms before they are removed.
DELETED_SUFFIX = ".deleted"
# Log compaction writes `<base>.log.cleaned`, renames it to `<base>.<end>.log.swap` once complete and
# durable (the commit point: it replaces every segment with a base in [base, end)), then to `<base>.log`.
CLEANED_SUFFIX = LOG_SUFFIX + ".cleaned"
SWAP_SUFFIX = LOG_SUFFIX + ".swap"

_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, file position
_TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset of that record
_PREFIX = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
# Kafka's AbortedTxn entry: version, producer id, first offset, last offset (the marker's), last stable
# offset when the marker was written.
_TXN_ENTRY = struct.Struct(">hqqqq")
_TXN_ENTRY_VERSION = 0
# Open transactions at a segment's end: version, count, (producer id, first offset)*, CRC32 of the rest.
_SNAPSHOT_HEAD = struct.Struct(">hi")
_SNAPSHOT_ENTRY = struct.Struct(">qq")
_SNAPSHOT_CRC = struct.Struct(">I")
_SNAPSHOT_VERSION = 0
# (producer id, first offset, last offset, last stable offset)
TxnEntry = tuple[int, int, int, int]
_WALK_BYTES = LAST_OFFSET_DELTA_POS + 4

# Read granularity for header walks and recovery scans.
_SCAN_CHUNK = 64 * 1024
_RECOVERY_CHUNK = 1 << 20


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def encode_txn_entries(entries: list[TxnEntry]) -> bytes:
    return b"".join(_TXN_ENTRY.pack(_TXN_ENTRY_VERSION, *entry) for entry in entries)


def decode_txn_entries(raw: bytes) -> tuple[list[TxnEntry], bool]:
    """The whole entries of a `.txnindex` file, and False if it ends in a partial or bad entry (a torn
    append)."""
    entries: list[TxnEntry] = []
    whole = len(raw) - len(raw) % _TXN_ENTRY.size
    for version, pid, first, last, lso in _TXN_ENTRY.iter_unpack(raw[:whole]):
        if version != _TXN_ENTRY_VERSION or first > last or (entries and last < entries[-1][2]):
            return entries, False
        entries.append((pid, first, last, lso))
    return entries, whole == len(raw)


def write_snapshot(directory: Path, offset: int, ongoing: dict[int, int]) -> None:
    """Write `<offset>.snapshot` atomically and durably (the caller fsyncs the directory)."""
    body = _SNAPSHOT_HEAD.pack(_SNAPSHOT_VERSION, len(ongoing)) + b"".join(
        _SNAPSHOT_ENTRY.pack(pid, first) for pid, first in sorted(ongoing.items()))
    _write_durably(directory / segment_file_name(offset, SNAPSHOT_SUFFIX),
                   body + _SNAPSHOT_CRC.pack(zlib.crc32(body)))


def read_snapshot(directory: Path, offset: int) -> dict[int, int] | None:
    """The open transactions saved at `offset`, None if there is no valid snapshot there."""
    try:
        raw = (directory / segment_file_name(offset, SNAPSHOT_SUFFIX)).read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _SNAPSHOT_HEAD.size + _SNAPSHOT_CRC.size:
        return None
    body, (crc,) = raw[: -_SNAPSHOT_CRC.size], _SNAPSHOT_CRC.unpack(raw[-_SNAPSHOT_CRC.size :])
    version, count = _SNAPSHOT_HEAD.unpack_from(body)
    if zlib.crc32(body) != crc or version != _SNAPSHOT_VERSION or len(body) != _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size:
        return None
    return {pid: first for pid, first in _SNAPSHOT_ENTRY.iter_unpack(body[_SNAPSHOT_HEAD.size :])}


def _write_durably(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def swap_file_name(base_offset: int, end_offset: int) -> str:
    return f"{base_offset:020d}.{end_offset:020d}{SWAP_SUFFIX}"


def parse_swap_file_name(name: str) -> tuple[int, int] | None:
    """(base, end) of a swap file name, None if `name` is not one."""
    if not name.endswith(SWAP_SUFFIX):
        return None
    parts = name[: -len(SWAP_SUFFIX)].split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return int(parts[0]), int(parts[1])


def _batch_size(buf: bytes | memoryview, pos: int) -> int:
    return int(_LENGTH.unpack_from(buf, pos + LENGTH_POS)[0]) + LOG_OVERHEAD


def _base_offset(buf: bytes | memoryview, pos: int) -> int:
    return int(_PREFIX.unpack_from(buf, pos + BASE_OFFSET_POS)[0])


def offset_of_max_timestamp(header: BatchHeader) -> int:
    """Offset we report for a batch's max timestamp.

    Records are opaque here, so we guess without decoding: with LogAppendTime every record carries the
    same timestamp and the first one wins; with CreateTime producers stamp records in order, so the
    last record usually carries the max.
    """
    return header.base_offset if header.timestamp_type == 1 else header.last_offset


class LogSegment:
    """A `.log` file starting at `base_offset`, with sparse offset and time indexes."""

    def __init__(self, directory: Path, base_offset: int, fd: int, *, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.fd = fd
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        # Max timestamp of the first batch, once one was appended or recovered here (Kafka's
        # rollingBasedTimestamp); None when unknown (a sealed segment opened from its indexes).
        self.first_timestamp: int | None = None
        self.sealed = False
        # When this object was made: the time a segment without record timestamps rolls by (segment.ms).
        self.created_ms = int(time.time() * 1000)
        # Bytes known to be on stable storage; the partition log's flush advances it.
        self.flushed_size = 0
        self.indexes_persisted = False
        self.deleted = False
        # Serialises index-file writes (flush thread) against deletion (event loop).
        self._file_lock = threading.Lock()
        self._bytes_since_index = 0
        self._idx_offsets: list[int] = []
        self._idx_positions: list[int] = []
        self._time_stamps: list[int] = []
        self._time_offsets: list[int] = []
        # Aborted transactions whose marker is here (the `.txnindex`); `txn_index_trusted` is False when
        # the file could not be taken as complete (a re-scanned segment: recovery rebuilds it).
        self.txn_entries: list[TxnEntry] = []
        self.txn_index_trusted = False
        self._txn_fd = -1
        self.txn_unsynced = False  # appended since the last fsync
        # Open transactions at this segment's end, saved as a snapshot with its indexes once sealed
        # (None: the partition has no transactions to save).
        self.end_snapshot: dict[int, int] | None = None

    # -- paths -------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.directory / segment_file_name(self.base_offset, LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.directory / segment_file_name(self.base_offset, INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.directory / segment_file_name(self.base_offset, TIME_INDEX_SUFFIX)

    @property
    def txn_index_path(self) -> Path:
        return self.directory / segment_file_name(self.base_offset, TXN_INDEX_SUFFIX)

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, *, index_interval_bytes: int = 4096, path: Path | None = None
    ) -> LogSegment:
        """A new, empty, writable segment (any stale file of the same name is discarded).

        With `path` the file is created there instead (the log cleaner's `.cleaned` file, renamed into
        place later); index files are then left alone.
        """
        file = path or directory / segment_file_name(base_offset, LOG_SUFFIX)
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = cls(directory, base_offset, fd, index_interval_bytes=index_interval_bytes)
        if path is None:
            seg._remove_index_files()
            with contextlib.suppress(FileNotFoundError):
                seg.txn_index_path.unlink()  # a stale one would be appended to
        return seg

    @classmethod
    def open(
        cls, directory: Path, base_offset: int, *, sealed: bool, index_interval_bytes: int = 4096
    ) -> tuple[LogSegment, int]:
        """Open an existing segment; returns it with the number of bytes recovery cut off its tail.

        A sealed segment with valid index files is trusted (only its last batch is read). Anything
        else is re-scanned with CRC checks and a torn or corrupt tail is truncated.
        """
        path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR)
        seg = cls(directory, base_offset, fd, index_interval_bytes=index_interval_bytes)
        try:
            seg.size = os.fstat(fd).st_size
            if sealed and seg._load_indexes():
                seg.sealed = True
                seg.indexes_persisted = True
                seg.flushed_size = seg.size
                seg._load_txn_index()
                return seg, 0
            truncated = seg.recover()
            if sealed:
                seg.seal()
            else:
                # The index files of a writable segment go stale with its first append.
                seg._remove_index_files()
            return seg, truncated
        except BaseException:
            os.close(fd)
            raise

    # -- append ------------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, headers: list[tuple[int, BatchHeader]]) -> None:
        """Write batches that already carry their final offsets; `headers` positions are relative to `data`."""
        if self.sealed:
            raise RuntimeError(f"segment {self.base_offset} is sealed")
        start = self.size
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(self.fd, view[written:], start + written)
        except BaseException:
            # Never leave half a batch behind a failed write (e.g. ENOSPC).
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise
        for pos, header in headers:
            self._track(start + pos, header)
        self.size = start + len(view)

    def _track(self, position: int, header: BatchHeader) -> None:
        """Index bookkeeping for one batch at `position`; shared by append and recovery."""
        if self.first_timestamp is None:
            self.first_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = offset_of_max_timestamp(header)
        if self._bytes_since_index > self.index_interval_bytes:
            self._idx_offsets.append(header.base_offset - self.base_offset)
            self._idx_positions.append(position)
            self._maybe_append_time_entry()
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.next_offset = header.last_offset + 1

    def _maybe_append_time_entry(self) -> None:
        last = self._time_stamps[-1] if self._time_stamps else NO_TIMESTAMP
        if self.max_timestamp > last:
            self._time_stamps.append(self.max_timestamp)
            self._time_offsets.append(self.offset_of_max_timestamp - self.base_offset)

    def seal(self) -> None:
        """Mark read-only; the final time index entry records the segment's max timestamp."""
        self._maybe_append_time_entry()
        self.sealed = True

    # -- lookups -----------------------------------------------------------------------------------

    def _index_floor(self, offset: int) -> int:
        """File position of the last indexed batch whose base offset is <= `offset` (0 if none)."""
        i = bisect_right(self._idx_offsets, offset - self.base_offset) - 1
        return self._idx_positions[i] if i >= 0 else 0

    def _walk(self, start: int) -> Iterator[tuple[int, int, int, int]]:
        """Yield (position, base offset, size, last offset) for each batch from `start`, reading only the
        first bytes of each."""
        end = self.size
        buf = b""
        buf_pos = start
        pos = start
        while pos < end:
            rel = pos - buf_pos
            if rel < 0 or rel + _WALK_BYTES > len(buf):
                buf = os.pread(self.fd, min(_SCAN_CHUNK, end - pos), pos)
                buf_pos, rel = pos, 0
                if len(buf) < _WALK_BYTES:
                    raise InvalidRecordBatch(f"truncated batch at byte {pos} of segment {self.base_offset}")
            size = _batch_size(buf, rel)
            if size < HEADER_SIZE:
                raise InvalidRecordBatch(f"bad batch length at byte {pos} of segment {self.base_offset}")
            base = _base_offset(buf, rel)
            yield pos, base, size, base + int(_LENGTH.unpack_from(buf, rel + LAST_OFFSET_DELTA_POS)[0])
            pos += size

    def position_of(self, offset: int) -> int:
        """File position of the first batch whose last offset is >= `offset` (the batch holding it, or the
        next one when compaction removed it); `size` if the offset is past this segment."""
        if offset >= self.next_offset:
            return self.size
        if offset <= self.base_offset:
            return 0
        for pos, _, _, last in self._walk(self._index_floor(offset)):
            if last >= offset:
                return pos
        return self.size

    def _iter_full(self, start: int, *, check_crc: bool) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of whole batches from `start`, raising at the first bad one."""
        end = self.size
        pos = start
        buf = memoryview(b"")
        buf_pos = start
        while pos < end:
            rel = pos - buf_pos
            avail = len(buf) - rel
            if avail < LOG_OVERHEAD or avail < _batch_size(buf, rel):
                buf = memoryview(os.pread(self.fd, min(_RECOVERY_CHUNK, end - pos), pos))
                buf_pos, rel = pos, 0
                if len(buf) >= LOG_OVERHEAD:
                    need = _batch_size(buf, 0)
                    if len(buf) < need <= end - pos:
                        # A batch larger than the chunk: fetch all of it. A length running past the
                        # end of the file is left for parse_batch_header to reject as truncated.
                        buf = memoryview(os.pread(self.fd, need, pos))
            header = parse_batch_header(buf, rel)
            if check_crc:
                verify_crc(buf, rel, header)
            yield pos, header
            pos += header.size

    def find_timestamp(self, timestamp_ms: int, min_offset: int) -> BatchHeader | None:
        """Header of the first batch with max_timestamp >= `timestamp_ms` and last offset >= `min_offset`."""
        if self.max_timestamp < timestamp_ms or min_offset >= self.next_offset:
            return None
        # Every batch up to an entry's recording point has max timestamp <= the entry's timestamp.
        i = bisect_left(self._time_stamps, timestamp_ms) - 1
        start = self._index_floor(self.base_offset + self._time_offsets[i]) if i >= 0 else 0
        start = max(start, self._index_floor(min_offset))
        for _, header in self._iter_full(start, check_crc=False):
            if header.last_offset >= min_offset and header.max_timestamp >= timestamp_ms:
                return header
        return None

    # -- reads -------------------------------------------------------------------------------------

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, max(0, min(size, self.size - position)), position)

    def read_batches(
        self, position: int, max_bytes: int, *, min_one: bool, max_offset: int | None = None
    ) -> tuple[bytes, bool]:
        """Whole batches from `position` within `max_bytes` (one over-sized batch if `min_one`).

        Returns (data, stopped): `stopped` is True when the read ended before this segment's end,
        so the caller must not continue into the next segment.
        """
        end = self.size
        if position >= end:
            return b"", False
        if max_offset is None or max_offset >= self.next_offset:
            return self._read_whole_batches(position, max_bytes, min_one=min_one)
        buf = os.pread(self.fd, max(0, min(max_bytes, end - position)), position)
        cut = 0
        while cut + LOG_OVERHEAD <= len(buf):
            if max_offset is not None and _base_offset(buf, cut) >= max_offset:
                return buf[:cut], True
            size = _batch_size(buf, cut)
            if cut + size > len(buf):
                break
            cut += size
        if cut == 0 and min_one:
            # Kafka returns a batch larger than the fetch size rather than stalling the consumer.
            head = buf if len(buf) >= LOG_OVERHEAD else os.pread(self.fd, LOG_OVERHEAD, position)
            if len(head) < LOG_OVERHEAD or (max_offset is not None and _base_offset(head, 0) >= max_offset):
                return b"", True
            first = os.pread(self.fd, _batch_size(head, 0), position)
            return first, position + len(first) < end
        return (buf if cut == len(buf) else buf[:cut]), position + cut < end

    def _read_whole_batches(self, position: int, max_bytes: int, *, min_one: bool) -> tuple[bytes, bool]:
        """`read_batches` with no offset bound, without walking every batch it returns: the segment ends on
        a batch boundary, and so does each offset-index entry, so only the batches between the last entry
        at or below the byte limit and the limit itself are walked to find where to cut."""
        end = self.size
        limit = position + max(0, max_bytes)
        if limit >= end:
            return os.pread(self.fd, end - position, position), False
        i = bisect_right(self._idx_positions, limit) - 1
        # Every batch before that entry ends at or below the limit.
        cut = max(position, self._idx_positions[i] if i >= 0 else 0)
        for pos, _base, size, _last in self._walk(cut):
            if pos + size > limit:
                break
            cut = pos + size
        if cut == position:
            if not min_one:
                return b"", True
            # Kafka returns a batch larger than the fetch size rather than stalling the consumer.
            first = os.pread(self.fd, _batch_size(os.pread(self.fd, LOG_OVERHEAD, position), 0), position)
            return first, position + len(first) < end
        return os.pread(self.fd, cut - position, position), True

    # -- recovery and truncation -------------------------------------------------------------------

    def _reset_indexes(self) -> None:
        self.first_timestamp = None
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self._bytes_since_index = 0
        self._idx_offsets.clear()
        self._idx_positions.clear()
        self._time_stamps.clear()
        self._time_offsets.clear()

    def recover(self) -> int:
        """Re-scan the file verifying CRCs and rising offsets, rebuild the indexes, truncate the tail at
        the first torn or corrupt batch. Returns the number of bytes removed."""
        self._reset_indexes()
        good = 0
        try:
            for pos, header in self._iter_full(0, check_crc=True):
                if header.base_offset < self.next_offset:
                    break  # offsets only rise (compaction leaves gaps); anything else is garbage
                self._track(pos, header)
                good = pos + header.size
        except InvalidRecordBatch:
            pass
        truncated = self.size - good
        if truncated:
            os.ftruncate(self.fd, good)
            self.size = good
        self.flushed_size = min(self.flushed_size, self.size)
        return truncated

    def truncate_to(self, position: int) -> None:
        """Cut the file at `position` (a batch boundary) and rebuild the indexes from what is left."""
        if self.sealed:
            raise RuntimeError(f"segment {self.base_offset} is sealed")
        if position < self.size:
            os.ftruncate(self.fd, position)
            self.size = position
        self.recover()

    # -- transaction index -------------------------------------------------------------------------

    def _load_txn_index(self) -> None:
        """A durable segment's `.txnindex` (none: no aborted transaction ended here)."""
        try:
            raw = self.txn_index_path.read_bytes()
        except FileNotFoundError:
            raw = b""
        entries, whole = decode_txn_entries(raw)
        self.txn_entries = entries
        self.txn_index_trusted = whole and all(self.base_offset <= e[2] < self.next_offset for e in entries)

    def append_txn_entry(self, entry: TxnEntry) -> None:
        """An ABORT marker was appended here: add its transaction to the `.txnindex` (page cache; the
        partition's next flush fsyncs it with the `.log`)."""
        self.txn_entries.append(entry)
        if self._txn_fd < 0:
            self._txn_fd = os.open(self.txn_index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._txn_fd, encode_txn_entries([entry]))
        self.txn_unsynced = True

    def txn_fd_for_flush(self) -> int:
        """A duplicate of the `.txnindex` descriptor to fsync, -1 when nothing awaits an fsync."""
        if not self.txn_unsynced or self._txn_fd < 0:
            return -1
        self.txn_unsynced = False
        return os.dup(self._txn_fd)

    def rewrite_txn_index(self, entries: list[TxnEntry]) -> None:
        """Replace the `.txnindex` with `entries` (recovery's rebuild, a cleaned segment), durably."""
        self._close_txn_fd()
        self.txn_entries = list(entries)
        _write_durably(self.txn_index_path, encode_txn_entries(self.txn_entries))
        self.txn_unsynced = False
        self.txn_index_trusted = True

    def _close_txn_fd(self) -> None:
        if self._txn_fd >= 0:
            os.close(self._txn_fd)
            self._txn_fd = -1

    # -- index persistence -------------------------------------------------------------------------

    def _load_indexes(self) -> bool:
        """Load persisted indexes and locate the last batch; False if anything looks off."""
        try:
            raw_index = self.index_path.read_bytes()
            raw_time = self.time_index_path.read_bytes()
        except FileNotFoundError:
            return False
        if len(raw_index) % _OFFSET_ENTRY.size or len(raw_time) % _TIME_ENTRY.size or self.size == 0:
            return False
        offsets: list[int] = []
        positions: list[int] = []
        for rel, pos in _OFFSET_ENTRY.iter_unpack(raw_index):
            if (
                (offsets and (rel <= offsets[-1] or pos <= positions[-1]))
                or rel < 0
                or not 0 <= pos < self.size
            ):
                return False
            offsets.append(rel)
            positions.append(pos)
        stamps: list[int] = []
        time_offsets: list[int] = []
        for ts, rel in _TIME_ENTRY.iter_unpack(raw_time):
            if (stamps and ts <= stamps[-1]) or rel < 0:
                return False
            stamps.append(ts)
            time_offsets.append(rel)
        try:
            last_pos = 0
            walked_to = 0
            for pos, _, size, _ in self._walk(positions[-1] if positions else 0):
                last_pos, walked_to = pos, pos + size
            if walked_to != self.size:
                return False
            last = next(self._iter_full(last_pos, check_crc=False))[1]
        except (InvalidRecordBatch, StopIteration):
            return False
        if offsets and last.base_offset < self.base_offset + offsets[-1]:
            return False
        self._idx_offsets, self._idx_positions = offsets, positions
        self._time_stamps, self._time_offsets = stamps, time_offsets
        self.next_offset = last.last_offset + 1
        if stamps:
            self.max_timestamp = stamps[-1]
            self.offset_of_max_timestamp = self.base_offset + time_offsets[-1]
        if time_offsets and self.offset_of_max_timestamp >= self.next_offset:
            self._reset_indexes()
            return False
        return True

    def persist_indexes(self) -> None:
        """Write both index files atomically. Call only after this segment's `.log` has been fsynced."""
        with self._file_lock:
            if self.deleted or self.indexes_persisted:
                return
            # The transaction files first: valid index files say everything of this segment is durable.
            if self.end_snapshot is not None:
                write_snapshot(self.directory, self.next_offset, self.end_snapshot)
            if self.txn_entries or self.txn_index_path.exists():
                self.rewrite_txn_index(self.txn_entries)
            index = b"".join(
                _OFFSET_ENTRY.pack(o, p) for o, p in zip(self._idx_offsets, self._idx_positions, strict=True)
            )
            times = b"".join(
                _TIME_ENTRY.pack(t, o) for t, o in zip(self._time_stamps, self._time_offsets, strict=True)
            )
            for path, payload in ((self.index_path, index), (self.time_index_path, times)):
                tmp = path.with_name(path.name + TMP_SUFFIX)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, payload)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            self.indexes_persisted = True

    def unseal(self) -> None:
        """Make a sealed segment writable again (recovery cut a sealed segment's tail)."""
        self.sealed = False
        self._remove_index_files()

    @staticmethod
    def remove_files(directory: Path, base_offset: int) -> None:
        """Remove a segment's files without opening it."""
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                (directory / segment_file_name(base_offset, suffix)).unlink()

    def _remove_index_files(self) -> None:
        for path in (self.index_path, self.time_index_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.indexes_persisted = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def fsync(self) -> None:
        os.fsync(self.fd)
        if self.txn_unsynced and self._txn_fd >= 0:
            os.fsync(self._txn_fd)
            self.txn_unsynced = False
        self.flushed_size = self.size

    def first_batch_timestamp(self) -> int:
        """Max timestamp of the first batch (Kafka's getFirstBatchTimestamp), -1 if empty or unknown."""
        if self.first_timestamp is not None:
            return self.first_timestamp
        if self.size < HEADER_SIZE:
            return NO_TIMESTAMP
        head = os.pread(self.fd, HEADER_SIZE, 0)
        return int(_PREFIX.unpack_from(head, MAX_TIMESTAMP_POS)[0]) if len(head) == HEADER_SIZE else NO_TIMESTAMP

    def index_entries(self) -> tuple[int, int]:
        """(offset index entries, time index entries) held in memory, for segment.index.bytes."""
        return len(self._idx_offsets), len(self._time_stamps)

    def last_modified_ms(self) -> int:
        return int(os.fstat(self.fd).st_mtime * 1000)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._close_txn_fd()

    def delete(self) -> None:
        """Close and remove the segment's files."""
        self.retire(keep_log=False)

    def retire(self, *, keep_log: bool) -> None:
        """Close and remove the files; with `keep_log` the `.log` name stays (a cleaned segment replaces it)."""
        with self._file_lock:
            self.deleted = True
            self.close()
            paths = (self.index_path, self.time_index_path, self.txn_index_path) if keep_log else (
                self.log_path, self.index_path, self.time_index_path, self.txn_index_path)
            for path in paths:
                for p in (path, path.with_name(path.name + TMP_SUFFIX)):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()

    def delete_later(self, delay_ms: int) -> None:
        """Kafka's file.delete.delay.ms: close the segment and rename its files to `*.deleted` now, remove them
        after `delay_ms` (at once without a running event loop; a restart removes any left behind)."""
        with self._file_lock:
            self.deleted = True
            self.close()
            renamed: list[Path] = []
            for path in (self.log_path, self.index_path, self.time_index_path, self.txn_index_path):
                target = path.with_name(path.name + DELETED_SUFFIX)
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path, target)
                    renamed.append(target)
                with contextlib.suppress(FileNotFoundError):
                    path.with_name(path.name + TMP_SUFFIX).unlink()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or delay_ms <= 0:
            _unlink_all(renamed)
        else:
            loop.call_later(delay_ms / 1000, _unlink_all, renamed)

    def __repr__(self) -> str:
        return (
            f"LogSegment(base={self.base_offset}, next={self.next_offset}, size={self.size}, "
            f"sealed={self.sealed})"
        )


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
