"""A partition's durable log: an ordered list of segments, offset assignment, group-committed fsync,
retention and DeleteRecords.

Appends go to the page cache only; durability comes from `flush()`, which shares one fsync between all
concurrent callers (group commit) and runs it in a worker thread so the event loop never blocks on disk
(fsync_worker.py: threads that do not take the interpreter lock, when compiled).

Crash safety: a sealed segment's index files are written only after its `.log` was fsynced, so on open
sealed segments with index files are trusted and only the active segment (plus any sealed segment whose
index never made it to disk) is re-scanned with CRC checks; a torn tail is truncated.

Appends: `append_as_leader` is the one entry for every writer (Produce, the coordinators, the transaction
marker writer, the dead-letter writer), as Kafka's `UnifiedLog.appendAsLeader` with what its
`ReplicaManager.appendRecords` adds: the topic's rules (`LogConfig.produce`), producer sequences and
transactions, the append itself, the wake-up of long polls parked on the partition and the per-topic
metrics. `append` below it only assigns offsets and writes.

Transactions: each segment's `.txnindex` lists the aborted transactions whose marker it holds (appended,
fsynced with the segment); recovery re-reads the re-scanned segments from the snapshot of open
transactions saved at the first one's base and rewrites their transaction index, so a power cut cannot
lose an aborted transaction (see log_segment.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import shutil
import time
from bisect import bisect_right
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from shoal.backoff import Backoff
from shoal.broker.common.purgatory import LogKey, Purgatory
from shoal.broker.storage import fsync_worker
from shoal.broker.storage.log_config import (
    ProducePolicy,
    batch_too_large,
    needs_recompression,
    recompress,
    roll_jitter_ms,
)
from shoal.broker.storage.log_roll import first_record_with_timestamp, preallocate, roll_due
from shoal.broker.storage.log_segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    INT32_MAX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    TxnEntry,
    parse_swap_file_name,
    read_snapshot,
    segment_file_name,
    write_snapshot,
)
from shoal.broker.storage.producer_state import AbortedTxn, PartitionProducerState
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import (
    ATTRIBUTES_POS,
    HEADER_SIZE,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    InvalidRecordBatch,
    iter_batches,
    parse_batch_header,
    set_base_offset,
    set_log_append_time,
)
from shoal.protocol.records import (
    CONTROL_COMMIT,
    InvalidRecord,
    InvalidTimestamp,
    TimestampBounds,
    control_record_type,
    decode_batch,
    decode_records,
    encode_txn_marker,
    txn_marker_coordinator_epoch,
    validate_batch_for_append,
)

if TYPE_CHECKING:
    from shoal.broker.common.metrics import BrokerMetrics, CounterChild

log = structlog.get_logger(__name__)

LOG_START_CHECKPOINT = "log-start-offset.checkpoint"
# The log cleaner's first dirty offset: everything below it was compacted (Kafka keeps one such
# checkpoint per log directory; here each partition keeps its own).
CLEANER_CHECKPOINT = "cleaner-offset.checkpoint"
# Open and aborted transactions as earlier versions kept them; read once and replaced by the
# per-segment transaction index and snapshots.
TXN_STATE_FILE = "transactions.json"
# A retry after a crash is for one of a producer's last five batches, which sit near the log's end.
_REBUILD_WINDOW_BYTES = 64 * 1024 * 1024
_REBUILD_CHUNK_BYTES = 4 * 1024 * 1024
# Decides whether to delete a leading segment, given it and the base offset of the segment after it.
_SegmentPredicate = Callable[[LogSegment, int], bool]
_CHECKPOINT_VERSION = 0


@dataclass
class LogConfig:
    segment_bytes: int = 1 << 30
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 = unlimited
    retention_bytes: int = -1  # -1 = unlimited
    # cleanup.policy contains "delete": only then do retention.ms and retention.bytes remove segments.
    # A "compact"-only log is never shortened by age or size (Kafka's LogConfig.delete).
    cleanup_delete: bool = True
    flush_interval_messages: int = 2**63 - 1  # Kafka's log.flush.interval.messages
    flush_interval_ms: int | None = None  # Kafka's log.flush.interval.ms (None = never by time)
    index_interval_bytes: int = 4096
    # cleanup.policy contains "compact": the log cleaner keeps the latest record per key.
    compact: bool = False
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 24 * 3600 * 1000
    # Time-based roll (segment.ms less a random jitter below segment.jitter.ms), index size, preallocation.
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    preallocate: bool = False
    file_delete_delay_ms: int = 60_000
    # What an append as leader checks and rewrites (max.message.bytes, timestamps, compression.type).
    produce: ProducePolicy = field(default_factory=ProducePolicy)

    def __post_init__(self) -> None:
        # Index entries store file positions as int32.
        if not 0 < self.segment_bytes <= INT32_MAX:
            raise ValueError(f"segment_bytes must be in 1..{INT32_MAX}, got {self.segment_bytes}")
        if self.index_interval_bytes < 0:
            raise ValueError("index_interval_bytes must be >= 0")
        if self.flush_interval_messages < 1:
            raise ValueError("flush_interval_messages must be >= 1")


class OffsetOutOfRange(Exception):
    """The requested offset lies outside [log_start_offset, log_end_offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogClosed(Exception):
    """The log was closed or deleted."""


class AppendOrigin(enum.Enum):
    """Who appends, which decides how much is checked (Kafka's AppendOrigin)."""

    # A producer's Produce: every check, sequences included; no control batches.
    CLIENT = "client"
    # The broker's own writers (coordinators, transaction markers, dead letters): the topic's rules and
    # the record walk, control batches allowed, no sequences (their batches carry none).
    COORDINATOR = "coordinator"
    # Batches that passed a leader's checks elsewhere and are copied as they are (Kafka's follower
    # append): framing and CRC only, nothing rewritten, producer state taken from them without refusal.
    REPLICATION = "replication"


# The log line of a refused append, by origin (operators grep for "rejected produce").
_REJECTED = {
    AppendOrigin.CLIENT: "rejected produce",
    AppendOrigin.COORDINATOR: "rejected coordinator append",
    AppendOrigin.REPLICATION: "rejected replicated append",
}

# KIP-890 part 1: (transactional id, producer id, epoch, (topic, partition)) -> the transaction coordinator's
# answer to "is this partition in the producer's open transaction?" (an ErrorCode).
TransactionVerifier = Callable[[str, int, int, tuple[str, int]], int]


@dataclass(frozen=True, slots=True)
class LogContext:
    """What a partition's log knows of its place in the broker: the partition it is (the long polls' wake
    key, the per-topic metrics), whether its topic is internal, and where its appends are reported. A log
    opened without one (tests, tools) reports nowhere."""

    topic: str = ""
    topic_id: bytes = bytes(16)
    partition: int = 0
    internal: bool = False
    purgatory: Purgatory | None = None
    metrics: BrokerMetrics | None = None


class AppendRefused(Exception):
    """An append as leader refused, with the Kafka error code a Produce answers it with."""

    def __init__(self, error_code: int, message: str | None = None, *, log_start_offset: int = -1,
                 record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message or ErrorCode(error_code).name)
        self.error_code = error_code
        self.message = message
        self.log_start_offset = log_start_offset
        # (index in its batch, message) of each record that caused the refusal: Produce's RecordErrors.
        self.record_errors = tuple(record_errors)


@dataclass
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the batches were stamped with LogAppendTime
    log_start_offset: int
    # A producer's retry of a batch already in the log: nothing was appended, the offsets are the first's.
    duplicate: bool = False


@dataclass
class _FlushPlan:
    target_offset: int
    items: list[tuple[LogSegment, int, int]]  # segment, dup'ed fd, size covered
    persist: list[LogSegment]  # sealed segments whose indexes become durable with this flush
    sync_dir: bool


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig, context: LogContext | None = None) -> None:
        self.directory = directory
        self.config = config
        self.context = context or LogContext()
        self._metric_children: tuple[CounterChild, CounterChild] | None = None
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.flushed_offset = 0
        self.fsync_count = 0  # flush rounds performed (each may fsync several files)
        self._dir_dirty = False
        self._unflushed_messages = 0
        self._flush_task: asyncio.Task[None] | None = None
        # (offset, future) of `durable` callers: resolved once a flush round covers the offset.
        self._durable_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._background: asyncio.Task[None] | None = None
        self._scheduled: set[asyncio.Task[None]] = set()
        self._closed = False
        # Log cleaner state: the first offset not yet compacted, and when the oldest tombstone it kept
        # may go (None: no tombstone waits), so a log with expiring tombstones is cleaned again.
        self.cleaner_checkpoint = 0
        self.tombstone_horizon_ms: int | None = None
        self._producer_state: PartitionProducerState | None = None
        self._producer_state_loading: asyncio.Task[None] | None = None  # see load_producer_state
        # Whether this partition ever held a transactional batch (then it keeps transaction files).
        self._has_txns = False
        # Open and aborted transactions recovered at open, until the producer state is first built.
        self._txn_seed: tuple[dict[int, int], list[AbortedTxn]] | None = None
        self._roll_jitter_ms = roll_jitter_ms(config.segment_jitter_ms, config.segment_ms)

    # -- open / recovery ---------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, config: LogConfig, context: LogContext | None = None) -> PartitionLog:
        """Open (creating if missing) the log in `directory`, recovering the active segment."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        plog = cls(directory, config, context)
        plog._load()
        return plog

    def _complete_swaps(self) -> None:
        """Finish what a crash interrupted in the log cleaner: a `.cleaned` file is an unfinished clean
        (dropped); a `.swap` file is a committed one, replacing every segment with a base in its range."""
        swaps: list[tuple[int, int, str]] = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(CLEANED_SUFFIX):
                os.unlink(entry.path)
            elif (span := parse_swap_file_name(entry.name)) is not None:
                swaps.append((*span, entry.path))
        for base, end, path in sorted(swaps):
            for entry in os.scandir(self.directory):
                stem = entry.name[: -len(LOG_SUFFIX)]
                if entry.name.endswith(LOG_SUFFIX) and stem.isdigit() and base <= int(stem) < end:
                    LogSegment.remove_files(self.directory, int(stem))
            os.replace(path, self.directory / segment_file_name(base, LOG_SUFFIX))
            log.info("log.cleaner_swap_completed", dir=str(self.directory), base=base, end=end)
        if swaps:
            self._fsync_dir()

    def _load(self) -> None:
        self._complete_swaps()
        bases: list[int] = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if name.endswith((TMP_SUFFIX, DELETED_SUFFIX)):
                os.unlink(entry.path)  # an atomic write that never got renamed, or a retired segment's file
            elif name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit():
                bases.append(int(name[: -len(LOG_SUFFIX)]))
        bases.sort()
        known = set(bases)
        for entry in os.scandir(self.directory):
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                stem = entry.name[: -len(suffix)]
                if entry.name.endswith(suffix) and stem.isdigit() and int(stem) not in known:
                    os.unlink(entry.path)  # index of a segment deleted while its flush was running

        interval = self.config.index_interval_bytes
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            seg, truncated = LogSegment.open(
                self.directory, base, sealed=not last, index_interval_bytes=interval
            )
            if seg.size == 0 and not last:
                seg.delete()  # an empty sealed segment carries no offsets
                continue
            if truncated and not last:
                # Later segments would leave a hole in the offsets: the log ends here.
                log.warning("log.truncated_sealed_segment", dir=str(self.directory), base=base)
                seg.unseal()
                for later in bases[i + 1 :]:
                    LogSegment.remove_files(self.directory, later)
                self._add_segment(seg)
                break
            if truncated:
                log.warning("log.truncated_tail", dir=str(self.directory), base=base, bytes=truncated)
            self._add_segment(seg)

        checkpoint = self._read_checkpoint(LOG_START_CHECKPOINT)
        self.cleaner_checkpoint = self._read_checkpoint(CLEANER_CHECKPOINT) or 0
        if not self.segments:
            self._add_segment(
                LogSegment.create(self.directory, checkpoint or 0, index_interval_bytes=interval)
            )
        self.log_end_offset = self.active.next_offset
        if checkpoint is not None and checkpoint > self.log_end_offset:
            # The checkpoint outlived data lost in a crash: restart the log empty at the checkpoint.
            for seg in self.segments:
                seg.delete()
            self.segments.clear()
            self._bases.clear()
            self._add_segment(LogSegment.create(self.directory, checkpoint, index_interval_bytes=interval))
            self.log_end_offset = checkpoint
        self.log_start_offset = max(checkpoint or 0, self.segments[0].base_offset)
        self._recover_txns()

        # Make what survived durable so flushed_offset is honest, and persist indexes rebuilt by a scan.
        for seg in self.segments:
            if seg.flushed_size < seg.size:
                seg.fsync()
            if seg.sealed and not seg.indexes_persisted:
                seg.persist_indexes()
        self._fsync_dir()
        self.flushed_offset = self.log_end_offset

    def _add_segment(self, seg: LogSegment) -> None:
        self.segments.append(seg)
        self._bases.append(seg.base_offset)

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def high_watermark(self) -> int:
        # Single-replica broker: everything appended is committed.
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """Below this offset every transaction is decided (read_committed reads stop here)."""
        if self._producer_state is None and not self._has_txns:
            return self.high_watermark  # never saw a transaction: no need to build producer state
        return self.producer_state.last_stable_offset(self.high_watermark)

    @property
    def producer_state(self) -> PartitionProducerState:
        """Producers' sequences and transactions, rebuilt on first use from the saved transactions and
        the tail of the log."""
        if self._producer_state is None:
            self._producer_state = self._rebuild_producer_state()
        return self._producer_state

    async def load_producer_state(self, *, only_for_transactions: bool = False) -> None:
        """Build the producer state now if it is not built yet, one chunk of the log's tail at a time with
        a turn for the event loop after each, so that the first touch of a partition after a restart does
        not stall every other request while up to 64 MiB are read. Callers on the request path await this
        before they use `producer_state` or `last_stable_offset`.

        `only_for_transactions`: skip it when `last_stable_offset` would not build the state (the
        partition never saw a transaction).
        """
        if self._producer_state is not None:
            return
        if only_for_transactions and not self._has_txns:
            return
        if self._producer_state_loading is None:
            # One build, shared by every request that arrives while it runs.
            self._producer_state_loading = asyncio.get_running_loop().create_task(self._load_producer_state())
        await asyncio.shield(self._producer_state_loading)

    async def _load_producer_state(self) -> None:
        steps = self._rebuild_steps()
        try:
            while True:
                next(steps)
                await asyncio.sleep(0)
                if self._producer_state is not None:
                    return  # something needed it meanwhile and built it in one go: that one stands
        except StopIteration as done:
            if self._producer_state is None:
                self._producer_state = done.value
        except Exception:
            # Retention or a deletion changed the log mid-way: the next use builds it in one go.
            log.warning("log.producer_state_load_abandoned", dir=str(self.directory), exc_info=True)
        finally:
            self._producer_state_loading = None

    def _rebuild_producer_state(self) -> PartitionProducerState:
        steps = self._rebuild_steps()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                state: PartitionProducerState = done.value
                return state

    def _rebuild_steps(self) -> Generator[None, None, PartitionProducerState]:
        """Sequences from the tail of the log, and open and aborted transactions as recovered at open;
        pauses (yields) after each chunk it reads and returns the state."""
        state = PartitionProducerState()
        start = self.log_end_offset
        covered = 0
        for seg in reversed(self.segments):
            start = max(seg.base_offset, self.log_start_offset)
            covered += seg.size
            if covered >= _REBUILD_WINDOW_BYTES:
                break
        offset = start
        while offset < self.log_end_offset:
            data = self.read(offset, _REBUILD_CHUNK_BYTES)
            if not data:
                break
            for pos, header in iter_batches(data):
                self._track_batch(state, data, pos, header)
                offset = header.last_offset + 1
            yield
        ongoing, aborted = self._txn_seed or ({}, [])
        self._txn_seed = None
        state.ongoing = dict(ongoing)
        state.aborted = list(aborted)
        state.drop_aborted_before(self.log_start_offset)
        return state

    @staticmethod
    def _track_batch(state: PartitionProducerState, data: bytes | bytearray, pos: int, header: BatchHeader) -> None:
        if header.producer_id >= 0 and header.base_sequence >= 0 and not header.is_control:
            # The offset span, not the record count: compaction may have removed records (or all of
            # them, keeping an empty batch) while the sequence range stays the batch's own.
            state.record(header.producer_id, header.producer_epoch, header.base_sequence,
                         header.last_offset_delta + 1, header.base_offset, header.max_timestamp)
        PartitionLog._track_txn(state, data, pos, header)

    @staticmethod
    def _track_txn(state: PartitionProducerState, data: bytes | bytearray | memoryview, pos: int,
                   header: BatchHeader) -> AbortedTxn | None:
        """Open or end a transaction; the aborted transaction an ABORT marker ends, if any."""
        if header.is_control:
            try:
                _h, records = decode_batch(data, pos, check_crc=False)
                commit = bool(records) and control_record_type(records[0]) == CONTROL_COMMIT
                coordinator_epoch = txn_marker_coordinator_epoch(records[0]) if records else -1
            except InvalidRecordBatch:
                return None
            return state.on_marker(header.producer_id, header.producer_epoch, commit, header.base_offset,
                                   coordinator_epoch)
        if header.is_transactional:
            state.on_transactional_batch(header.producer_id, header.base_offset)
        return None

    # -- transaction recovery ----------------------------------------------------------------------

    def _recover_txns(self) -> None:
        """Rebuild the transaction index of every segment recovery could not trust, from the snapshot
        of open transactions at the first one's base (Kafka rebuilds it from its producer snapshot the
        same way), and keep the open and aborted transactions for the producer state."""
        snapshots: set[int] = set()
        has_index = False
        bases = {seg.base_offset for seg in self.segments}
        for entry in os.scandir(self.directory):
            stem = entry.name[: -len(SNAPSHOT_SUFFIX)]
            if entry.name.endswith(SNAPSHOT_SUFFIX) and stem.isdigit():
                if int(stem) in bases:
                    snapshots.add(int(stem))
                else:
                    os.unlink(entry.path)  # of a segment deleted or merged away
            elif entry.name.endswith(TXN_INDEX_SUFFIX):
                has_index = True
        legacy = self.directory / TXN_STATE_FILE
        if legacy.exists():
            self._migrate_legacy_txn_state(legacy)
            snapshots.add(self.active.base_offset)
        elif not snapshots and not has_index:
            return
        self._has_txns = True
        first = next(i for i, seg in enumerate(self.segments) if not seg.txn_index_trusted or seg is self.active)
        ongoing: dict[int, int] | None = None
        while ongoing is None:
            if self.segments[first].base_offset in snapshots:
                ongoing = read_snapshot(self.directory, self.segments[first].base_offset)
            if ongoing is None and first == 0:
                ongoing = {}
            elif ongoing is None:
                first -= 1
        state = PartitionProducerState()
        state.ongoing = dict(ongoing)
        aborted = [AbortedTxn(p, f, la) for seg in self.segments[:first] for p, f, la, _lso in seg.txn_entries]
        at_active = state.ongoing
        for seg in self.segments[first:]:
            if seg is self.active:
                at_active = dict(state.ongoing)
            entries: list[TxnEntry] = []
            position = 0
            while position < seg.size:
                data, _stopped = seg.read_batches(position, _REBUILD_CHUNK_BYTES, min_one=True)
                if not data:
                    break
                for pos, header in iter_batches(data):
                    if header.is_transactional:
                        txn = self._track_txn(state, data, pos, header)
                        if txn is not None:
                            lso = state.last_stable_offset(txn.last_offset + 1)
                            entries.append((txn.producer_id, txn.first_offset, txn.last_offset, lso))
                            aborted.append(txn)
                position += len(data)
            if seg is not self.active:
                seg.end_snapshot = dict(state.ongoing)
            seg.rewrite_txn_index(entries)
        checkpoint = self.cleaner_checkpoint
        if self.log_start_offset <= checkpoint <= self.log_end_offset:
            # The cleaner only cleans below the last stable offset: a transaction that started below
            # its checkpoint had ended, even if compaction removed its marker since.
            state.ongoing = {p: f for p, f in state.ongoing.items() if f >= checkpoint}
        aborted.sort(key=lambda t: t.last_offset)
        self._txn_seed = (state.ongoing, aborted)
        if self.active.base_offset not in snapshots:
            write_snapshot(self.directory, self.active.base_offset, at_active)

    def _migrate_legacy_txn_state(self, path: Path) -> None:
        """Move an earlier version's transactions.json into transaction indexes and a snapshot."""
        try:
            saved = json.loads(path.read_text())
            ongoing = {int(pid): int(first) for pid, first in saved["ongoing"]}
            aborted = [AbortedTxn(int(p), int(f), int(la)) for p, f, la in saved["aborted"]]
        except (ValueError, KeyError, TypeError):
            log.warning("log.bad_txn_state", dir=str(self.directory))
            ongoing, aborted = {}, []
        for seg in self.segments:
            entries = [(t.producer_id, t.first_offset, t.last_offset, t.last_offset + 1) for t in aborted
                       if seg.base_offset <= t.last_offset < seg.next_offset]
            if seg.indexes_persisted:  # the others are re-scanned
                seg.rewrite_txn_index(entries)
        # Open at the active segment's base: still open, or aborted by a marker in it. Transactions
        # opened in the active segment are found again by its re-scan.
        base = self.active.base_offset
        at_base = {p: f for p, f in ongoing.items() if f < base}
        at_base.update({t.producer_id: t.first_offset for t in aborted if t.first_offset < base <= t.last_offset})
        write_snapshot(self.directory, base, at_base)
        os.unlink(path)
        log.info("log.txn_state_migrated", dir=str(self.directory), aborted=len(aborted))

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget idle producers (producer.id.expiration.ms); a state never built has nothing to forget."""
        if self._producer_state is None:
            return 0
        return self._producer_state.expire_producers(now_ms, expiration_ms)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end) (what a read_committed fetch of that range
        lists, and the log cleaner). A partition that never saw a transaction has none: its producer state
        is not built for this (that reads up to 64 MiB of the log's tail)."""
        if self._producer_state is None and not self._has_txns:
            return []
        return self.producer_state.aborted_between(start, end)

    def forget_aborted(self, txns: list[AbortedTxn]) -> None:
        """The log cleaner removed these transactions' ABORT markers (their batches went first)."""
        gone = set(txns)
        state = self.producer_state
        state.aborted = [t for t in state.aborted if t not in gone]

    def append_marker(self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      timestamp_ms: int, transaction_version: int = 0) -> AppendResult:
        """Write a transaction's COMMIT or ABORT control batch and close the transaction here. A
        transaction.version 2 marker must carry an epoch above the producer's (KIP-1228): checked here,
        since the batch itself does not say which version wrote it."""
        if transaction_version >= 2:
            refused = self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch,
                                                       transaction_version)
            if refused is not None:
                raise AppendRefused(*refused)
        batch = encode_txn_marker(commit=commit, producer_id=producer_id, producer_epoch=producer_epoch,
                                  coordinator_epoch=coordinator_epoch, timestamp=timestamp_ms)
        return self.append_as_leader(batch, origin=AppendOrigin.COORDINATOR)

    # -- append ------------------------------------------------------------------------------------

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview | None,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        internal_topics_allowed: bool = False,
        transactional_id: str | None = None,
        verify_transaction: TransactionVerifier | None = None,
        handed_over: bool = False,
        single_batch: bool = False,
    ) -> AppendResult:
        """Check `records` as `origin` requires, append them (page cache only; `flush` makes them durable),
        track their producers and transactions, wake the partition's long polls and count them.

        `single_batch`: a Produce request's record set (v3 and later), which Kafka allows exactly one batch.

        With `handed_over` the caller gives up `records` (a Produce request's record set, a view into
        the request's own frame): when writable it is patched in place (base offsets, LogAppendTime),
        not copied first.

        Raises AppendRefused with the Kafka error code when the records are refused; nothing is appended
        then. A client's retry of one of its producer's last batches is answered with that batch's
        offsets (`duplicate`) and appends nothing. `internal_topics_allowed` and the transaction
        verification apply to CLIENT appends (Kafka's admin client id may write internal topics).
        """
        self._check_open()
        ctx = self.context
        client = origin is AppendOrigin.CLIENT
        if client and ctx.internal and not internal_topics_allowed:
            log.warning("rejected produce to an internal topic", topic=ctx.topic, partition=ctx.partition)
            raise AppendRefused(ErrorCode.INVALID_TOPIC_EXCEPTION, f"Cannot append to internal topic {ctx.topic}")
        if client:
            self._verify_transaction(records, transactional_id, verify_transaction)
        if not records:
            raise AppendRefused(ErrorCode.CORRUPT_MESSAGE, "empty record set")
        buf: bytearray | memoryview
        if handed_over and isinstance(records, (bytearray, memoryview)) and not _readonly(records):
            buf = records
        else:
            buf = bytearray(records)
        policy = self.config.produce
        stamp = policy.log_append_time and origin is not AppendOrigin.REPLICATION
        try:
            if origin is AppendOrigin.REPLICATION:
                headers = list(iter_batches(buf, check_crc=True))
            else:
                buf, headers = self._validate(buf, policy, stamp, origin)
        except InvalidRecordBatch as exc:
            # Kafka separates a batch that breaks the rules (INVALID_RECORD, not retried) from damaged bytes.
            code = (ErrorCode.INVALID_TIMESTAMP if isinstance(exc, InvalidTimestamp)
                    else ErrorCode.INVALID_RECORD if isinstance(exc, InvalidRecord) else ErrorCode.CORRUPT_MESSAGE)
            log.warning(_REJECTED[origin], topic=ctx.topic, partition=ctx.partition, error=str(exc),
                        error_code=int(code))
            if isinstance(exc, InvalidRecord) and exc.keyless:
                # Kafka's LogValidator: one RecordError per keyless record, and a summary as the message.
                errors = [(index, f"{exc} in topic partition {ctx.topic}-{ctx.partition}.") for index in exc.keyless]
                shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
                raise AppendRefused(code, f"One or more records have been rejected due to {len(errors)} record "
                                          f"errors in total, and only showing the first three errors at most: "
                                          f"[{shown}]", record_errors=errors) from exc
            raise AppendRefused(code, str(exc)) from exc
        if single_batch and len(headers) != 1:
            message = (f"Produce requests with version 3 and above are only allowed to contain exactly one record "
                       f"batch per partition; {ctx.topic}-{ctx.partition} had {len(headers)}")
            log.warning(_REJECTED[origin], topic=ctx.topic, partition=ctx.partition, error=message,
                        error_code=int(ErrorCode.INVALID_RECORD))
            raise AppendRefused(ErrorCode.INVALID_RECORD, message)
        if origin is not AppendOrigin.REPLICATION and any(h.is_control for _p, h in headers):
            self._check_markers(buf, headers)
        # Only idempotent batches need the producer state; touching it first rebuilds it from the log's tail.
        idempotent = [h for _p, h in headers if h.producer_id >= 0 and h.base_sequence >= 0 and not h.is_control]
        state = self.producer_state if idempotent else None
        if state is not None and client:
            for header in idempotent:
                check = state.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                    header.records_count)
                if check.error != ErrorCode.NONE:
                    raise AppendRefused(check.error, log_start_offset=self.log_start_offset)
                if check.duplicate_offset >= 0:
                    # A retry of a batch we already appended: answer with its original offset, append nothing.
                    return AppendResult(check.duplicate_offset, check.duplicate_offset + header.records_count - 1,
                                        -1, self.log_start_offset, duplicate=True)
        append_time = int(time.time() * 1000) if stamp else -1
        result = self.append(buf, headers, log_append_time_ms=append_time if stamp else None)
        if state is not None:
            # append() set each header's base offset.
            for header in idempotent:
                state.record(header.producer_id, header.producer_epoch, header.base_sequence,
                             header.last_offset_delta + 1, header.base_offset,
                             append_time if stamp else header.max_timestamp)
        self._count(sum(h.records_count for _p, h in headers), len(buf))
        if ctx.purgatory is not None:
            # Fetch and ShareFetch long polls on this partition see the new records now.
            ctx.purgatory.notify(LogKey(ctx.topic_id, ctx.partition))
        return result

    def _check_markers(self, buf: bytearray | memoryview, headers: list[tuple[int, BatchHeader]]) -> None:
        """Refuse end-transaction markers from a fenced producer epoch or a fenced coordinator epoch."""
        state = self.producer_state
        for pos, header in headers:
            if not header.is_control:
                continue
            try:
                _h, records = decode_batch(buf, pos, check_crc=False)
                coordinator_epoch = txn_marker_coordinator_epoch(records[0]) if records else -1
            except InvalidRecordBatch as exc:
                raise AppendRefused(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
            refused = state.check_marker(header.producer_id, header.producer_epoch, coordinator_epoch)
            if refused is not None:
                code, message = refused
                log.info("transaction marker refused", topic=self.context.topic, partition=self.context.partition,
                         producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                         coordinator_epoch=coordinator_epoch, error=ErrorCode(code).name)
                raise AppendRefused(code, message)

    def _validate(self, buf: bytearray | memoryview, policy: ProducePolicy, stamp: bool,
                  origin: AppendOrigin) -> tuple[bytearray | memoryview, list[tuple[int, BatchHeader]]]:
        """Kafka's LogValidator over the batches in `buf`: their size against max.message.bytes, CRC and
        records, timestamps (CreateTime), keys of a compacted topic; then the topic's compression.type.
        Returns the batches to append (`buf`, or its recompressed copy) and their headers."""
        bounds = None if stamp else TimestampBounds(
            int(time.time() * 1000), policy.timestamp_before_max_ms, policy.timestamp_after_max_ms
        )
        headers = list(iter_batches(buf))
        for pos, header in headers:
            self._check_size(header, policy, origin)
            validate_batch_for_append(buf, pos, header, timestamp_bounds=bounds, require_keys=self.config.compact,
                                      from_client=origin is AppendOrigin.CLIENT)
        # As Kafka, control batches (transaction markers) are never compressed by the broker.
        if needs_recompression(headers, policy) and not any(h.is_control for _p, h in headers):
            buf, headers = recompress(buf, headers, policy)
            for _pos, header in headers:
                self._check_size(header, policy, origin)
        return buf, headers

    def _check_size(self, header: BatchHeader, policy: ProducePolicy, origin: AppendOrigin) -> None:
        too_large = batch_too_large(header, policy)
        if too_large is not None:
            log.info(_REJECTED[origin], topic=self.context.topic, partition=self.context.partition, error=too_large)
            raise AppendRefused(ErrorCode.MESSAGE_TOO_LARGE, too_large)

    def _verify_transaction(self, records: bytes | bytearray | memoryview | None, transactional_id: str | None,
                            verify: TransactionVerifier | None) -> None:
        """KIP-890 part 1 (Kafka's ReplicaManager transaction verification): the first transactional batch
        of a producer on a partition is appended only if the coordinator has the partition in that
        producer's open transaction, so a late retry after an abort or a fenced producer's write cannot
        open a transaction no one will end."""
        # Most batches are not transactional: one byte of the attributes says so, without parsing the header.
        if not records or len(records) < HEADER_SIZE or not records[ATTRIBUTES_POS + 1] & TRANSACTIONAL_FLAG:
            return
        try:
            header = parse_batch_header(records, 0, whole=False)
        except InvalidRecordBatch:
            return  # the validation answers with the right error
        if not header.is_transactional:
            return
        if transactional_id is None:
            # Kafka refuses transactional records without a transactional id the same way.
            raise AppendRefused(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if verify is None or header.producer_id in self.producer_state.ongoing:
            return
        ctx = self.context
        code = verify(transactional_id, header.producer_id, header.producer_epoch, (ctx.topic, ctx.partition))
        if code == ErrorCode.PRODUCER_FENCED:
            code = ErrorCode.INVALID_PRODUCER_EPOCH  # what Produce has always answered a fenced producer
        if code != ErrorCode.NONE:
            log.info("transactional produce refused by verification", transactional_id=transactional_id,
                     topic=ctx.topic, partition=ctx.partition, producer_id=header.producer_id,
                     producer_epoch=header.producer_epoch, error_code=int(code))
            raise AppendRefused(code)

    def _count(self, records: int, size: int) -> None:
        metrics = self.context.metrics
        if metrics is None:
            return
        children = self._metric_children
        if children is None:
            # Looking a child up by its label costs more than the count: keep this topic's.
            topic = self.context.topic
            children = self._metric_children = (metrics.messages_in.labels(topic=topic),
                                                metrics.log_bytes_in.labels(topic=topic))
        children[0].inc(records)
        children[1].inc(size)

    def append(
        self,
        batches: bytearray | memoryview,
        headers: list[tuple[int, BatchHeader]],
        *,
        log_append_time_ms: int | None = None,
    ) -> AppendResult:
        """Assign offsets to validated v2 batches and write them to the active segment (page cache only).

        `headers` are (position in `batches`, header) as from `iter_batches`; the headers are updated
        in place with their assigned offsets. With `log_append_time_ms` each batch is stamped with
        LogAppendTime (topic config message.timestamp.type=LogAppendTime).
        """
        self._check_open()
        if not headers:
            raise ValueError("append needs at least one batch")
        base_offset = self.log_end_offset
        next_offset = base_offset
        records = 0
        for pos, header in headers:
            set_base_offset(batches, pos, next_offset)
            header.base_offset = next_offset
            if log_append_time_ms is not None:
                set_log_append_time(batches, pos, header, log_append_time_ms)
            next_offset = header.last_offset + 1
            records += header.records_count
        last_offset = next_offset - 1

        seg = self.active
        if seg.size > 0 and (
            seg.size + len(batches) > self.config.segment_bytes
            or last_offset - seg.base_offset > INT32_MAX
            or self._compaction_roll_due(seg, headers)
            or roll_due(seg, self.config.segment_ms, self.config.segment_index_bytes, headers, self._roll_jitter_ms)
        ):
            seg = self._roll(base_offset)
        # Built before the write, so the rebuild does not see these batches too.
        state = self.producer_state if any(h.is_transactional for _p, h in headers) else None
        if state is not None and not self._has_txns:
            # The partition's first transaction: from here on recovery reads its transaction files.
            write_snapshot(self.directory, seg.base_offset, {})
            self._has_txns = True
            self._dir_dirty = True
        seg.append(batches, headers)
        self.log_end_offset = next_offset
        if state is not None:
            ended: list[AbortedTxn] = []
            for pos, header in headers:
                if header.is_control:
                    txn = self._track_txn(state, batches, pos, header)
                    if txn is not None:
                        ended.append(txn)
                elif header.is_transactional and header.producer_id not in state.ongoing:
                    state.on_transactional_batch(header.producer_id, header.base_offset)
            for txn in ended:
                seg.append_txn_entry((txn.producer_id, txn.first_offset, txn.last_offset,
                                      state.last_stable_offset(self.log_end_offset)))

        self._unflushed_messages += records
        if self._unflushed_messages >= self.config.flush_interval_messages:
            self._unflushed_messages = 0
            self._schedule_flush(sync_fallback=True)
        return AppendResult(
            base_offset=base_offset,
            last_offset=last_offset,
            log_append_time=-1 if log_append_time_ms is None else log_append_time_ms,
            log_start_offset=self.log_start_offset,
        )

    def _compaction_roll_due(self, seg: LogSegment, headers: list[tuple[int, BatchHeader]]) -> bool:
        """Kafka rolls a compacted log's active segment once it spans max.compaction.lag.ms (its
        maxSegmentMs), so the cleaner, which never touches the active segment, can meet that bound."""
        lag = self.config.max_compaction_lag_ms
        if not self.config.compact or lag >= 2**63 - 1 or seg.first_timestamp is None or seg.first_timestamp < 0:
            return False
        return max(h.max_timestamp for _, h in headers) - seg.first_timestamp > lag

    def _roll(self, base_offset: int) -> LogSegment:
        if self._has_txns:
            self.active.end_snapshot = dict(self.producer_state.ongoing)
        self.active.seal()
        seg = LogSegment.create(
            self.directory, base_offset, index_interval_bytes=self.config.index_interval_bytes
        )
        self._roll_jitter_ms = roll_jitter_ms(self.config.segment_jitter_ms, self.config.segment_ms)
        if self.config.preallocate:
            preallocate(seg, self.config.segment_bytes)
        self._add_segment(seg)
        self._dir_dirty = True
        # Like Kafka, flush the sealed segment soon so its indexes reach disk and reopen stays cheap.
        self._schedule_flush(sync_fallback=False)
        return seg

    def _schedule_flush(self, *, sync_fallback: bool, metadata: bool = False) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if sync_fallback:
                self.flush_sync()
            return
        task = loop.create_task(self.flush_metadata() if metadata else self.flush())
        self._scheduled.add(task)
        task.add_done_callback(self._scheduled_done)

    def _scheduled_done(self, task: asyncio.Task[None]) -> None:
        self._scheduled.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("log.flush_failed", dir=str(self.directory), error=repr(task.exception()))

    # -- flush (group commit) ----------------------------------------------------------------------

    async def flush(self, up_to_offset: int | None = None) -> None:
        """Return once every offset below `up_to_offset` (default: the log end offset) is fsynced.

        At most one flush round runs at a time; callers arriving meanwhile wait for it and, if it did
        not cover them, share the next one.
        """
        target = self.log_end_offset if up_to_offset is None else min(up_to_offset, self.log_end_offset)
        while self.flushed_offset < target:
            self._check_open()
            task = self._flush_task
            if task is None:
                task = self._start_round()
            # Shield: a cancelled waiter must not cancel the round others are waiting on.
            await asyncio.shield(task)

    def durable(self, up_to_offset: int) -> asyncio.Future[None] | None:
        """`flush(up_to_offset)` without a task per caller (acks=all Produce): None when every offset below
        it is fsynced already, else a future resolved once a flush round covers it, or failed with the
        round's error. Callers share rounds with `flush` callers."""
        target = min(up_to_offset, self.log_end_offset)
        if self.flushed_offset >= target:
            return None
        self._check_open()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._durable_waiters.append((target, waiter))
        if self._flush_task is None:
            self._start_round()
        return waiter

    def _start_round(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._flush_round())
        task.add_done_callback(self._round_done)
        self._flush_task = task
        return task

    def _round_done(self, task: asyncio.Task[None]) -> None:
        """A flush round ended: on an error its `durable` waiters fail with it (as `flush` callers do);
        waiters it did not cover (they came during the round) get the next round."""
        error: BaseException | None = asyncio.CancelledError() if task.cancelled() else task.exception()
        if error is not None:
            self._fail_durable(error)
        elif self._durable_waiters and self._flush_task is None:
            if self._closed:
                self._fail_durable(LogClosed(str(self.directory)))
            else:
                self._start_round()

    def _wake_durable(self) -> None:
        waiters = self._durable_waiters
        if not waiters:
            return
        flushed = self.flushed_offset
        self._durable_waiters = [(target, w) for target, w in waiters if target > flushed and not w.done()]
        for target, waiter in waiters:
            if target <= flushed and not waiter.done():
                waiter.set_result(None)

    def _fail_durable(self, error: BaseException) -> None:
        waiters, self._durable_waiters = self._durable_waiters, []
        for _target, waiter in waiters:
            if waiter.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                waiter.cancel()
            else:
                waiter.set_exception(error)

    async def flush_metadata(self) -> None:
        """One flush round even when no offset awaits an fsync: it persists sealed segments' indexes and
        the directory (after the log cleaner swapped segments in)."""
        while self._flush_task is not None:
            await asyncio.shield(self._flush_task)
        self._check_open()
        await asyncio.shield(self._start_round())

    async def _flush_round(self) -> None:
        plan: _FlushPlan | None = None
        try:
            plan = self._plan_flush()
            loop = asyncio.get_running_loop()
            fsync = None if plan.persist else fsync_worker.for_loop(loop)
            if fsync is not None:
                await fsync.sync([fd for _, fd, _ in plan.items], self.directory if plan.sync_dir else None)
            else:
                await loop.run_in_executor(None, self._execute_flush, self.directory, plan)
        except BaseException:
            self._dir_dirty = True
            _txn_indexes_unsynced(plan)
            raise
        finally:
            self._flush_task = None
        self._finish_flush(plan)

    def flush_sync(self) -> None:
        """Blocking flush of everything, for shutdown and callers without an event loop."""
        plan = self._plan_flush()
        try:
            self._execute_flush(self.directory, plan)
        except BaseException:
            self._dir_dirty = True
            _txn_indexes_unsynced(plan)
            raise
        self._finish_flush(plan)

    def _plan_flush(self) -> _FlushPlan:
        items: list[tuple[LogSegment, int, int]] = []
        persist: list[LogSegment] = []
        try:
            for seg in self.segments:
                if seg.flushed_size < seg.size:
                    # A dup'ed fd keeps the fsync safe if retention closes the segment meanwhile.
                    items.append((seg, os.dup(seg.fd), seg.size))
                txn_fd = seg.txn_fd_for_flush()
                if txn_fd >= 0:
                    items.append((seg, txn_fd, -1))  # its transaction index, durable with the log
                if seg.sealed and not seg.indexes_persisted:
                    persist.append(seg)
        except BaseException:
            for _, fd, _ in items:
                os.close(fd)
            raise
        sync_dir = self._dir_dirty or bool(persist)
        self._dir_dirty = False
        self._unflushed_messages = 0
        return _FlushPlan(self.log_end_offset, items, persist, sync_dir)

    @staticmethod
    def _execute_flush(directory: Path, plan: _FlushPlan) -> None:
        """The blocking part of a flush; runs in a worker thread for async callers."""
        try:
            for _, fd, _ in plan.items:
                os.fsync(fd)
        finally:
            for _, fd, _ in plan.items:
                os.close(fd)
        for seg in plan.persist:
            seg.persist_indexes()
        if plan.sync_dir:
            fsync_directory(directory)

    def _finish_flush(self, plan: _FlushPlan) -> None:
        for seg, _, size in plan.items:
            seg.flushed_size = max(seg.flushed_size, size)
        self.flushed_offset = max(self.flushed_offset, plan.target_offset)
        self.fsync_count += 1
        self._wake_durable()

    def _fsync_dir(self) -> None:
        fsync_directory(self.directory)
        self._dir_dirty = False

    def start_background(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the periodic flush task for `flush_interval_ms` (no-op when it is None)."""
        if self.config.flush_interval_ms is None or self._background is not None:
            return
        loop = loop or asyncio.get_running_loop()
        self._background = loop.create_task(self._flush_periodically(self.config.flush_interval_ms / 1000))

    async def stop_background(self) -> None:
        task, self._background = self._background, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _flush_periodically(self, interval_s: float) -> None:
        failures = Backoff(initial=interval_s, maximum=max(interval_s, 60.0))
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            if not failures.ready("flush", now):
                continue  # a failing disk is retried less and less often
            try:
                if self.flushed_offset < self.log_end_offset:
                    await self.flush()
                failures.succeeded("flush")
            except LogClosed:
                return
            except OSError as exc:
                suppressed = failures.failed("flush", now)
                if suppressed is not None:
                    log.error("log.periodic_flush_failed", dir=str(self.directory), error=repr(exc),
                              failures_not_logged=suppressed)

    # -- reads -------------------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        return max(0, bisect_right(self._bases, offset) - 1)

    def read(self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None, min_one: bool = True) -> bytes:
        """Whole batches from the one containing `fetch_offset`, within `max_bytes`; with `min_one` at least
        one batch even when it is larger (Kafka's minOneMessage), else nothing when the first batch does not fit.

        `max_offset` (exclusive, e.g. a last stable offset) stops before batches starting at or above it.
        """
        self._check_open()
        if fetch_offset < self.log_start_offset or fetch_offset > self.log_end_offset:
            raise OffsetOutOfRange(fetch_offset, self.log_start_offset, self.log_end_offset)
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        if fetch_offset >= limit or (max_bytes <= 0 and not min_one):
            return b""
        i = self._segment_index(fetch_offset)
        seg = self.segments[i]
        position = seg.position_of(fetch_offset)
        parts: list[bytes] = []
        remaining = max_bytes
        while True:
            data, stopped = seg.read_batches(position, remaining, min_one=min_one and not parts, max_offset=limit)
            if data:
                parts.append(data)
                remaining -= len(data)
            i += 1
            if stopped or remaining <= 0 or i >= len(self.segments):
                break
            seg = self.segments[i]
            position = 0
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_batch_headers(
        self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None
    ) -> list[tuple[BatchHeader, memoryview]]:
        """Like `read`, split into (header, batch bytes) pairs."""
        data = memoryview(self.read(fetch_offset, max_bytes, max_offset=max_offset))
        return [(header, data[pos : pos + header.size]) for pos, header in iter_batches(data)]

    def bytes_from(self, offset: int, enough: int) -> int:
        """Bytes of the log from the batch holding `offset` to the log end, counted up to at least
        `enough` (a long poll's MinBytes); 0 at or past the end."""
        self._check_open()
        if offset >= self.log_end_offset:
            return 0
        offset = max(offset, self.log_start_offset)
        i = self._segment_index(offset)
        total = self.segments[i].size - self.segments[i].position_of(offset)
        for seg in self.segments[i + 1 :]:
            if total >= enough:
                break
            total += seg.size
        return total

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start whose timestamp is >=
        `timestamp_ms`, else None. As in Kafka: the first batch whose max timestamp reaches it is found
        through the time index, then its records are read to pick the record itself."""
        self._check_open()
        for seg in self.segments[self._segment_index(self.log_start_offset) :]:
            header = seg.find_timestamp(timestamp_ms, self.log_start_offset)
            if header is not None:
                start = max(header.base_offset, self.log_start_offset)
                for h, view in self.read_batch_headers(start, header.size):
                    if h.base_offset != header.base_offset:
                        continue
                    for record in decode_records(view, 0, h):
                        if record.offset >= start and record.timestamp >= timestamp_ms:
                            return record.offset, record.timestamp
                return start, header.max_timestamp
        return None

    def max_timestamp(self) -> tuple[int, int]:
        """(offset, timestamp) of the record with the largest timestamp; (-1, -1) if the log is empty."""
        self._check_open()
        if self.log_start_offset >= self.log_end_offset:
            return -1, -1
        best_ts, best_seg = -1, None
        for seg in self.segments:
            if seg.max_timestamp > best_ts and seg.next_offset > self.log_start_offset:
                best_ts, best_seg = seg.max_timestamp, seg
        if best_seg is None:
            return -1, -1
        # KAFKA-16310: the first record carrying the largest timestamp, found in the first batch with it.
        header = best_seg.find_timestamp(best_ts, self.log_start_offset)
        if header is None:
            return max(best_seg.offset_of_max_timestamp, self.log_start_offset), best_ts
        return first_record_with_timestamp(self.read_batch_headers, self.log_start_offset, header, best_ts), best_ts

    # -- deletion ----------------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: advance the log start offset (never past the high watermark), drop whole segments
        below it, and persist it. Returns the new log start offset."""
        self._check_open()
        if offset == -1:
            offset = self.high_watermark  # DeleteRecords' "everything up to the high watermark"
        elif offset < 0:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
        new_start = min(offset, self.high_watermark)
        if new_start <= self.log_start_offset:
            return self.log_start_offset
        self.log_start_offset = new_start
        self._write_checkpoint(new_start)
        if self.active.next_offset <= new_start and self.active.size > 0:
            # Everything is deleted: roll so the old active segment's bytes can go too.
            self._roll(self.log_end_offset)
        self._delete_leading(lambda seg, nxt: nxt <= new_start)
        return self.log_start_offset

    def enforce_retention(self, now_ms: int) -> int:
        """Delete sealed segments below the log start offset and, when cleanup.policy includes delete, past
        retention.ms or retention.bytes, oldest first. Returns the count."""
        self._check_open()
        deleted = self._delete_leading(lambda seg, nxt: nxt <= self.log_start_offset)
        if not self.config.cleanup_delete:
            return deleted
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:

            def expired(seg: LogSegment, _next_base: int) -> bool:
                # Kafka ages a segment by its largest record timestamp, the file mtime if it has none.
                newest = seg.max_timestamp if seg.max_timestamp >= 0 else seg.last_modified_ms()
                return now_ms - newest > retention_ms

            deleted += self._delete_leading(expired)
            deleted += self._roll_to_delete(expired)
        if self.config.retention_bytes >= 0:
            excess = self.size_bytes() - self.config.retention_bytes

            def over_size(seg: LogSegment, _next_base: int) -> bool:
                nonlocal excess
                if excess - seg.size < 0:
                    return False
                excess -= seg.size
                return True

            deleted += self._delete_leading(over_size)
            deleted += self._roll_to_delete(over_size)
        return deleted

    def _roll_to_delete(self, predicate: _SegmentPredicate) -> int:
        """As Kafka does, roll a non-empty active segment that retention would delete, then delete it: a
        topic smaller than one segment still ages out."""
        seg = self.active
        if len(self.segments) == 1 and seg.size > 0 and predicate(seg, self.log_end_offset):
            self._roll(self.log_end_offset)
            return self._delete_leading(lambda old, _nxt: old is seg)
        return 0

    def _delete_leading(self, predicate: _SegmentPredicate) -> int:
        """Delete sealed segments from the front while `predicate(segment, next segment base)` holds."""
        deleted = 0
        while len(self.segments) > 1 and predicate(self.segments[0], self.segments[1].base_offset):
            seg = self.segments.pop(0)
            self._bases.pop(0)
            seg.delete_later(self.config.file_delete_delay_ms)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / segment_file_name(seg.base_offset, SNAPSHOT_SUFFIX)).unlink()
            deleted += 1
        if deleted:
            first = self.segments[0].base_offset
            if first > self.log_start_offset:
                self.log_start_offset = first
                self._write_checkpoint(first)
            if self._producer_state is not None:
                self._producer_state.drop_aborted_before(self.log_start_offset)
        return deleted

    # -- log compaction ----------------------------------------------------------------------------

    def replace_segments(self, old: list[LogSegment], new: LogSegment, swap_path: Path, *, flush: bool = True) -> bool:
        """Swap the log cleaner's output (`new`, fsynced and committed as `swap_path`) in for the
        consecutive sealed segments `old`. Runs on the event loop, where reads run, so no read sees half
        a swap. False (and the swap file removed) if retention, DeleteRecords or a close changed those
        segments meanwhile."""
        at = next((i for i, seg in enumerate(self.segments) if seg is old[0]), -1)
        if (
            self._closed
            or at < 0
            or at + len(old) >= len(self.segments)  # the active segment is never replaced
            or any(a is not b for a, b in zip(self.segments[at : at + len(old)], old, strict=False))
        ):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(swap_path)
            new.close()
            return False
        # Old index files go before the rename, so none is ever taken for the new file's.
        old[0].retire(keep_log=True)
        for seg in old[1:]:
            seg.retire(keep_log=False)
        os.replace(swap_path, old[0].log_path)
        new.flushed_size = new.size
        self.segments[at : at + len(old)] = [new]
        self._bases[at : at + len(old)] = [new.base_offset]
        self._dir_dirty = True
        if flush:
            self.schedule_metadata_flush()
        return True

    def schedule_metadata_flush(self) -> None:
        """A flush round soon, which persists the new segments' indexes and makes the renames durable."""
        self._schedule_flush(sync_fallback=False, metadata=True)

    def write_cleaner_checkpoint(self, offset: int) -> None:
        self.cleaner_checkpoint = offset
        self._write_checkpoint(offset, CLEANER_CHECKPOINT)

    def _read_checkpoint(self, name: str) -> int | None:
        try:
            lines = (self.directory / name).read_text().split()
        except FileNotFoundError:
            return None
        if len(lines) != 2 or lines[0] != str(_CHECKPOINT_VERSION):
            log.warning("log.bad_checkpoint", dir=str(self.directory))
            return None
        return int(lines[1])

    def _write_checkpoint(self, offset: int, name: str = LOG_START_CHECKPOINT) -> None:
        # Small and rare (DeleteRecords, retention, a finished clean), so written and fsynced inline.
        path = self.directory / name
        tmp = path.with_name(path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{_CHECKPOINT_VERSION}\n{offset}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._fsync_dir()

    # -- misc --------------------------------------------------------------------------------------

    def size_bytes(self) -> int:
        return sum(seg.size for seg in self.segments)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(str(self.directory))

    def _cancel_tasks(self) -> None:
        for task in [self._background, *self._scheduled]:
            if task is not None:
                task.cancel()
        self._background = None
        self._scheduled.clear()

    def close(self) -> None:
        """Flush everything (persisting sealed segments' indexes) and close the files."""
        if self._closed:
            return
        self._cancel_tasks()
        try:
            self.flush_sync()
        finally:
            self._closed = True
            self._fail_durable(LogClosed(str(self.directory)))
            for seg in self.segments:
                seg.close()

    def delete(self) -> None:
        """Close without flushing and remove the partition's directory."""
        self._cancel_tasks()
        self._closed = True
        self._fail_durable(LogClosed(str(self.directory)))
        for seg in self.segments:
            seg.delete()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.directory}, start={self.log_start_offset}, end={self.log_end_offset}, "
            f"segments={len(self.segments)})"
        )


def fsync_directory(directory: Path) -> None:
    """fsync the directory so created, renamed and removed entries survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _txn_indexes_unsynced(plan: _FlushPlan | None) -> None:
    """A failed flush round leaves the transaction indexes it took for the next one."""
    for seg, _fd, size in plan.items if plan is not None else ():
        if size < 0:
            seg.txn_unsynced = True


def _readonly(records: bytearray | memoryview) -> bool:
    return isinstance(records, memoryview) and records.readonly
