"""The transaction coordinator (Kafka's TransactionCoordinator and TransactionStateManager), single broker.

Every transition is planned as a new `TxnMetadata`, written to `__transaction_state` and fsynced, and
only then applied in memory, so what a client was told survives kill -9. Ending a transaction is two
phases: PrepareCommit/PrepareAbort is written (and the client answered), then the COMMIT/ABORT markers
go to every partition of the transaction, then CompleteCommit/CompleteAbort is written. A crash between
the phases leaves a Prepare* record, which start-up finds and completes; markers are idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog

from shoal.coordinator.placement import coordinator_partition
from shoal.coordinator.transaction_log import TxnMetadata, TxnState, decode, encode_key, encode_value
from shoal.protocol.codec import DecodeError
from shoal.protocol.errors import ErrorCode

log = structlog.get_logger("shoal.transactions")

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"
MAX_EPOCH = 32767
MAX_KEY_BYTES = 32767
_MARKER_RETRY_S = 0.5
# A producer starts its next transaction right after EndTxn is answered, while the markers of the last one
# are still being written; its AddPartitionsToTxn waits this long for them before CONCURRENT_TRANSACTIONS.
_COMPLETION_WAIT_S = 1.0
# `__transaction_state` is rewritten (every live id's latest record, then the older ones deleted) once a
# partition holds this many records more than it has transactional ids; each record is a whole state.
_PRUNE_SLACK = 1000

TopicPartition = tuple[str, int]


class RawRecordLog(Protocol):
    """An internal topic as partitions of raw (key, value) records."""

    @property
    def num_partitions(self) -> int: ...

    async def append_raw(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> int: ...

    def replay_raw(self, partition: int) -> Iterator[tuple[int, bytes, bytes | None]]: ...

    def delete_before(self, partition: int, offset: int) -> None: ...


class MarkerWriter(Protocol):
    """Writes a transaction's control records; implemented by the broker over its partition logs."""

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[TopicPartition]) -> None:
        """Append and fsync a COMMIT or ABORT marker on each partition that still exists."""
        ...


