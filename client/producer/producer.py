"""The bundled producer: per-partition batching (linger / batch size), compression, idempotence, retries,
and transactions (with a `transactional_id`: init_transactions, begin_transaction, send_offsets_to_transaction,
commit_transaction, abort_transaction, as in Kafka's producer).

`AsyncProducer` is the asyncio client; `Producer` runs one on a background event-loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections import deque
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.client.cluster import Cluster
from shoal.client.errors import ClientClosedError, KafkaError, KafkaTimeoutError, UnknownTopicError, for_code
from shoal.client.loop_thread import LoopThread
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.compression import codec_from_name
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import Header, RecordInput, encode_batch

from .partitioner import StickyPartitioner, partition_for_key

PRODUCE_VERSIONS = (3, 12)  # v13 addresses topics by id only; names are all this client needs
INIT_PRODUCER_ID_VERSIONS = (0, 4)
ADD_PARTITIONS_TO_TXN_VERSIONS = (0, 3)  # v4+ is the brokers' own verification form
ADD_OFFSETS_TO_TXN_VERSIONS = (0, 3)
END_TXN_VERSIONS = (0, 3)
TXN_OFFSET_COMMIT_VERSIONS = (0, 3)
COORDINATOR_TRANSACTION = 1
# Per-record bytes beyond key and value in a v2 batch (length, attributes, deltas, header count), roughly.
_RECORD_OVERHEAD = 12
_BATCH_OVERHEAD = 61
_MAX_SEQUENCE = 0x7FFFFFFF

HeadersArg = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None
# (topic, value, key, headers, partition) for send_many; partition None = chosen by key or sticky.
OutgoingRecord = tuple[str, bytes | None, bytes | None, HeadersArg, int | None]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record landed. `offset` is -1 when acks=0 or for a duplicate the broker dropped."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class _Delivery:
    """The records of one send_many(): a single future for all of them, in place of one per record."""

    __slots__ = ("future", "queued", "delivered", "sealed")

    def __init__(self, future: asyncio.Future[int]) -> None:
        self.future = future
        self.queued = 0
        self.delivered = 0
        self.sealed = False  # every record has been queued

    def add(self, count: int) -> None:
        self.delivered += count
        self._maybe_done()

    def seal(self) -> None:
        self.sealed = True
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.sealed and self.delivered == self.queued and not self.future.done():
            self.future.set_result(self.queued)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class _Batch:
    topic: str
    partition: int
    created: float
    records: list[RecordInput] = field(default_factory=list)
    # (index in records, future) of records queued by send(); send_many's records count in `deliveries`.
    futures: list[tuple[int, asyncio.Future[RecordMetadata]]] = field(default_factory=list)
    deliveries: dict[_Delivery, int] = field(default_factory=dict)
    settled: asyncio.Future[None] | None = None  # made by flush(), resolved once the batch is done
    done: bool = False  # delivered or failed (a request task may still list it)
    size: int = _BATCH_OVERHEAD
    full: bool = False
    encoded: bytes | None = None
    producer_id: int = -1
    base_sequence: int = -1
    attempts: int = 0
    retry_at: float = 0.0
    deadline: float = 0.0


def _timestamp(timestamp_ms: int | None) -> int:
    return timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000


def _headers(headers: HeadersArg) -> list[Header]:
    if not headers:
        return []
    items: Iterable[tuple[str, bytes | None]] = headers.items() if isinstance(headers, Mapping) else headers
    return [Header(k, v) for k, v in items]


# Four times the Java client's 16 KiB: this producer keeps one request in flight per partition (idempotent
# order without re-sequencing) where the Java client pipelines five, so small batches leave it waiting on
# round trips. Bigger batches would send faster still, but a share consumer acquires a log batch whole:
# about 500 records of 100 B (one ShareConsumer poll) keep a queue's work spread across its consumers.
DEFAULT_BATCH_SIZE = 64 * 1024


class AsyncProducer:
    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        *,
        acks: int | str = -1,
        linger_ms: int = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compression: str = "none",
        enable_idempotence: bool | None = None,
        client_id: str | None = None,
        request_timeout_ms: int | None = None,  # default: request.timeout.ms of `config`, else 30 s
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        max_request_size: int = 1_048_576,
        buffer_memory: int = 32 * 1024 * 1024,
        config: Mapping[str, Any] | None = None,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ):
        self.acks = -1 if acks in ("all", -1, "-1") else int(acks)
        if transactional_id is not None and (self.acks != -1 or enable_idempotence is False):
            raise ValueError("a transactional producer is idempotent and needs acks=-1 (all)")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._in_transaction = False
        self._txn_partitions: set[tuple[str, int]] = set()
        self._txn_error: BaseException | None = None
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1/all, 0 or 1, not {acks!r}")
        if enable_idempotence and self.acks != -1:
            raise ValueError("enable_idempotence requires acks=-1 (all)")
        # As in Kafka: idempotence is on by default unless the acks setting rules it out.
        self.idempotent = self.acks == -1 if enable_idempotence is None else enable_idempotence
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.compression = codec_from_name(compression)
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.max_request_size = max_request_size
        self.buffer_memory = buffer_memory
        self.config = ClientConfig.from_dict(config, client_id=client_id, request_timeout_ms=request_timeout_ms)
        self.cluster = Cluster(bootstrap_servers, self.config)
        self._partitioner = StickyPartitioner()
        self._batches: dict[tuple[str, int], deque[_Batch]] = {}
        self._in_flight: set[tuple[str, int]] = set()
        self._requests: dict[asyncio.Task[None], list[_Batch]] = {}  # in flight, with the batches each carries
        self._sequences: dict[tuple[str, int], int] = {}
        self._producer_id = -1
        self._producer_epoch = -1
        self._buffered = 0
        self._space = asyncio.Event()
        self._space.set()
        self._wakeup = asyncio.Event()
        self._flushing = 0
        self._sender: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._metadata_task: asyncio.Task[None] | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise ClientClosedError()
            await self.cluster.start()
            if self.idempotent and self.transactional_id is None:
                await self._init_producer_id()
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())
            self._started = True

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _init_producer_id(self) -> None:
        body = messages.InitProducerIdRequest(transactional_id=self.transactional_id,
                                              transaction_timeout_ms=self.transaction_timeout_ms)
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            if self.transactional_id is None:
                conn = await self.cluster.any_connection()
            else:
                conn = await self.cluster.connection(await self._txn_coordinator())
            response = await conn.request(ApiKey.INIT_PRODUCER_ID, body, versions=INIT_PRODUCER_ID_VERSIONS)
            if response.error_code == 0:
                self._producer_id = response.producer_id
                self._producer_epoch = response.producer_epoch
                self._sequences.clear()
                return
            error = for_code(response.error_code)
            if not error.retriable or time.monotonic() > deadline:
                raise error
            await asyncio.sleep(self.retry_backoff_s)

    # ---- transactions --------------------------------------------------------------------------------

    async def _txn_coordinator(self) -> int:
        assert self.transactional_id is not None
        return await self.cluster.find_coordinator(self.transactional_id, COORDINATOR_TRANSACTION)

    async def _txn_request(self, api_key: int, body: Any, versions: tuple[int, int]) -> Any:
        """A request to the transaction coordinator, retried while it answers with a retriable error."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while True:
            node = await self._txn_coordinator()
            response = await self.cluster.request(node, api_key, body, versions)
            code = getattr(response, "error_code", 0)
            if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
                codes = [p.partition_error_code for t in response.results_by_topic_v3_and_below
                         for p in t.results_by_partition]
                code = next((c for c in codes if c not in (0, ErrorCode.OPERATION_NOT_ATTEMPTED)), 0)
            if code == 0:
                return response
            error = for_code(code)
            if not error.retriable or time.monotonic() >= deadline:
                raise error
            await asyncio.sleep(self.retry_backoff_s)

    def _txn_id(self) -> str:
        if self.transactional_id is None:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "the producer has no transactional_id")
        return self.transactional_id

    def _require_transactional(self) -> None:
        if self.transactional_id is None:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "the producer has no transactional_id")

    async def init_transactions(self) -> None:
        """Get the producer id and epoch for the transactional id, fencing older producers that use it
        and completing (aborting) a transaction a previous incarnation left open."""
        self._require_transactional()
        await self.start()
        await self._init_producer_id()
        self._in_transaction = False
        self._txn_partitions.clear()

    def begin_transaction(self) -> None:
        self._require_transactional()
        if self._producer_id < 0:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "call init_transactions() first")
        if self._in_transaction:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "a transaction is already open")
        self._in_transaction = True
        self._txn_error = None
        self._txn_partitions.clear()

    async def _add_to_transaction(self, tp: tuple[str, int]) -> None:
        if tp in self._txn_partitions:
            return
        req = messages.AddPartitionsToTxnRequest
        body = req(v3_and_below_transactional_id=self._txn_id(), v3_and_below_producer_id=self._producer_id,
                   v3_and_below_producer_epoch=self._producer_epoch,
                   v3_and_below_topics=[req.AddPartitionsToTxnTopic(name=tp[0], partitions=[tp[1]])])
        await self._txn_request(ApiKey.ADD_PARTITIONS_TO_TXN, body, ADD_PARTITIONS_TO_TXN_VERSIONS)
        self._txn_partitions.add(tp)

    async def send_offsets_to_transaction(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None:
        """Commit a consumer group's offsets as part of the open transaction (consume-transform-produce)."""
        if not self._in_transaction:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "no open transaction")
        body = messages.AddOffsetsToTxnRequest(transactional_id=self._txn_id(), producer_id=self._producer_id,
                                               producer_epoch=self._producer_epoch, group_id=group_id)
        await self._txn_request(ApiKey.ADD_OFFSETS_TO_TXN, body, ADD_OFFSETS_TO_TXN_VERSIONS)
        req = messages.TxnOffsetCommitRequest
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(req.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=""))
        commit = req(transactional_id=self._txn_id(), group_id=group_id, producer_id=self._producer_id,
                     producer_epoch=self._producer_epoch, generation_id_or_member_epoch=-1, member_id="",
                     group_instance_id=None,
                     topics=[req.TxnOffsetCommitRequestTopic(name=t, partitions=ps)
                             for t, ps in by_topic.items()])
        node = await self.cluster.find_coordinator(group_id)
        response = await self.cluster.request(node, ApiKey.TXN_OFFSET_COMMIT, commit, TXN_OFFSET_COMMIT_VERSIONS)
        for t in response.topics:
            for p in t.partitions:
                if p.error_code:
                    raise for_code(p.error_code, f"{t.name}-{p.partition_index}")

    async def commit_transaction(self) -> None:
        """Send what is buffered, then commit; raises (and the transaction must be aborted) if a record failed."""
        await self._end_transaction(commit=True)

    async def abort_transaction(self) -> None:
        await self._end_transaction(commit=False)

    async def _end_transaction(self, *, commit: bool) -> None:
        if not self._in_transaction:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "no open transaction")
        with contextlib.suppress(KafkaError):
            await self.flush(self.delivery_timeout_s)
        if commit and self._txn_error is not None:
            if isinstance(self._txn_error, KafkaError):
                raise self._txn_error
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, f"a record of the transaction failed: {self._txn_error}")
        if self._txn_partitions:
            body = messages.EndTxnRequest(transactional_id=self._txn_id(), producer_id=self._producer_id,
                                          producer_epoch=self._producer_epoch, committed=commit)
            await self._txn_request(ApiKey.END_TXN, body, END_TXN_VERSIONS)
        self._in_transaction = False
        self._txn_partitions.clear()

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each record has succeeded or failed."""
        if not self._started:
            return
        batches = [b for dq in self._batches.values() for b in dq] + self._in_flight_batches
        futures: list[asyncio.Future[None]] = []
        for b in batches:
            if b.done:
                continue
            if b.settled is None:
                b.settled = asyncio.get_running_loop().create_future()
            futures.append(b.settled)
        if not futures:
            return
        self._flushing += 1
        self._wakeup.set()
        try:
            # asyncio.wait, unlike wait_for(gather), leaves the futures alone on timeout.
            _, not_done = await asyncio.wait(futures, timeout=timeout)
        finally:
            self._flushing -= 1
        if not_done:
            raise KafkaTimeoutError(None, f"{len(not_done)} records still unsent after flush({timeout})")

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then close connections. Records still unsent after `timeout` fail."""
        if self._closed:
            return
        try:
            if self._started:
                with contextlib.suppress(KafkaTimeoutError):
                    await self.flush(timeout)
        finally:
            self._closed = True
            if self._sender is not None:
                self._sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sender
            for task in list(self._requests):
                task.cancel()
            await asyncio.gather(*self._requests, return_exceptions=True)
            error = ClientClosedError("the producer was closed before the record was sent")
            for dq in self._batches.values():
                for batch in dq:
                    self._fail_batch(batch, error)
            self._batches.clear()
            await self.cluster.close()

    # ---- appending -----------------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the returned future resolves to its RecordMetadata once the broker has it."""
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        record: OutgoingRecord = (topic, value, key, headers, partition)
        if not self._queue_now(record, timestamp_ms, future):
            await self._queue_waiting(record, timestamp_ms, future)
        return future

    async def send_many(self, records: Iterable[OutgoingRecord]) -> int:
        """Queue many records at once and wait until the broker has them all; raises the first failure.
        Returns how many were sent. The records share one future, and a record takes a step through the
        event loop only when it must wait (for metadata, buffer space or a transaction)."""
        delivery = _Delivery(asyncio.get_running_loop().create_future())
        try:
            for record in records:
                if not self._queue_now(record, None, delivery):
                    await self._queue_waiting(record, None, delivery)
        except BaseException:
            # The caller gets this error and awaits nothing more; what was queued is still sent.
            delivery.future.cancel()
            raise
        delivery.seal()
        return await delivery.future

    def _queue_now(
        self, record: OutgoingRecord, timestamp_ms: int | None, waiter: asyncio.Future[RecordMetadata] | _Delivery
    ) -> bool:
        """Queue `record` if no step has to wait (for the producer's start, metadata, buffer space or a
        transaction); False, having changed nothing, otherwise."""
        if self._closed or not self._started or self.transactional_id is not None:
            return False
        topic, value, key, headers, partition = record
        info = self.cluster.topics.get(topic)
        if info is None or not info.partitions:
            return False
        size, rec_headers = self._record_size(key, value, headers)
        if self._buffered + size > self.buffer_memory and self._buffered > 0:
            return False
        num = len(info.partitions)
        partition = self._pick_partition(topic, key, partition, info.partitions, num)
        self._append(topic, partition, num, RecordInput(key, value, rec_headers, _timestamp(timestamp_ms)), size, waiter)
        return True

    async def _queue_waiting(
        self, record: OutgoingRecord, timestamp_ms: int | None, waiter: asyncio.Future[RecordMetadata] | _Delivery
    ) -> None:
        """Queue `record`, waiting where _queue_now could not."""
        topic, value, key, headers, partition = record
        if self._closed:
            raise ClientClosedError()
        if not self._started:
            await self.start()
        if self.transactional_id is not None and not self._in_transaction:
            raise KafkaError(ErrorCode.INVALID_TXN_STATE, "a transactional producer sends inside begin_transaction()")
        info = self.cluster.topics.get(topic)
        if info is None or not info.partitions:
            info = await self.cluster.topic(topic, allow_auto_create=True)
        size, rec_headers = self._record_size(key, value, headers)
        while self._buffered + size > self.buffer_memory and self._buffered > 0:
            self._space.clear()
            await self._space.wait()
        num = len(info.partitions)
        partition = self._pick_partition(topic, key, partition, info.partitions, num)
        if self.transactional_id is not None:
            try:
                await self._add_to_transaction((topic, partition))
            except KafkaError as exc:
                self._txn_error = exc  # the transaction can no longer commit
                raise
        self._append(topic, partition, num, RecordInput(key, value, rec_headers, _timestamp(timestamp_ms)), size, waiter)

    def _record_size(self, key: bytes | None, value: bytes | None, headers: HeadersArg) -> tuple[int, list[Header]]:
        size = _RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        rec_headers: list[Header] = []
        if headers:
            rec_headers = _headers(headers)
            size += sum(len(h.key) + len(h.value or b"") + 4 for h in rec_headers)
        if size + _BATCH_OVERHEAD > self.max_request_size:
            raise KafkaError(ErrorCode.MESSAGE_TOO_LARGE, f"record of {size} bytes exceeds max_request_size")
        return size, rec_headers

    def _pick_partition(
        self, topic: str, key: bytes | None, partition: int | None, partitions: Container[int], num: int
    ) -> int:
        if partition is None:
            return partition_for_key(key, num) if key is not None else self._partitioner.partition(topic, num)
        if partition not in partitions:
            raise UnknownTopicError(None, f"{topic} has no partition {partition}")
        return partition

    def _append(
        self,
        topic: str,
        partition: int,
        num_partitions: int,
        record: RecordInput,
        size: int,
        waiter: asyncio.Future[RecordMetadata] | _Delivery,
    ) -> None:
        tp = (topic, partition)
        dq = self._batches.get(tp)
        if dq is None:
            dq = self._batches[tp] = deque()
        batch = dq[-1] if dq else None
        if batch is None or batch.full or (batch.records and batch.size + size > self.batch_size):
            if batch is not None and not batch.full:
                self._close_batch(batch, num_partitions)
            now = time.monotonic()
            batch = _Batch(topic, partition, now, deadline=now + self.delivery_timeout_s)
            dq.append(batch)
            self._wakeup.set()  # the sender computes its next linger deadline from the new batch
        if isinstance(waiter, _Delivery):
            waiter.queued += 1
            batch.deliveries[waiter] = batch.deliveries.get(waiter, 0) + 1
        else:
            batch.futures.append((len(batch.records), waiter))
        batch.records.append(record)
        batch.size += size
        self._buffered += size
        if batch.size >= self.batch_size:
            self._close_batch(batch, num_partitions)

    async def send_and_wait(self, topic: str, value: bytes | None, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, value, **kwargs))

    def _close_batch(self, batch: _Batch, num_partitions: int) -> None:
        batch.full = True
        self._partitioner.on_new_batch(batch.topic, num_partitions, batch.partition)
        self._wakeup.set()

    @property
    def _in_flight_batches(self) -> list[_Batch]:
        return [b for batches in self._requests.values() for b in batches]

    # ---- sending -------------------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            now = time.monotonic()
            wait: float | None = None
            ready: dict[int, list[_Batch]] = {}
            need_metadata = False
            for tp, dq in self._batches.items():
                if not dq or tp in self._in_flight:
                    continue
                batch = dq[0]
                if now >= batch.deadline:
                    dq.popleft()
                    self._fail_batch(batch, KafkaTimeoutError(None, f"{tp[0]}-{tp[1]}: not delivered within delivery_timeout_ms"))
                    continue
                if batch.retry_at > now:
                    wait = min(wait if wait is not None else 1e9, batch.retry_at - now)
                    continue
                due = batch.created + self.linger_s
                if not (batch.full or len(dq) > 1 or due <= now or self._flushing or self._closed):
                    wait = min(wait if wait is not None else 1e9, due - now)
                    continue
                leader = self.cluster.leader(*tp)
                if leader < 0 or leader not in self.cluster.brokers:
                    need_metadata = True
                    wait = min(wait if wait is not None else 1e9, self.retry_backoff_s)
                    continue
                ready.setdefault(leader, []).append(batch)
            if need_metadata:
                self._refresh_metadata_soon()
            for node, batches in ready.items():
                self._dispatch(node, batches)
            self._wakeup.clear()
            if wait is None:
                await self._wakeup.wait()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), max(wait, 0.0005))

    def _refresh_metadata_soon(self) -> None:
        if self._metadata_task is not None and not self._metadata_task.done():
            return

        async def refresh() -> None:
            with contextlib.suppress(KafkaError):
                await self.cluster.refresh_metadata([t for t, _ in self._batches])
            self._wakeup.set()

        self._metadata_task = asyncio.get_running_loop().create_task(refresh())

    def _dispatch(self, node: int, batches: list[_Batch]) -> None:
        # Split into requests of at most max_request_size; one batch per partition per request, and at
        # most one in flight per partition, which keeps idempotent sequences in order across retries.
        group: list[_Batch] = []
        size = 0
        for batch in batches:
            if group and size + batch.size > self.max_request_size:
                self._start_request(node, group)
                group, size = [], 0
            self._batches[(batch.topic, batch.partition)].popleft()
            self._in_flight.add((batch.topic, batch.partition))
            group.append(batch)
            size += batch.size
        if group:
            self._start_request(node, group)

    def _forget_request(self, task: asyncio.Task[None]) -> None:
        self._requests.pop(task, None)

    def _start_request(self, node: int, batches: list[_Batch]) -> None:
        task = asyncio.get_running_loop().create_task(self._produce(node, batches))
        self._requests[task] = batches
        task.add_done_callback(self._forget_request)

    def _encode(self, batch: _Batch) -> bytes:
        tp = (batch.topic, batch.partition)
        if batch.encoded is not None and batch.producer_id == self._producer_id:
            return batch.encoded
        if self.idempotent:
            seq = self._sequences.get(tp, 0)
            batch.base_sequence = seq
            batch.producer_id = self._producer_id
            self._sequences[tp] = (seq + len(batch.records)) & _MAX_SEQUENCE
            batch.encoded = encode_batch(
                batch.records,
                compression=self.compression,
                producer_id=self._producer_id,
                producer_epoch=self._producer_epoch,
                base_sequence=seq,
                is_transactional=self.transactional_id is not None,
            )
        else:
            batch.encoded = encode_batch(batch.records, compression=self.compression)
        return batch.encoded

    async def _produce(self, node: int, batches: list[_Batch]) -> None:
        try:
            by_topic: dict[str, list[Any]] = {}
            for batch in batches:
                by_topic.setdefault(batch.topic, []).append(
                    messages.ProduceRequest.PartitionProduceData(index=batch.partition, records=self._encode(batch))
                )
            topic_data = [
                messages.ProduceRequest.TopicProduceData(name=t, partition_data=parts)
                for t, parts in by_topic.items()
            ]
            body = messages.ProduceRequest(
                transactional_id=self.transactional_id, acks=self.acks, timeout_ms=self.config.request_timeout_ms, topic_data=topic_data
            )
            try:
                response = await self.cluster.request(
                    node, ApiKey.PRODUCE, body, PRODUCE_VERSIONS, expect_response=self.acks != 0
                )
            except KafkaError as exc:
                for batch in batches:
                    await self._on_error(batch, exc)
                return
            if response is None:  # acks=0: nothing comes back
                for batch in batches:
                    self._complete(batch, -1, -1)
                return
            results = {
                (t.name, p.index): p for t in response.responses for p in t.partition_responses
            }
            for batch in batches:
                p = results.get((batch.topic, batch.partition))
                if p is None:
                    await self._on_error(batch, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, "partition missing from response"))
                elif p.error_code == 0:
                    self._complete(batch, p.base_offset, p.log_append_time_ms)
                elif p.error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                    self._complete(batch, -1, -1)  # an earlier attempt was written; the broker dropped this copy
                else:
                    await self._on_error(batch, for_code(p.error_code, p.error_message))
        finally:
            for batch in batches:
                self._in_flight.discard((batch.topic, batch.partition))
            self._wakeup.set()

    def _complete(self, batch: _Batch, base_offset: int, log_append_time: int) -> None:
        for i, future in batch.futures:
            if not future.done():
                ts = log_append_time if log_append_time not in (None, -1) else (batch.records[i].timestamp or -1)
                offset = base_offset + i if base_offset >= 0 else -1
                future.set_result(RecordMetadata(batch.topic, batch.partition, offset, ts))
        deliveries, batch.deliveries = batch.deliveries, {}
        for delivery, count in deliveries.items():
            delivery.add(count)
        self._release(batch)

    def _fail_batch(self, batch: _Batch, error: BaseException) -> None:
        if self._in_transaction and batch.records:
            self._txn_error = error
        for _, future in batch.futures:
            if not future.done():
                future.set_exception(error)
        deliveries, batch.deliveries = batch.deliveries, {}
        for delivery in deliveries:
            delivery.fail(error)
        self._release(batch)

    def _release(self, batch: _Batch) -> None:
        batch.done = True
        if batch.settled is not None and not batch.settled.done():
            batch.settled.set_result(None)
        self._buffered -= batch.size - _BATCH_OVERHEAD
        batch.size = _BATCH_OVERHEAD
        if self._buffered <= self.buffer_memory:
            self._space.set()

    async def _on_error(self, batch: _Batch, error: KafkaError) -> None:
        batch.attempts += 1
        code = error.code
        sequence_trouble = code in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID)
        retriable = error.retriable or (self.idempotent and sequence_trouble)
        if self._closed or not retriable or time.monotonic() >= batch.deadline:
            if self.idempotent and batch.producer_id == self._producer_id:
                # The broker now expects a sequence this batch will never fill: start a new producer id.
                with contextlib.suppress(KafkaError):
                    await self._init_producer_id()
            self._fail_batch(batch, error)
            return
        if sequence_trouble and batch.producer_id == self._producer_id:
            with contextlib.suppress(KafkaError):
                await self._init_producer_id()
        if code in (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            ErrorCode.LEADER_NOT_AVAILABLE,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            13,
            ErrorCode.FENCED_LEADER_EPOCH,
        ):
            self._refresh_metadata_soon()
        batch.retry_at = time.monotonic() + self.retry_backoff_s
        self._batches.setdefault((batch.topic, batch.partition), deque()).appendleft(batch)


