"""Sidecar mode: a coordinator's internal topic kept on the upstream, as a `CoordinatorRecordLog`.

The share coordinator's and the group coordinator's records go to compacted `__shoal_*` topics on the
upstream (`state_topics.py` creates them), in Kafka's coordinator record formats: the same bytes the local
`__share_group_state` and `__consumer_offsets` hold.

Ownership and fencing come from the upstream's transactions. Each state partition has one transactional
id, `shoal-<membership group id>-state-<topic>-<partition>`. `take(partition)` calls InitProducerId for
it, which bumps the producer epoch and so fences whichever instance wrote the partition before (its open
transaction is aborted, its next write fails with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH), then reads
the partition from its log start with read_committed Fetch, so the coordinator's load replays exactly what
committed. `release(partition)` stops writing it. Between the two, appends are group-committed: every
append that arrives while one transaction is in flight goes into the next one (AddPartitionsToTxn,
one Produce with acks=all of one batch holding them all, EndTxn commit), and `flush` returns only once
that transaction committed.

A write is never a plain idempotent Produce under the epoch the take bumped, fast as that would be: the
upstream partition refuses an older epoch only while it remembers the producer (`producer.id.expiration.ms`)
and only for that producer id, which changes once the transactional id expired (idempotent writes never
reach its coordinator) or its epochs ran out, and then an earlier owner's stale write would land behind the
new owner's read. The transaction coordinator, which every transaction goes through, refuses it
(`tests/integration/test_sidecar_state_fencing.py`).

With transaction.version 1, a transaction begins with AddPartitionsToTxn. Once a transaction committed, the
writer sends the next one's AddPartitionsToTxn at once, before any append asks for it, so the next write
waits for two round trips (Produce, EndTxn), not three. That holds while the transaction is fresh
(`OPENED_AHEAD_FRESH_S`): a write that finds it older sends AddPartitionsToTxn again, which the coordinator
answers at once for a partition already in its open transaction, or refuses for a fenced epoch. So a writer
paused past a take (SIGSTOP) still meets the transaction coordinator before its Produce, as without the
early open; the clock only decides when to ask again, never whether a write is fenced. A transaction
opened that way and left empty for `idle_end_s` is committed empty, well within the upstream's transaction
timeout, which would otherwise abort it with an epoch bump that reads as fencing; the next write then opens
its own. An empty open transaction
holds no records, so it never holds back the partition's last stable offset, and a new owner's
InitProducerId aborts it as it would any other.

When the upstream finalizes `transaction.version` 2 (KIP-890 part 2, Kafka 4.x), a transaction is one round
trip shorter: no AddPartitionsToTxn, the Produce (v12+) adds the partition to the transaction itself, and
EndTxn v5 bumps the producer epoch and names the id and epoch the next transaction uses. Fencing is the same:
a new owner's InitProducerId bumps the epoch past anything the old one holds. `upstream.state.transaction.version`
caps the version used (1 keeps AddPartitionsToTxn on any upstream).

A write that was not committed never reports success: it raises `CoordinatorLogError` with the code the
coordinator answers (NOT_COORDINATOR once the partition is lost, COORDINATOR_NOT_AVAILABLE for a write that
may be tried again). When the upstream's answer leaves it unknown whether a transaction committed, or the
partition was fenced, the partition is lost: `on_lost(partition, fenced)` tells the owner, which stops
serving it (and, when it was not fenced, may take it again, which re-reads what did commit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from shoal.broker.storage.internal_topic_log import CoordinatorLogError, encode_records, logged_records
from shoal.broker.storage.partition_source import EARLIEST, SourceUnavailable
from shoal.client.errors import error_name
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase
from shoal.protocol.coordinator_records import CoordinatorRecord, EndTransactionMarker, LoggedRecord
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import BatchHeader
from shoal.protocol.records import decode_records

from .cluster import KEY_TYPE_TRANSACTION, LEADERSHIP_ERRORS, CoordinatorLookupFailed, UpstreamCluster
from .partition_reader import BatchCache, UpstreamPartitionSource
from .state_replay import MarkerFilter

log = structlog.get_logger("shoal.upstream.state")

# The upstream says another instance took the partition: this one must stop writing it.
FENCING_ERRORS = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
# Transaction coordinator answers worth asking again after a short wait.
_TXN_RETRIABLE = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                            ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# Retries of the transaction coordinator start quick: the next transaction's AddPartitionsToTxn meets
# CONCURRENT_TRANSACTIONS until the upstream has written the previous one's markers, which is soon.
_FIRST_RETRY_S = 0.001
_MAX_RETRY_S = 0.1
_READ_RETRY_S = 0.1
_READ_BYTES = 4 << 20
_DECODE_YIELD_EVERY = 64  # batches decoded between yields while a partition is read at take
TRANSACTION_TIMEOUT_MS = 60_000
# How long a TV1 transaction opened ahead of its first append may stay empty before it is committed.
IDLE_END_S = TRANSACTION_TIMEOUT_MS / 1000 / 4
# How long a transaction opened ahead is used without asking its coordinator again.
OPENED_AHEAD_FRESH_S = 1.0
# Records one transaction carries at most; what is queued beyond them goes in the next.
MAX_TRANSACTION_RECORDS = 4096
# A transaction's appends go in one batch up to this size (under Kafka's default max.message.bytes, 1 MiB);
# past it, each append is a batch, and a Produce, of its own.
MAX_BATCH_BYTES = 1_000_000
# Connections per state topic and upstream broker that the partitions' writers spread over.
STATE_LANES = 8
TRANSACTION_VERSION_FEATURE = "transaction.version"
# Request versions per transaction version: TV2 needs Produce v12 (implicit AddPartitionsToTxn) and EndTxn v5
# (the epoch bump); Kafka's coordinator takes an EndTxn below v5 as a TV1 client's.
_PRODUCE_V = {1: 9, 2: 12}
_END_TXN_V = {1: 4, 2: 5}


def transaction_version_to_use(finalized: int, produce_max: int, end_txn_max: int, cap: int) -> int:
    """The transaction protocol the state writers speak: 2 only when the upstream finalized it and serves
    the request versions it needs, and the setting allows it; otherwise 1."""
    if cap >= 2 and finalized >= 2 and produce_max >= _PRODUCE_V[2] and end_txn_max >= _END_TXN_V[2]:
        return 2
    return 1


def transactional_id(membership_group_id: str, topic: str, partition: int) -> str:
    """The transactional id one state partition is written with; whoever initialises it owns the partition."""
    return f"shoal-{membership_group_id}-state-{topic}-{partition}"


def appends_per_transaction(queued: list[int], max_records: int) -> int:
    """How many of the queued appends (their record counts, oldest first) the next transaction takes: as
    many as fit in `max_records`, and always the first. Each append stays a batch of its own, as in the
    local log, so no batch outgrows the upstream's max.message.bytes by being merged with others."""
    taken, count = 0, 0
    while taken < len(queued) and (taken == 0 or count + queued[taken] <= max_records):
        count += queued[taken]
        taken += 1
    return taken


