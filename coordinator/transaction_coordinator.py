"""The transaction coordinator (Kafka's TransactionCoordinator and TransactionStateManager), single broker.

It runs on the coordinator runtime with one `TransactionShard` per `__transaction_state` partition: every
transition is planned as a new `TxnMetadata` while holding its transactional id and its record handed to
the runtime, which writes and fsyncs it and only then replays it into the shard, so what a client was told survives kill -9. Ending a transaction is two
phases: PrepareCommit/PrepareAbort is written (and the client answered), then the COMMIT/ABORT markers
go to every partition of the transaction, then CompleteCommit/CompleteAbort is written. A crash between
the phases leaves a Prepare* record, which start-up finds and completes; markers are idempotent.
A producer's next transaction may start once the markers are durable (Kafka lets it start once the
Complete* record is written): if its first request is already waiting then, the Complete* record goes in
the same append as that request's Ongoing record, one fsync for the two, in Kafka's order.
The completion retries whatever fails, with a growing pause, until it is done: a transaction never stays
in Prepare* while the broker runs (a partition deleted meanwhile gets no marker, as in Kafka).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import structlog

from shoal.coordinator.placement import Placement
from shoal.coordinator.record_log import CoordinatorRecordLog
from shoal.coordinator.runtime import CoordinatorRuntime, Steps
from shoal.coordinator.transaction_log import TxnMetadata, TxnState, from_record, to_record, tombstone
from shoal.protocol.coordinator_records import CoordinatorRecord
from shoal.protocol.errors import ErrorCode

log = structlog.get_logger("shoal.transactions")

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"
MAX_EPOCH = 32767
# The transaction.version this coordinator serves (KIP-890 part 2); clients of versions 0 and 1 keep working.
TRANSACTION_VERSION = 2
# Kafka's coordinator epoch is the leader epoch of the coordinator's __transaction_state partition, carried
# in every marker so partitions can fence a zombie coordinator. On this one broker that epoch is always 0
# (Metadata reports leader epoch 0 for every partition).
COORDINATOR_EPOCH = 0
MAX_KEY_BYTES = 32767
_MARKER_RETRY_S = 0.5
_MARKER_RETRY_MAX_S = 10.0
# A producer starts its next transaction right after EndTxn is answered, while the markers of the last one
# are still being written; its AddPartitionsToTxn waits this long for them before CONCURRENT_TRANSACTIONS.
_COMPLETION_WAIT_S = 1.0
# `__transaction_state` is rewritten (every live id's latest record, then the older ones deleted) once a
# partition holds this many records more than it has transactional ids; each record is a whole state.
_PRUNE_SLACK = 1000

TopicPartition = tuple[str, int]
T = TypeVar("T")


class TransactionShard:
    """The transactional ids of one `__transaction_state` partition; a later record of an id replaces
    the earlier one, a tombstone removes it."""

    def __init__(self) -> None:
        self.txns: dict[str, TxnMetadata] = {}
        self.records = 0  # records the partition holds since its last prune
        self.last_offset = -1

    def replay(self, offset: int, record: CoordinatorRecord) -> None:
        self.records += 1
        self.last_offset = offset
        transactional_id, meta = from_record(record)
        if meta is None:
            self.txns.pop(transactional_id, None)
        else:
            self.txns[transactional_id] = meta


class MarkerWriter(Protocol):
    """Writes a transaction's control records; implemented by the broker over its partition logs."""

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[TopicPartition], coordinator_epoch: int = 0,
                            transaction_version: int = 0) -> set[TopicPartition]:
        """Append and fsync a COMMIT or ABORT marker on each partition that still exists; returns the
        partitions whose marker failed (to be retried). A deleted partition needs none."""
        ...


@dataclass(eq=False, slots=True)
class _Ending:
    """The second phase of one transaction's end, as the producer's next transaction sees it."""

    prepared: TxnMetadata  # the Prepare* state the markers end
    markers_durable: asyncio.Future[None]  # done once every partition's marker is durable
    # Requests of the next transaction waiting to write the Complete* record with their own (`add_partitions`);
    # the completion leaves it to them, and writes it itself once none is left and it is still missing.
    takers: int = 0
    no_takers: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False  # its Complete* record is written (by the completion or by the next transaction)