@dataclass(frozen=True, slots=True)
class InitResult:
    error: int
    producer_id: int = -1
    producer_epoch: int = -1


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    def __init__(self, record_log: RawRecordLog, markers: MarkerWriter, allocate_producer_id: Callable[[], int],
                 *, max_timeout_ms: int, offsets_partitions: int, clock: Callable[[], int] = _now_ms):
        self.log = record_log
        self.markers = markers
        self.allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        self.offsets_partitions = offsets_partitions
        self.clock = clock
        self.txns: dict[str, TxnMetadata] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._completing: dict[str, asyncio.Task[None]] = {}
        # Writes to one partition append and apply under its lock, so a prune's snapshot sees them all.
        self._partition_locks: dict[int, asyncio.Lock] = {}
        self._records: dict[int, int] = {}  # records each partition holds since its last prune

    # ---- load -----------------------------------------------------------------------------------

    def load(self) -> None:
        """Replay `__transaction_state`; later records of a transactional id replace earlier ones."""
        for partition in range(self.log.num_partitions):
            for offset, key, value in self.log.replay_raw(partition):
                try:
                    txn_id, meta = decode(key, value)
                except DecodeError as exc:
                    log.warning("txn.skip_record", partition=partition, offset=offset, error=str(exc))
                    continue
                if meta is None:
                    self.txns.pop(txn_id, None)
                else:
                    self.txns[txn_id] = meta
                self._records[partition] = self._records.get(partition, 0) + 1

    def start(self) -> None:
        """Finish every transaction a crash left between its prepare and complete records."""
        for meta in list(self.txns.values()):
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info("txn.complete_at_load", transactional_id=meta.transactional_id, state=meta.state.name)
                self._schedule_completion(meta.transactional_id)

    async def stop(self) -> None:
        tasks = list(self._completing.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- helpers --------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return coordinator_partition(transactional_id, self.log.num_partitions)

    def offsets_partition(self, group_id: str) -> TopicPartition:
        return CONSUMER_OFFSETS, coordinator_partition(group_id, self.offsets_partitions)

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def _partition_lock(self, partition: int) -> asyncio.Lock:
        lock = self._partition_locks.get(partition)
        if lock is None:
            lock = self._partition_locks[partition] = asyncio.Lock()
        return lock

    async def _write(self, meta: TxnMetadata) -> None:
        """Persist, then apply: memory never runs ahead of the log."""
        partition = self.partition_for(meta.transactional_id)
        async with self._partition_lock(partition):
            await self.log.append_raw(partition, [(encode_key(meta.transactional_id), encode_value(meta))])
            self.txns[meta.transactional_id] = meta
            self._records[partition] = self._records.get(partition, 0) + 1

    async def prune(self) -> int:
        """Keep `__transaction_state` from growing without bound (there is no log compaction): rewrite a
        partition's live states as one batch, then delete everything before it. Returns partitions pruned."""
        pruned = 0
        for partition in range(self.log.num_partitions):
            async with self._partition_lock(partition):
                live = [m for m in self.txns.values() if self.partition_for(m.transactional_id) == partition]
                if not live or self._records.get(partition, 0) < len(live) + _PRUNE_SLACK:
                    continue
                first = await self.log.append_raw(
                    partition, [(encode_key(m.transactional_id), encode_value(m)) for m in live])
                self.log.delete_before(partition, first)
                self._records[partition] = len(live)
                pruned += 1
        return pruned

    def _validate(self, transactional_id: str, producer_id: int, producer_epoch: int) -> tuple[int, TxnMetadata | None]:
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None
        if transactional_id in self._completing and meta.state not in (TxnState.PREPARE_COMMIT,
                                                                         TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, None
        return ErrorCode.NONE, meta

    # ---- InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int = -1,
                               producer_epoch: int = -1) -> InitResult:
        if not transactional_id or len(transactional_id.encode()) > MAX_KEY_BYTES:
            # Empty, or longer than the int16-length string of the TransactionLog key can hold.
            return InitResult(ErrorCode.INVALID_REQUEST)
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        async with self._lock(transactional_id):
            now = self.clock()
            meta = self.txns.get(transactional_id)
            if meta is None:
                meta = TxnMetadata(transactional_id, self.allocate_producer_id(), 0, timeout_ms, TxnState.EMPTY,
                                   frozenset(), -1, now)
                await self._write(meta)
                return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
                # KIP-360: a producer re-initialising must still own the id and epoch it names.
                return InitResult(ErrorCode.PRODUCER_FENCED)
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) or transactional_id in self._completing:
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if meta.state == TxnState.ONGOING:
                # The previous incarnation left a transaction open: fence it (epoch bump) and abort it.
                await self._prepare(meta.but(producer_epoch=meta.producer_epoch + 1), commit=False, now=now)
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if meta.producer_epoch + 1 >= MAX_EPOCH:
                new = meta.but(producer_id=self.allocate_producer_id(), producer_epoch=0)
            else:
                new = meta.but(producer_epoch=meta.producer_epoch + 1)
            new = new.but(timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(), start_ms=-1,
                          update_ms=now)
            await self._write(new)
            return InitResult(ErrorCode.NONE, new.producer_id, new.producer_epoch)

    # ---- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: Iterable[TopicPartition]) -> int:
        wanted = frozenset(partitions)
        completing = self._completing.get(transactional_id)
        if completing is not None:
            await asyncio.wait({completing}, timeout=_COMPLETION_WAIT_S)
        async with self._lock(transactional_id):
            err, meta = self._validate(transactional_id, producer_id, producer_epoch)
            if meta is None:
                return err
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                return ErrorCode.CONCURRENT_TRANSACTIONS
            if meta.state == TxnState.ONGOING and wanted <= meta.partitions:
                return ErrorCode.NONE
            if meta.state not in (TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                  TxnState.COMPLETE_ABORT):
                return ErrorCode.INVALID_TXN_STATE
            now = self.clock()
            start = meta.start_ms if meta.state == TxnState.ONGOING else now
            await self._write(meta.but(state=TxnState.ONGOING, partitions=meta.partitions | wanted,
                                       start_ms=start, update_ms=now))
            return ErrorCode.NONE

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn v4+ with VerifyOnly: is each partition already in the open transaction?"""
        parts = list(partitions)
        err, meta = self._validate(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return dict.fromkeys(parts, err)
        ongoing = meta.state == TxnState.ONGOING
        return {tp: ErrorCode.NONE if ongoing and tp in meta.partitions else ErrorCode.INVALID_TXN_STATE
                for tp in parts}

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> int:
        return await self.add_partitions(transactional_id, producer_id, producer_epoch,
                                         [self.offsets_partition(group_id)])

    def check_offset_commit(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            group_id: str) -> int:
        """TxnOffsetCommit is accepted only inside the producer's open transaction that added the group."""
        return self.verify_partitions(transactional_id, producer_id, producer_epoch,
                                      [self.offsets_partition(group_id)])[self.offsets_partition(group_id)]

    # ---- EndTxn ---------------------------------------------------------------------------------

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        async with self._lock(transactional_id):
            err, meta = self._validate(transactional_id, producer_id, producer_epoch)
            if meta is None:
                return err
            state = meta.state
            if state == TxnState.ONGOING:
                await self._prepare(meta, commit=commit, now=self.clock())
                return ErrorCode.NONE
            if state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
                return ErrorCode.NONE  # a retry of an EndTxn that already finished
            if state == (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
                return ErrorCode.CONCURRENT_TRANSACTIONS
            return ErrorCode.INVALID_TXN_STATE

    async def _prepare(self, meta: TxnMetadata, *, commit: bool, now: int) -> None:
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self._write(meta.but(state=state, update_ms=now))
        self._schedule_completion(meta.transactional_id)

    def _schedule_completion(self, transactional_id: str) -> None:
        if transactional_id in self._completing:
            return
        task = asyncio.get_running_loop().create_task(self._complete(transactional_id))
        self._completing[transactional_id] = task
        task.add_done_callback(lambda _t: self._completing.pop(transactional_id, None))

    async def _complete(self, transactional_id: str) -> None:
        """Second phase: markers on every partition, then the Complete* record."""
        meta = self.txns[transactional_id]
        commit = meta.state == TxnState.PREPARE_COMMIT
        while True:
            try:
                await self.markers.write_markers(meta.producer_id, meta.producer_epoch, commit, meta.partitions)
                break
            except OSError as exc:
                log.error("txn.markers_failed", transactional_id=transactional_id, error=repr(exc))
                await asyncio.sleep(_MARKER_RETRY_S)
        async with self._lock(transactional_id):
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            await self._write(meta.but(state=done, partitions=frozenset(), update_ms=self.clock()))
        log.info("txn.completed", transactional_id=transactional_id, commit=commit,
                 partitions=len(meta.partitions))

    # ---- timeouts -------------------------------------------------------------------------------

    async def abort_timed_out(self) -> list[str]:
        """Abort, with an epoch bump that fences the producer, every transaction open past its timeout."""
        now = self.clock()
        aborted = []
        for meta in list(self.txns.values()):
            if meta.state != TxnState.ONGOING or now <= meta.start_ms + meta.timeout_ms:
                continue
            async with self._lock(meta.transactional_id):
                current = self.txns.get(meta.transactional_id)
                if current is None or current.state != TxnState.ONGOING or current.start_ms != meta.start_ms:
                    continue
                epoch = current.producer_epoch + 1 if current.producer_epoch + 1 < MAX_EPOCH else current.producer_epoch
                log.info("txn.timed_out", transactional_id=meta.transactional_id, producer_id=meta.producer_id)
                await self._prepare(current.but(producer_epoch=epoch), commit=False, now=now)
                aborted.append(meta.transactional_id)
        return aborted

    # ---- Describe / List ------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.txns.get(transactional_id)

    def list(self, states: set[str], producer_ids: set[int], duration_filter_ms: int) -> list[TxnMetadata]:
        now = self.clock()
        out = []
        for meta in self.txns.values():
            if states and meta.state.display_name not in states:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if duration_filter_ms >= 0 and (meta.state != TxnState.ONGOING or now - meta.start_ms < duration_filter_ms):
                continue
            out.append(meta)
        return out