def transaction_batches(appends: list[list[CoordinatorRecord]], producer_id: int, producer_epoch: int,
                        sequence: int, max_bytes: int = MAX_BATCH_BYTES) -> list[tuple[bytes, int]]:
    """A transaction's record batches, each with its record count, numbered on from `sequence`: one batch
    holding every append, unless that outgrows `max_bytes`, then one batch per append (a Produce of its own
    each, since Kafka takes one magic v2 batch per partition in a Produce)."""
    def encode(records: list[CoordinatorRecord], base_sequence: int) -> bytes:
        return encode_records(records, producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=base_sequence, is_transactional=True)

    records = [r for append in appends for r in append]
    whole = encode(records, sequence)
    if len(appends) == 1 or len(whole) <= max_bytes:
        return [(whole, len(records))]
    batches = []
    for append in appends:
        batches.append((encode(append, sequence), len(append)))
        sequence += len(append)
    return batches


class _Unknown(Exception):
    """The upstream did not say whether the transaction committed (it may have)."""


@dataclass(slots=True)
class _Pending:
    records: list[CoordinatorRecord]
    future: asyncio.Future[None]


class _PartitionWriter:
    """The transactional producer of one state partition: one transaction per flush of what is queued."""

    def __init__(self, cluster: UpstreamCluster, topic: str, partition: int, txn_id: str, timeout_s: float,
                 max_transaction_version: int = 2):
        self.cluster = cluster
        self.max_transaction_version = max_transaction_version
        self.transaction_version = 1  # what the upstream offers, found at init
        self.topic = topic
        self.partition = partition
        self.txn_id = txn_id
        self.timeout_s = timeout_s
        # State writes have connections of their own: an upstream broker answers a connection's requests one at
        # a time, so these must not wait behind other traffic, nor the partitions behind each other (as
        # Kafka's producers, one per transactional id, would not); STATE_LANES bounds the connections.
        self.lane = ("shoal-state", topic, partition % STATE_LANES)
        self.producer_id = -1
        self.producer_epoch = -1
        self.sequence = 0
        self.next_offset = 0  # what append_nowait hands out: monotonic, the upstream's offsets when alone
        self.lost: CoordinatorLogError | None = None
        self.on_lost: Callable[[bool], None] | None = None
        self._queue: list[_Pending] = []
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None
        # TV1: when the open transaction that holds nothing yet was opened (AddPartitionsToTxn sent ahead).
        self._opened_ahead_at: float | None = None
        self.opened_ahead_fresh_s = OPENED_AHEAD_FRESH_S
        self.idle_end_s = IDLE_END_S
        self._open_next = False  # a transaction just committed: open the next one ahead
        self._idle_timer: asyncio.TimerHandle | None = None

    # ---- ownership -------------------------------------------------------------------------------

    async def init(self) -> None:
        """InitProducerId for the partition's transactional id: bumps the epoch, fencing the previous owner
        (its open transaction is aborted by the upstream)."""
        body = messages.InitProducerIdRequest(transactional_id=self.txn_id, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                                              producer_id=-1, producer_epoch=-1)
        response = await self._txn_request(ApiKey.INIT_PRODUCER_ID, body, 4, lambda r: int(r.error_code))
        self.producer_id, self.producer_epoch, self.sequence = response.producer_id, response.producer_epoch, 0
        if self.max_transaction_version >= 2:
            self.transaction_version = await self._upstream_transaction_version()

    async def _upstream_transaction_version(self) -> int:
        """Ask the transactional id's coordinator (ApiVersions v3) which transaction.version it finalized; an
        upstream that cannot say (older ApiVersions, no such feature) gets TV1."""
        try:
            node = await self.cluster.coordinator(KEY_TYPE_TRANSACTION, self.txn_id)
            conn = await self.cluster.connection(node, self.lane)
            response = await self.cluster.send(node, ApiKey.API_VERSIONS, messages.ApiVersionsRequest(
                client_software_name="shoal-sidecar", client_software_version="0"), 3, lane=self.lane)
        except Exception as exc:  # unreachable, or no ApiVersions v3: TV1 works on every upstream
            log.info("upstream transaction.version unknown; using transaction version 1", error=str(exc))
            return 1
        finalized = {f.name: int(f.max_version_level) for f in (response.finalized_features or [])}
        return transaction_version_to_use(finalized.get(TRANSACTION_VERSION_FEATURE, 0),
                                          conn.max_version(ApiKey.PRODUCE), conn.max_version(ApiKey.END_TXN),
                                          self.max_transaction_version)

    def lose(self, error: CoordinatorLogError, *, fenced: bool) -> None:
        """Stop writing: everything queued fails with `error`, and so does every later append."""
        if self.lost is not None:
            return
        self.lost = error
        self._opened_ahead_at = None
        self._cancel_idle_timer()
        queued, self._queue = self._queue, []
        for pending in queued:
            if not pending.future.done():
                pending.future.set_exception(error)
        if self.on_lost is not None:
            self.on_lost(fenced)

    @property
    def opened_ahead(self) -> bool:
        return self._opened_ahead_at is not None

    # ---- writes ----------------------------------------------------------------------------------

    def append(self, records: list[CoordinatorRecord]) -> int:
        if self.lost is not None:
            raise self.lost
        first = self.next_offset
        self.next_offset += len(records)
        future = asyncio.get_running_loop().create_future()
        self._futures[first + len(records)] = future
        self._queue.append(_Pending(records, future))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return first

    async def flush(self, end_offset: int) -> None:
        future = self._futures.get(end_offset)
        if future is None:  # not this writer's (it replaced a lost one): never report it written
            raise self.lost or CoordinatorLogError(ErrorCode.NOT_COORDINATOR, "state write of an earlier owner")
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            raise  # the caller asks again (the runtime finishes what it started): keep the outcome for it
        except BaseException:
            self._futures.pop(end_offset, None)
            raise
        self._futures.pop(end_offset, None)

    def _next_transaction(self) -> list[_Pending]:
        taken = appends_per_transaction([len(pending.records) for pending in self._queue], MAX_TRANSACTION_RECORDS)
        batch, self._queue = self._queue[:taken], self._queue[taken:]
        return batch

    async def _run(self) -> None:
        while self.lost is None:
            if not self._queue:
                if not self._open_next:
                    return
                self._open_next = False
                await self._open_ahead()
                continue  # appends that came meanwhile go in the transaction just opened
            batch = self._next_transaction()
            appends = [pending.records for pending in batch]
            records = [r for pending in batch for r in pending.records]
            error: CoordinatorLogError | None = None
            try:
                base = await self._transaction(appends)
            except CoordinatorLogError as exc:
                error = exc
            except _Unknown as exc:
                error = CoordinatorLogError(ErrorCode.NOT_COORDINATOR, f"state write outcome unknown: {exc}")
                self.lose(error, fenced=False)
            except Exception as exc:  # never leave a caller waiting
                log.exception("state write failed", topic=self.topic, partition=self.partition)
                error = CoordinatorLogError(ErrorCode.NOT_COORDINATOR, f"state write failed: {exc}")
                self.lose(error, fenced=False)
            else:
                # The records sit at base.., the commit marker after them.
                self.next_offset = max(self.next_offset, base + len(records) + 1)
                self._open_next = self.transaction_version < 2
            for pending in batch:
                if pending.future.done():
                    continue
                if error is None:
                    pending.future.set_result(None)
                else:
                    pending.future.set_exception(error)

    async def _add_partition(self) -> None:
        """TV1: AddPartitionsToTxn, which opens a transaction holding this partition."""
        req = messages.AddPartitionsToTxnRequest
        add = req(v3_and_below_transactional_id=self.txn_id, v3_and_below_producer_id=self.producer_id,
                  v3_and_below_producer_epoch=self.producer_epoch,
                  v3_and_below_topics=[req.AddPartitionsToTxnTopic(name=self.topic, partitions=[self.partition])])
        await self._txn_request(ApiKey.ADD_PARTITIONS_TO_TXN, add, 3, _add_partitions_error)

    async def _open_ahead(self) -> None:
        """TV1: open the next transaction before an append needs it. Failing that, the next write opens its
        own; only fencing or a forgotten transactional id loses the partition, as in a write."""
        try:
            await self._add_partition()
        except _Unknown as exc:
            self.lose(CoordinatorLogError(ErrorCode.NOT_COORDINATOR, f"state write outcome unknown: {exc}"), fenced=False)
            return
        except (CoordinatorLogError, SourceUnavailable) as exc:
            log.debug("state transaction not opened ahead", topic=self.topic, partition=self.partition, error=str(exc))
            return
        if self.lost is None:
            self._opened_ahead_at = time.monotonic()
            self._idle_timer = asyncio.get_running_loop().call_later(self.idle_end_s, self._end_idle)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _end_idle(self) -> None:
        """The transaction opened ahead stayed empty: commit it, unless a write is using it already."""
        self._idle_timer = None
        if self.opened_ahead and self.lost is None and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._commit_idle())

    async def _commit_idle(self) -> None:
        self._opened_ahead_at = None
        try:
            await self._end(commit=True)
        except (CoordinatorLogError, _Unknown) as exc:
            # Unless fenced, the transaction may still be open, and the upstream's timeout would abort it with
            # an epoch bump that looks like fencing: lose the partition now, so its owner takes it again.
            self.lose(CoordinatorLogError(ErrorCode.NOT_COORDINATOR, f"empty state transaction not ended: {exc}"),
                      fenced=False)
        await self._run()  # appends that came meanwhile

    async def _transaction(self, appends: list[list[CoordinatorRecord]]) -> int:
        """One committed transaction holding the appends (one batch each); returns their base offset."""
        self._cancel_idle_timer()
        opened, self._opened_ahead_at = self._opened_ahead_at, None
        fresh = opened is not None and time.monotonic() - opened <= self.opened_ahead_fresh_s
        if not fresh and self.transaction_version < 2:  # TV2: the Produce adds the partition to the transaction
            try:
                await self._add_partition()
            except SourceUnavailable as exc:  # nothing was written: the write may simply be tried again
                raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"state write failed: {exc}") from exc
        try:
            base = await self._produce(appends)
        except CoordinatorLogError as exc:
            if self.lost is None:
                await self._abort()
            raise exc
        except _Unknown:
            raise  # the upstream forgot the transactional id: nothing to abort, the owner takes it again
        except Exception as exc:  # no answer: the batch may be in the log; aborting makes it not count
            await self._abort()
            raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"state write failed: {exc}") from exc
        try:
            await self._end(commit=True)
        except CoordinatorLogError as exc:
            if self.lost is not None:
                raise  # fenced: the new owner's InitProducerId ended the transaction, whichever way
            # Still open, or committed: either way the next commit must not carry these records unreplayed.
            raise _Unknown(str(exc)) from exc
        return base

    async def _produce(self, appends: list[list[CoordinatorRecord]]) -> int:
        """Produce the appends in the open transaction; returns the base offset of the first. A Produce
        carries one batch per partition, as Kafka requires of magic v2 batches (it refuses more with
        INVALID_RECORD), so batches that must stay apart go in Produces of their own, in order."""
        base = -1
        for batch, count in transaction_batches(appends, self.producer_id, self.producer_epoch, self.sequence):
            offset = await self._produce_batch(batch, self.sequence + count)
            base = offset if base < 0 else base
        return base

    async def _produce_batch(self, batch: bytes, sequence: int) -> int:
        """One Produce of one batch; `sequence` is the next batch's base sequence once it is appended."""
        leader = self.cluster.leader(self.topic, self.partition)
        if leader < 0:
            await self.cluster.refresh_metadata([self.topic])
            leader = self.cluster.leader(self.topic, self.partition)
            if leader < 0:
                raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                          f"no upstream leader for {self.topic}-{self.partition}")
        req = messages.ProduceRequest
        body = req(transactional_id=self.txn_id, acks=-1, timeout_ms=int(self.timeout_s * 1000),
                   topic_data=[req.TopicProduceData(name=self.topic, partition_data=[
                       req.PartitionProduceData(index=self.partition, records=batch)])])
        deadline = time.monotonic() + self.timeout_s
        delay = _FIRST_RETRY_S
        while True:
            response = await self.cluster.send(leader, ApiKey.PRODUCE, body, _PRODUCE_V[self.transaction_version],
                                               lane=self.lane)
            (part,) = [p for t in response.responses for p in t.partition_responses]
            code = int(part.error_code)
            # TV2: the upstream adds the partition for the Produce, and refuses while the previous transaction's
            # markers are still being written; nothing was appended, so the same batch goes again.
            if code != ErrorCode.CONCURRENT_TRANSACTIONS or time.monotonic() >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)
        if code == ErrorCode.NONE:
            self.sequence = sequence
            return int(part.base_offset)
        if code in FENCING_ERRORS:
            self._fenced(code)
        if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:  # TV2: the Produce asked the coordinator, see below
            raise _Unknown(_forgotten(self.txn_id, self.producer_id))
        if code in LEADERSHIP_ERRORS:
            self.cluster.request_refresh()
        # NOT_ENOUGH_REPLICAS (the topic's min.insync.replicas not met) and the like: nothing was written.
        raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                  f"upstream refused the state write to {self.topic}-{self.partition}: "
                                  f"{error_name(code)}" + (f" ({part.error_message})" if part.error_message else ""))

    async def _end(self, *, commit: bool) -> None:
        body = messages.EndTxnRequest(transactional_id=self.txn_id, producer_id=self.producer_id,
                                      producer_epoch=self.producer_epoch, committed=commit)
        version = _END_TXN_V[self.transaction_version]
        try:
            response = await self._txn_request(ApiKey.END_TXN, body, version, lambda r: int(r.error_code))
        except CoordinatorLogError:
            raise
        except Exception as exc:
            raise _Unknown(str(exc)) from exc
        if self.transaction_version >= 2:
            # EndTxn v5 bumped the epoch (the markers carry the bumped one); the next transaction uses what
            # it names, from sequence 0.
            self.producer_id, self.producer_epoch, self.sequence = response.producer_id, response.producer_epoch, 0

    async def _abort(self) -> None:
        """Abort the open transaction; if even that fails, what the log holds is unknown: lose the partition."""
        try:
            await self._end(commit=False)
            if self.transaction_version >= 2:
                return  # EndTxn v5 bumped the epoch already
        except (CoordinatorLogError, _Unknown) as exc:
            # Fenced: the new owner's InitProducerId aborted it. Otherwise the transaction may still be open
            # with the failed write in it, and the next commit would make it count: lose the partition.
            if self.lost is None:
                self.lose(CoordinatorLogError(ErrorCode.NOT_COORDINATOR, f"state transaction abort failed: {exc}"),
                          fenced=False)
        # The next transaction starts from a clean epoch, as Kafka's producer does after an abort it cannot
        # vouch for (its sequence may or may not have advanced).
        if self.lost is None:
            try:
                await self._bump_epoch()
            except CoordinatorLogError:
                pass

    async def _bump_epoch(self) -> None:
        # KIP-360: InitProducerId with the current id and epoch bumps the epoch unless someone else did.
        body = messages.InitProducerIdRequest(transactional_id=self.txn_id, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                                              producer_id=self.producer_id, producer_epoch=self.producer_epoch)
        response = await self._txn_request(ApiKey.INIT_PRODUCER_ID, body, 4, lambda r: int(r.error_code))
        self.producer_id, self.producer_epoch, self.sequence = response.producer_id, response.producer_epoch, 0

    def _fenced(self, code: int) -> None:
        error = CoordinatorLogError(ErrorCode.NOT_COORDINATOR,
                                    f"state partition {self.topic}-{self.partition} was taken by another "
                                    f"instance (upstream error {code})")
        log.warning("state partition fenced by another instance", topic=self.topic, partition=self.partition,
                    error_code=code)
        self.lose(error, fenced=True)
        raise error

    async def _txn_request(self, api_key: int, body: MessageBase, version: int,
                           error_of: Callable[[Any], int]) -> Any:
        """A request to the transactional id's upstream coordinator, asked again while it answers with a
        retriable error, until the request timeout."""
        deadline = time.monotonic() + self.timeout_s
        last = "no answer"
        delay = _FIRST_RETRY_S
        while True:
            try:
                node = await self.cluster.coordinator(KEY_TYPE_TRANSACTION, self.txn_id)
                response = await self.cluster.send(node, api_key, body, version, lane=self.lane)
                code = error_of(response)
            except CoordinatorLookupFailed as exc:
                code = exc.error_code
            except SourceUnavailable as exc:
                self.cluster.forget_coordinator(KEY_TYPE_TRANSACTION, self.txn_id)
                if time.monotonic() >= deadline:
                    raise
                last = str(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RETRY_S)
                continue
            if code == ErrorCode.NONE:
                return response
            if code in FENCING_ERRORS:
                self._fenced(code)
            if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
                # The upstream forgot the transactional id (transactional.id.expiration.ms of quiet), or another
                # instance took it under a new producer id. The owner decides whether to take it again (which
                # re-reads the partition); continuing with a fresh id here could take it from its new owner.
                raise _Unknown(_forgotten(self.txn_id, self.producer_id))
            if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                self.cluster.forget_coordinator(KEY_TYPE_TRANSACTION, self.txn_id)
            last = f"error {code}"
            if code not in _TXN_RETRIABLE or time.monotonic() >= deadline:
                raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                          f"upstream {messages.API_NAMES.get(api_key)} for {self.txn_id}: {last}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY_S)