@dataclass(frozen=True, slots=True)
class InitResult:
    error: int
    producer_id: int = -1
    producer_epoch: int = -1


def _now_ms() -> int:
    return int(time.time() * 1000)


def _completed(prepared: TxnMetadata) -> TxnMetadata:
    """The Complete* state a Prepare* state ends in (Kafka's prepareComplete): no partitions, and for a
    transaction.version 2 transaction whose epoch ran out, the next producer id at epoch 0."""
    done = TxnState.COMPLETE_COMMIT if prepared.state == TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    meta = prepared.but(state=done, partitions=frozenset())
    if prepared.client_transaction_version >= 2 and prepared.next_producer_id >= 0:
        meta = meta.but(producer_id=prepared.next_producer_id, producer_epoch=0,
                        previous_producer_id=prepared.producer_id, next_producer_id=-1)
    return meta


class TransactionCoordinator:
    def __init__(self, record_log: CoordinatorRecordLog, markers: MarkerWriter,
                 allocate_producer_id: Callable[[], int], *, max_timeout_ms: int,
                 offsets_placement: Placement[str], clock: Callable[[], int] = _now_ms,
                 placement: Placement[str] | None = None,
                 transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000):
        self.runtime = CoordinatorRuntime(record_log, lambda _partition: TransactionShard())
        self.placement = placement or Placement(self.runtime.num_partitions)
        self.markers = markers
        self.allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        # Where the group coordinators keep a group: a transaction's offsets partition must be that one.
        self.offsets_placement = offsets_placement
        self.clock = clock
        self.transactional_id_expiration_ms = transactional_id_expiration_ms
        self._completing: dict[str, asyncio.Task[None]] = {}
        self._endings: dict[str, _Ending] = {}
        # Kafka's lastProducerEpoch (in memory, as in Kafka): the (producer id, epoch) a KIP-360
        # InitProducerId bumped from, so a retry of that request gets the same answer, not PRODUCER_FENCED.
        self._bumped_from: dict[str, tuple[int, int]] = {}

    # ---- load -----------------------------------------------------------------------------------

    async def load(self) -> None:
        """Replay `__transaction_state` into the shards."""
        for partition in range(self.runtime.num_partitions):
            await self.runtime.load(partition)
        self.placement.settle([shard.txns for shard in self.runtime.shards], "transactional id")

    @property
    def txns(self) -> dict[str, TxnMetadata]:
        """Every transactional id's state (a snapshot over all shards)."""
        return {tid: meta for p, shard in enumerate(self.runtime.shards) for tid, meta in shard.txns.items()
                if self.placement.holds(p, tid)}

    def _get(self, transactional_id: str) -> TxnMetadata | None:
        return self.runtime.shard(self.partition_for(transactional_id)).txns.get(transactional_id)

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
        await self.runtime.drain()

    # ---- helpers --------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return self.placement.partition_for(transactional_id)

    def offsets_partition(self, group_id: str) -> TopicPartition:
        return CONSUMER_OFFSETS, self.offsets_placement.partition_for(group_id)

    async def _holding(self, transactional_id: str, operation: Callable[[], Steps[T]]) -> T:
        """Run `operation` as the only one changing this transactional id: it yields the records of each
        step (`[to_record(meta)]`), and the runtime persists and replays them before resuming it."""
        return await self.runtime.write_steps(self.partition_for(transactional_id), transactional_id, operation)

    async def prune(self) -> int:
        """Keep `__transaction_state` from growing without bound (there is no log compaction): rewrite a
        partition's live states as one batch, then delete everything before it. Returns partitions pruned."""
        pruned = 0
        for partition in range(self.runtime.num_partitions):

            def rewrite(partition: int = partition) -> Steps[bool]:
                shard = self.runtime.shard(partition)
                live = list(shard.txns.values())
                if not live or shard.records < len(live) + _PRUNE_SLACK:
                    return False
                yield [to_record(m) for m in live]
                self.runtime.delete_before(partition, shard.last_offset - len(live) + 1)
                shard.records = len(live)
                return True

            pruned += await self.runtime.write_exclusive_steps(partition, rewrite)
        return pruned

    def _validate(self, transactional_id: str, producer_id: int, producer_epoch: int,
                  meta: TxnMetadata | None = None) -> tuple[int, TxnMetadata | None]:
        """Does the producer own the id (`meta`: its state, by default the current one)?"""
        if meta is None:
            meta = self._get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None
        if self._markers_pending(transactional_id) and meta.state not in (TxnState.PREPARE_COMMIT,
                                                                            TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, None
        return ErrorCode.NONE, meta

    def _markers_pending(self, transactional_id: str) -> bool:
        """Is the last transaction of this id still ending, its markers not all durable yet?"""
        if transactional_id not in self._completing:
            return False
        ending = self._endings.get(transactional_id)
        return ending is None or not ending.markers_durable.done()

    def _completed_now(self, transactional_id: str, meta: TxnMetadata | None) -> tuple[TxnMetadata, _Ending] | None:
        """The Complete* state to write ahead of the next transaction's first record (and the ending it
        finishes), when `meta` is a Prepare* state whose markers are all durable and whose Complete* record
        is not written yet."""
        ending = self._endings.get(transactional_id)
        if (meta is None or ending is None or ending.finished or not ending.markers_durable.done()
                or meta != ending.prepared):
            return None
        return _completed(meta).but(update_ms=self.clock()), ending

    # ---- InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int = -1,
                               producer_epoch: int = -1) -> InitResult:
        if not transactional_id or len(transactional_id.encode()) > MAX_KEY_BYTES:
            # Empty, or longer than the int16-length string of the TransactionLog key can hold.
            return InitResult(ErrorCode.INVALID_REQUEST)
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)

        def operation() -> Steps[InitResult]:
            now = self.clock()
            meta = self._get(transactional_id)
            if meta is None:
                meta = TxnMetadata(transactional_id, self.allocate_producer_id(), 0, timeout_ms, TxnState.EMPTY,
                                   frozenset(), -1, now)
                yield [to_record(meta)]
                return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
                if self._bumped_from.get(transactional_id) != (producer_id, producer_epoch) or meta.state not in (
                        TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                    # KIP-360: a producer re-initialising must still own the id and epoch it names.
                    return InitResult(ErrorCode.PRODUCER_FENCED)
                if transactional_id not in self._completing:
                    # A retry of the bump whose answer the producer never got (Kafka's lastProducerEpoch):
                    # the same answer again.
                    return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) or transactional_id in self._completing:
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if meta.state == TxnState.ONGOING:
                # The previous incarnation left a transaction open: fence it (epoch bump) and abort it.
                yield from self._fence_and_abort(meta.but(producer_epoch=meta.producer_epoch + 1), now)
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if meta.producer_epoch + 1 >= MAX_EPOCH:
                new = meta.but(producer_id=self.allocate_producer_id(), producer_epoch=0)
            else:
                new = meta.but(producer_epoch=meta.producer_epoch + 1)
            new = new.but(timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(), start_ms=-1,
                          update_ms=now)
            yield [to_record(new)]
            if producer_id >= 0:
                self._bumped_from[transactional_id] = (producer_id, producer_epoch)
            else:
                self._bumped_from.pop(transactional_id, None)
            return InitResult(ErrorCode.NONE, new.producer_id, new.producer_epoch)

        return await self._holding(transactional_id, operation)

    # ---- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: Iterable[TopicPartition], transaction_version: int = 1) -> int:
        """AddPartitionsToTxn; with `transaction_version` 2 the broker adds a partition on the producer's
        behalf (its first transactional Produce or TxnOffsetCommit, KIP-890 part 2), and the transaction
        is marked as a transaction.version 2 one, whose EndTxn bumps the epoch."""
        wanted = frozenset(partitions)

        def operation() -> Steps[int]:
            current = self._get(transactional_id)
            carried = self._completed_now(transactional_id, current)
            completed = carried[0] if carried is not None else None
            err, meta = self._validate(transactional_id, producer_id, producer_epoch, completed or current)
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
            ongoing = to_record(meta.but(state=TxnState.ONGOING, partitions=meta.partitions | wanted,
                                         start_ms=start, update_ms=now,
                                         client_transaction_version=2 if transaction_version >= 2 else 0))
            if carried is None:
                yield [ongoing]
            else:
                yield [to_record(carried[0]), ongoing]
                carried[1].finished = True
            return ErrorCode.NONE

        ending = self._endings.get(transactional_id)
        if ending is None:
            return await self._holding(transactional_id, operation)
        # The previous transaction is still ending: wait for its markers (then Complete* goes with this write).
        ending.takers += 1
        try:
            if not ending.markers_durable.done():
                await asyncio.wait({ending.markers_durable}, timeout=_COMPLETION_WAIT_S)
            return await self._holding(transactional_id, operation)
        finally:
            ending.takers -= 1
            if not ending.takers:
                ending.no_takers.set()

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn v4+ with VerifyOnly: is each partition already in the open transaction? As
        Kafka's coordinator answers: CONCURRENT_TRANSACTIONS while the last one ends, and TRANSACTION_ABORTABLE
        for a partition not in it (older clients get INVALID_TXN_STATE instead, by their request version)."""
        parts = list(partitions)
        err, meta = self._validate(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return dict.fromkeys(parts, err)
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return dict.fromkeys(parts, ErrorCode.CONCURRENT_TRANSACTIONS)
        ongoing = meta.state == TxnState.ONGOING
        return {tp: ErrorCode.NONE if ongoing and tp in meta.partitions else ErrorCode.TRANSACTION_ABORTABLE
                for tp in parts}

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                          transaction_version: int = 1) -> int:
        return await self.add_partitions(transactional_id, producer_id, producer_epoch,
                                         [self.offsets_partition(group_id)], transaction_version)

    def check_offset_commit(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            group_id: str) -> int:
        """TxnOffsetCommit is accepted only inside the producer's open transaction that added the group."""
        return self.verify_partitions(transactional_id, producer_id, producer_epoch,
                                      [self.offsets_partition(group_id)])[self.offsets_partition(group_id)]

    # ---- EndTxn ---------------------------------------------------------------------------------

    async def end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         commit: bool) -> InitResult:
        """EndTxn v5 (transaction.version 2, KIP-890 part 2): every end bumps the producer epoch, so a late
        write of the ended transaction is fenced; the answer carries the producer id and epoch to use next
        (a new producer id at epoch 0 once the epoch runs out). A retry is recognised by its epoch being the
        one just before the current one, and answered with the current producer id and epoch."""
        if not transactional_id:
            return InitResult(ErrorCode.INVALID_REQUEST)

        def operation() -> Steps[InitResult]:
            meta = self._get(transactional_id)
            if meta is None:
                return InitResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
            if self._markers_pending(transactional_id) and meta.state not in (TxnState.PREPARE_COMMIT,
                                                                                TxnState.PREPARE_ABORT):
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            retry_on_overflow = (meta.previous_producer_id == producer_id and producer_epoch == MAX_EPOCH - 1
                                 and meta.producer_epoch == 0)
            retry_on_bump = meta.producer_epoch == producer_epoch + 1
            if meta.producer_id != producer_id and not retry_on_overflow:
                return InitResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
            state = meta.state
            if state in (TxnState.ONGOING, TxnState.EMPTY):
                valid = producer_epoch == meta.producer_epoch
            elif state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                valid = retry_on_bump
            else:
                valid = retry_on_bump or retry_on_overflow or producer_epoch == meta.producer_epoch
            if not valid:
                return InitResult(ErrorCode.PRODUCER_FENCED)
            retry = retry_on_bump or retry_on_overflow
            current = InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            if state == TxnState.ONGOING:
                return (yield from self._prepare_v2(meta, commit=commit, no_partitions=False))
            if state == TxnState.COMPLETE_COMMIT:
                if commit:
                    return current if retry else InitResult(ErrorCode.INVALID_TXN_STATE)
                if retry:
                    return InitResult(ErrorCode.INVALID_TXN_STATE)
                return (yield from self._prepare_v2(meta, commit=False, no_partitions=True))
            if state == TxnState.COMPLETE_ABORT:
                if commit:
                    return InitResult(ErrorCode.INVALID_TXN_STATE)
                if retry:
                    return current
                return (yield from self._prepare_v2(meta, commit=False, no_partitions=True))
            if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                same = (state == TxnState.PREPARE_COMMIT) == commit
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS if same else ErrorCode.INVALID_TXN_STATE)
            if state == TxnState.EMPTY and not commit:
                return (yield from self._prepare_v2(meta, commit=False, no_partitions=True))
            return InitResult(ErrorCode.INVALID_TXN_STATE)

        return await self._holding(transactional_id, operation)

    def _prepare_v2(self, meta: TxnMetadata, *, commit: bool, no_partitions: bool) -> Steps[InitResult]:
        """Kafka's prepareAbortOrCommit for transaction.version 2: the Prepare record carries the bumped
        epoch (the markers' epoch) and, once the epoch is exhausted, the producer id to continue with."""
        now = self.clock()
        next_producer_id = self.allocate_producer_id() if meta.producer_epoch >= MAX_EPOCH - 1 else -1
        epoch = meta.producer_epoch if meta.producer_epoch >= MAX_EPOCH else meta.producer_epoch + 1
        prepared = meta.but(producer_epoch=epoch, next_producer_id=next_producer_id, client_transaction_version=2,
                            start_ms=now if no_partitions else meta.start_ms)
        yield from self._prepare(prepared, commit=commit, now=now)
        done = _completed(prepared.but(state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT))
        return InitResult(ErrorCode.NONE, done.producer_id, done.producer_epoch)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:

        def operation() -> Steps[int]:
            err, meta = self._validate(transactional_id, producer_id, producer_epoch)
            if meta is None:
                return err
            state = meta.state
            if state == TxnState.ONGOING:
                yield from self._prepare(meta, commit=commit, now=self.clock())
                return ErrorCode.NONE
            if state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
                return ErrorCode.NONE  # a retry of an EndTxn that already finished
            if state == (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
                return ErrorCode.CONCURRENT_TRANSACTIONS
            return ErrorCode.INVALID_TXN_STATE

        return await self._holding(transactional_id, operation)

    def _fence_and_abort(self, fenced: TxnMetadata, now: int) -> Steps[None]:
        """Abort an open transaction at the fencing epoch; a transaction.version 2 transaction's abort bumps
        the epoch once more, as any of its ends does (Kafka's epoch fence followed by endTransaction)."""
        if fenced.client_transaction_version >= 2:
            yield from self._prepare_v2(fenced, commit=False, no_partitions=False)
        else:
            yield from self._prepare(fenced, commit=False, now=now)

    def _prepare(self, meta: TxnMetadata, *, commit: bool, now: int) -> Steps[None]:
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        yield [to_record(meta.but(state=state, update_ms=now))]
        self._schedule_completion(meta.transactional_id)

    def _schedule_completion(self, transactional_id: str) -> None:
        ending = self._endings.get(transactional_id)
        if transactional_id in self._completing and (ending is None or not ending.finished):
            return  # already being completed (a finished completion still winding down is replaced)
        prepared = self._get(transactional_id)
        assert prepared is not None
        loop = asyncio.get_running_loop()
        ending = self._endings[transactional_id] = _Ending(prepared, loop.create_future())
        task = loop.create_task(self._complete(transactional_id, ending))
        self._completing[transactional_id] = task
        task.add_done_callback(lambda t: self._completion_done(transactional_id, t))

    def _completion_done(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        if self._completing.get(transactional_id) is task:
            del self._completing[transactional_id]
            self._endings.pop(transactional_id, None)
        if not task.cancelled() and task.exception() is not None:
            # Not expected (_complete retries every failure), but never silent.
            log.error("txn.completion_died", transactional_id=transactional_id, error=repr(task.exception()))

    async def _complete(self, transactional_id: str, ending: _Ending) -> None:
        """Second phase: markers on every partition, then the Complete* record (unless the next transaction's
        first write carried it); any failure is retried (only the partitions still without a marker get one)."""
        meta = ending.prepared
        commit = meta.state == TxnState.PREPARE_COMMIT
        pending = set(meta.partitions)
        delay = _MARKER_RETRY_S

        def operation() -> Steps[None]:
            current = self._get(transactional_id)
            if ending.finished or current is None or (current.producer_id, current.producer_epoch, current.state) != (
                    meta.producer_id, meta.producer_epoch, meta.state):
                return  # completed meanwhile (by the next transaction's first write)
            yield [to_record(_completed(meta).but(update_ms=self.clock()))]
            ending.finished = True

        while True:
            try:
                if pending:
                    pending = set(await self.markers.write_markers(meta.producer_id, meta.producer_epoch, commit,
                                                                   pending, COORDINATOR_EPOCH,
                                                                   meta.client_transaction_version))
                if not pending:
                    if not ending.markers_durable.done():
                        ending.markers_durable.set_result(None)
                    while ending.takers:
                        ending.no_takers.clear()
                        await ending.no_takers.wait()
                    if not ending.finished:  # else the next transaction's first write carried Complete*
                        await self._holding(transactional_id, operation)
                    break
                error = f"no marker yet on {sorted(pending)}"
            except Exception as exc:  # whatever it is, the transaction must not stay prepared
                error = repr(exc)
            log.error("txn.markers_failed", transactional_id=transactional_id, error=error, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MARKER_RETRY_MAX_S)
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

            def operation(meta: TxnMetadata = meta) -> Steps[bool]:
                current = self._get(meta.transactional_id)
                if current is None or current.state != TxnState.ONGOING or current.start_ms != meta.start_ms:
                    return False
                epoch = current.producer_epoch + 1 if current.producer_epoch + 1 < MAX_EPOCH else current.producer_epoch
                log.info("txn.timed_out", transactional_id=meta.transactional_id, producer_id=meta.producer_id)
                yield from self._fence_and_abort(current.but(producer_epoch=epoch), now)
                return True

            if await self._holding(meta.transactional_id, operation):
                aborted.append(meta.transactional_id)
        return aborted

    # ---- transactional id expiry -----------------------------------------------------------------

    async def expire_transactional_ids(self) -> list[str]:
        """Kafka's transactional.id.expiration.ms: an id with no transaction open or ending and no update
        for that long is removed (a tombstone on `__transaction_state`); its next InitProducerId starts
        afresh with a new producer id."""
        now = self.clock()
        horizon = now - self.transactional_id_expiration_ms
        idle = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        expired = []
        for meta in list(self.txns.values()):
            if meta.state not in idle or meta.update_ms > horizon:
                continue

            def operation(meta: TxnMetadata = meta) -> Steps[bool]:
                current = self._get(meta.transactional_id)
                if (current is None or current.state not in idle or current.update_ms > horizon
                        or meta.transactional_id in self._completing):
                    return False
                yield [tombstone(meta.transactional_id)]
                self._bumped_from.pop(meta.transactional_id, None)
                return True

            if await self._holding(meta.transactional_id, operation):
                log.info("txn.transactional_id_expired", transactional_id=meta.transactional_id,
                         producer_id=meta.producer_id, idle_ms=now - meta.update_ms)
                expired.append(meta.transactional_id)
        return expired

    # ---- Describe / List ------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self._get(transactional_id)

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