class Producer:
    """Synchronous facade: an AsyncProducer on a background event-loop thread."""

    def __init__(self, bootstrap_servers: str | Iterable[str], **kwargs: Any):
        self._thread = LoopThread("shoal-producer")
        self._outstanding: set[concurrent.futures.Future[Any]] = set()
        self._producer = self._thread.run(self._make(bootstrap_servers, kwargs))
        try:
            self._thread.run(self._producer.start())
        except BaseException:
            self._thread.run(self._producer.close())
            self._thread.stop()
            raise

    @staticmethod
    async def _make(bootstrap_servers: str | Iterable[str], kwargs: dict[str, Any]) -> AsyncProducer:
        # Built on the loop thread so its asyncio primitives belong to that loop.
        return AsyncProducer(bootstrap_servers, **kwargs)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a record; the future resolves once the broker has it (or fails)."""
        coro = self._producer.send_and_wait(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        future = self._thread.submit(coro)
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        return future

    def send_many(self, records: Iterable[OutgoingRecord]) -> concurrent.futures.Future[int]:
        """Queue many records in one step (much cheaper than a send() each); the future resolves to their
        number once the broker has them all, or fails with the first error."""
        future = self._thread.submit(self._producer.send_many(list(records)))
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        return future

    def flush(self, timeout: float | None = None) -> None:
        # Records whose send() has not reached the accumulator yet (e.g. waiting for metadata) are covered
        # by waiting on their futures too.
        pending = list(self._outstanding)
        self._thread.run(self._producer.flush(timeout))
        _, not_done = concurrent.futures.wait(pending, timeout)
        if not_done:
            raise KafkaTimeoutError(None, f"{len(not_done)} records still unsent after flush({timeout})")

    # Transactions (see AsyncProducer).
    def init_transactions(self) -> None:
        self._thread.run(self._producer.init_transactions())

    def begin_transaction(self) -> None:
        self._thread.run(self._begin())

    async def _begin(self) -> None:
        self._producer.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None:
        self._thread.run(self._producer.send_offsets_to_transaction(offsets, group_id))

    def commit_transaction(self) -> None:
        self.flush()
        self._thread.run(self._producer.commit_transaction())

    def abort_transaction(self) -> None:
        with contextlib.suppress(KafkaError):
            self.flush()
        self._thread.run(self._producer.abort_transaction())

    def close(self, timeout: float | None = None) -> None:
        try:
            self._thread.run(self._producer.close(timeout))
        finally:
            self._thread.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