def _forgotten(txn_id: str, producer_id: int) -> str:
    return f"the upstream no longer knows {txn_id} under producer id {producer_id}"


def _add_partitions_error(response: messages.AddPartitionsToTxnResponse) -> int:
    codes = [p.partition_error_code for t in response.results_by_topic_v3_and_below for p in t.results_by_partition]
    return next((c for c in codes if c not in (ErrorCode.NONE, ErrorCode.OPERATION_NOT_ATTEMPTED)),
                int(response.error_code))


class UpstreamStateLog:
    """One coordinator topic on the upstream (`__shoal_consumer_offsets` or `__shoal_share_group_state`),
    as the `CoordinatorRecordLog` its coordinator runtime writes through.

    `take(partition)` before the runtime loads a partition, `release(partition)` when this instance hands
    it over; a partition not taken refuses appends with NOT_COORDINATOR and replays nothing.
    """

    def __init__(self, cluster: UpstreamCluster, topic: str, local_topic: str, num_partitions: int,
                 membership_group_id: str, *, on_lost: Callable[[int, bool], None] | None = None,
                 max_transaction_version: int = 2):
        self.cluster = cluster
        self.max_transaction_version = max_transaction_version
        self.topic = topic
        self.local_topic = local_topic  # whose record formats the partitions hold
        self._num_partitions = num_partitions
        self.membership_group_id = membership_group_id
        self.on_lost = on_lost
        self._writers: dict[int, _PartitionWriter] = {}
        self._loaded: dict[int, list[LoggedRecord]] = {}
        self._issued: dict[int, int] = {}  # per partition: where the offsets handed to appends end

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def owns(self, partition: int) -> bool:
        writer = self._writers.get(partition)
        return writer is not None and writer.lost is None

    def owned(self) -> list[int]:
        return sorted(p for p in self._writers if self.owns(p))

    # ---- ownership -------------------------------------------------------------------------------

    async def take(self, partition: int) -> None:
        """Own `partition`: fence its previous writer (InitProducerId), then read everything that committed
        there, for the coordinator's load to replay. Raises CoordinatorLogError (retriable) if the upstream
        cannot be reached within the request timeout."""
        old = self._writers.pop(partition, None)
        if old is not None:
            old.lose(CoordinatorLogError(ErrorCode.NOT_COORDINATOR, "state partition taken again"), fenced=False)
        timeout_s = self.cluster.config.request_timeout_ms / 1000
        writer = _PartitionWriter(self.cluster, self.topic, partition,
                                  transactional_id(self.membership_group_id, self.topic, partition), timeout_s,
                                  self.max_transaction_version)
        await writer.init()
        records, end = await self._read_committed(partition, timeout_s)
        # Offsets handed out stay monotonic across this partition's writers, so a flush of an earlier
        # writer's append can never be taken for one of the new writer's.
        writer.next_offset = max(end, self._issued.get(partition, 0))
        writer.on_lost = lambda fenced: self._lost(partition, writer, fenced)
        self._loaded[partition] = records
        self._writers[partition] = writer
        log.info("state partition taken", topic=self.topic, partition=partition, records=len(records),
                 producer_epoch=writer.producer_epoch, transaction_version=writer.transaction_version)

    def release(self, partition: int) -> None:
        """Stop writing `partition` (another instance is taking it); appends waiting on it fail with
        NOT_COORDINATOR, and none of them is reported as written unless its transaction committed."""
        writer = self._writers.pop(partition, None)
        self._loaded.pop(partition, None)
        if writer is not None:
            writer.on_lost = None
            writer.lose(CoordinatorLogError(ErrorCode.NOT_COORDINATOR, "state partition released"), fenced=False)

    def _lost(self, partition: int, writer: _PartitionWriter, fenced: bool) -> None:
        if self._writers.get(partition) is writer and self.on_lost is not None:
            self.on_lost(partition, fenced)

    async def _read_committed(self, partition: int, timeout_s: float) -> tuple[list[LoggedRecord], int]:
        """Every committed record of the partition from its log start, and the offset the reading ended at.
        Waits (within `timeout_s`) for the end-transaction markers of transactions still being completed,
        so the read reaches the high watermark."""
        source = UpstreamPartitionSource(self.cluster, BatchCache(0), self.topic, partition)
        deadline = time.monotonic() + timeout_s
        # Which transactions committed is decided by the markers read, not by the aborted list of the Fetch
        # answer: the same on a correct upstream, and right on one that returns aborted records unlisted.
        committed: MarkerFilter[tuple[BatchHeader, memoryview]] = MarkerFilter()
        try:
            offset = await source.list_offset(EARLIEST)
            out: list[LoggedRecord] = []
            decoded = 0
            while True:
                read = await source.read(offset, _READ_BYTES, read_committed=True)
                start = offset
                for header, data in read.batches:
                    if header.last_offset < offset or header.base_offset >= read.last_stable_offset:
                        continue
                    offset = header.last_offset + 1
                    commit = None
                    if header.is_control:
                        markers = logged_records(self.local_topic, partition, header, decode_records(data, 0, header))
                        commit = any(isinstance(m, EndTransactionMarker) and m.commit for m in markers)
                    for kept_header, kept in committed.add(header, (header, data), commit):
                        for item in logged_records(self.local_topic, partition, kept_header,
                                                   decode_records(kept, 0, kept_header)):
                            if isinstance(item, LoggedRecord):  # committed: it counts as written plainly
                                out.append(LoggedRecord(item.offset, item.record))
                        decoded += 1
                        if decoded % _DECODE_YIELD_EVERY == 0:
                            await asyncio.sleep(0)
                if offset >= read.high_watermark and not committed.undecided:
                    return out, offset
                if offset == start or offset >= read.high_watermark:
                    # Nothing readable yet: an earlier owner's transaction is still being completed (its
                    # marker is on the way, holding the last stable offset back, or, on an upstream that
                    # reads past it, leaving batches undecided), or the upstream sent nothing.
                    if time.monotonic() >= deadline:
                        raise CoordinatorLogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                                  f"{self.topic}-{partition}: no progress reading at {offset} "
                                                  f"(last stable offset {read.last_stable_offset})")
                    await asyncio.sleep(_READ_RETRY_S)
        except SourceUnavailable as exc:
            raise CoordinatorLogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                      f"reading {self.topic}-{partition} failed: {exc}") from exc

    # ---- CoordinatorRecordLog ----------------------------------------------------------------------

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        first = self.append_nowait(partition, records)
        await self.flush(partition, first + len(records))
        return first

    def append_nowait(self, partition: int, records: list[CoordinatorRecord]) -> int:
        writer = self._writers.get(partition)
        if writer is None:
            raise CoordinatorLogError(ErrorCode.NOT_COORDINATOR,
                                      f"state partition {self.topic}-{partition} is not owned by this instance")
        first = writer.append(records)
        self._issued[partition] = writer.next_offset
        return first

    async def flush(self, partition: int, end_offset: int) -> None:
        writer = self._writers.get(partition)
        if writer is None:
            raise CoordinatorLogError(ErrorCode.NOT_COORDINATOR,
                                      f"state partition {self.topic}-{partition} is not owned by this instance")
        await writer.flush(end_offset)

    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        """What `take` read, once (the coordinator's load); nothing for a partition not taken."""
        for item in self._loaded.pop(partition, []):
            yield item.offset, item.record

    def replay_transactional(self, partition: int) -> Iterator[LoggedRecord | EndTransactionMarker]:
        """`replay` for the group coordinator's runtime: every record already committed, none pending."""
        yield from self._loaded.pop(partition, [])

    def append_transactional_nowait(self, partition: int, records: list[CoordinatorRecord], producer_id: int,
                                    producer_epoch: int) -> int:
        """Not in sidecar mode: transactional offset commits are forwarded to the upstream's coordinator."""
        raise CoordinatorLogError(ErrorCode.NOT_COORDINATOR, "transactional offset commits go to the upstream")

    def delete_before(self, partition: int, offset: int) -> None:
        """Nothing to do: the topic is compacted (Kafka refuses DeleteRecords on compacted topics), and every
        share-state write on it is a snapshot, so compaction keeps what replay needs."""
