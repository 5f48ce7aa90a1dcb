"""Produce: authorize, find each partition, and hand its records to `PartitionLog.append_as_leader`, which
checks them against the topic's rules and the producer's state, appends them and wakes long polls.

Batches stay as the client's bytes: only base offsets (and LogAppendTime stamps) are patched in place.
acks=-1 is answered after the data is fsynced; concurrent producers share fsyncs through the log's group commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import structlog

from shoal.broker.apis.txn_apis import client_error
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.storage.partition_log import AppendOrigin, AppendRefused
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ProduceServices
    from shoal.broker.network.connection import RequestContext
    from shoal.broker.storage.partition_log import PartitionLog

log = structlog.get_logger("shoal.produce")

# Kafka lets only its own admin tooling (this client id) append to internal topics.
ADMIN_CLIENT_ID = "__admin_client"

ProduceResponse = messages.ProduceResponse
TopicResponse = ProduceResponse.TopicProduceResponse
PartitionResponse = ProduceResponse.PartitionProduceResponse
_RecordError = ProduceResponse.BatchIndexAndErrorMessage
DescribeProducersResponse = messages.DescribeProducersResponse
_DpTopic = DescribeProducersResponse.TopicResponse
_DpPartition = DescribeProducersResponse.PartitionResponse
_DpProducer = DescribeProducersResponse.ProducerState


class ProduceHandler:
    def __init__(self, services: ProduceServices):
        self.services = services

    def handle(self, ctx: RequestContext, req: messages.ProduceRequest
               ) -> messages.ProduceResponse | None | Awaitable[messages.ProduceResponse | None]:
        """The response, or None for acks=0 (nothing is sent back). Appends happen here, at once; with
        acks=all the answer waits for their fsync, so an awaitable of it is returned instead."""
        version = ctx.api_version
        acks = req.acks
        if req.transactional_id is not None and not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                                  req.transactional_id):
            return _refuse_all(req, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if acks not in (-1, 0, 1):
            return _refuse_all(req, ErrorCode.INVALID_REQUIRED_ACKS)
        if req.transactional_id is not None and version >= 12 and self.services.add_txn_partitions is not None:
            return self._after_adding_partitions(ctx, req)
        return self._append_all(ctx, req, {})

    async def _after_adding_partitions(self, ctx: RequestContext, req: messages.ProduceRequest
                                       ) -> messages.ProduceResponse | None:
        """KIP-890 part 2: from v12 the broker adds a transactional batch's partition to the producer's
        transaction (a transaction.version 2 producer sends no AddPartitionsToTxn), then appends."""
        assert self.services.add_txn_partitions is not None
        not_added = await self.services.add_txn_partitions(ctx, req)
        result = self._append_all(ctx, req, not_added)
        if result is None or isinstance(result, ProduceResponse):
            return result
        return await result

    def _append_all(self, ctx: RequestContext, req: messages.ProduceRequest, not_added: dict[tuple[str, int], int]
                    ) -> messages.ProduceResponse | None | Awaitable[messages.ProduceResponse | None]:
        version = ctx.api_version
        acks = req.acks
        internal_allowed = ctx.header.client_id == ADMIN_CLIENT_ID
        responses = []
        flushes: list[tuple[PartitionLog, int]] = []
        for td in req.topic_data:
            topic = self.services.topics.get_by_id(td.topic_id) if version >= 13 else self.services.topics.get(td.name)
            topic_name = topic.name if topic is not None else td.name
            # As Kafka, each topic is authorized once per request, not once per partition.
            writable = topic is not None and ctx.authorize(Operation.WRITE, ResourceType.TOPIC, topic.name)
            parts = []
            for pd in td.partition_data:
                if topic is None:
                    code = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    parts.append(PartitionResponse(index=pd.index, error_code=code, base_offset=-1))
                elif not writable:
                    parts.append(
                        PartitionResponse(index=pd.index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, base_offset=-1)
                    )
                elif not 0 <= pd.index < len(topic.partitions):
                    parts.append(
                        PartitionResponse(index=pd.index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, base_offset=-1)
                    )
                elif acks == -1 and (min_isr := topic.partitions[pd.index].config.produce.min_insync_replicas) > 1:
                    # Kafka refuses before appending when the ISR (here: this broker alone) is below the minimum.
                    log.warning("acks=all produce refused: not enough in-sync replicas", topic=topic.name,
                                partition=pd.index, min_insync_replicas=min_isr)
                    parts.append(PartitionResponse(
                        index=pd.index, error_code=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1,
                        error_message=f"The size of the current ISR 1 is insufficient to satisfy the min.isr "
                                      f"requirement of {min_isr} for partition {topic.name}-{pd.index}"))
                elif (topic.name, pd.index) in not_added:
                    parts.append(PartitionResponse(index=pd.index, error_code=not_added[(topic.name, pd.index)],
                                                   base_offset=-1))
                else:
                    plog = topic.partitions[pd.index]
                    try:
                        result = plog.append_as_leader(
                            pd.records, origin=AppendOrigin.CLIENT, internal_topics_allowed=internal_allowed,
                            transactional_id=req.transactional_id,
                            verify_transaction=self.services.verify_txn_partition, handed_over=True,
                            single_batch=True,
                        )
                    except AppendRefused as exc:
                        parts.append(PartitionResponse(index=pd.index, base_offset=-1,
                                                       error_code=client_error(ApiKey.PRODUCE, version, exc.error_code),
                                                       error_message=exc.message,
                                                       log_start_offset=exc.log_start_offset,
                                                       record_errors=[_RecordError(batch_index=index,
                                                                                   batch_index_error_message=text)
                                                                      for index, text in exc.record_errors]))
                        continue
                    parts.append(PartitionResponse(index=pd.index, error_code=ErrorCode.NONE,
                                                   base_offset=result.base_offset,
                                                   log_append_time_ms=result.log_append_time,
                                                   log_start_offset=result.log_start_offset))
                    if acks == -1:
                        flushes.append((plog, plog.log_end_offset))
            responses.append(TopicResponse(name=topic_name, topic_id=td.topic_id, partition_responses=parts))
        # Kafka records the request's size against the producer's quota once the partitions are handled.
        response = ProduceResponse(responses=responses, throttle_time_ms=self.services.quotas.throttle_produce(
            ctx, ctx.size))
        if flushes:
            return self._after_fsync(flushes, response)
        if acks == 0:
            return None
        return response

    def _after_fsync(self, flushes: list[tuple[PartitionLog, int]], response: messages.ProduceResponse
                     ) -> messages.ProduceResponse | asyncio.Future[messages.ProduceResponse]:
        """acks=all: the answer once every appended partition is fsynced up to its new records; a future
        of it while some fsync is still to come (no task per request: the partitions' group commit
        resolves it). A failed fsync answers KAFKA_STORAGE_ERROR; any other error fails the request."""
        waiters = [waiter for plog, offset in flushes if (waiter := plog.durable(offset)) is not None]
        if not waiters:
            self.services.metrics.log_fsyncs.inc(len(flushes))
            return response
        answer: asyncio.Future[messages.ProduceResponse] = asyncio.get_running_loop().create_future()
        pending = len(waiters)

        def one_done(waiter: asyncio.Future[None]) -> None:
            nonlocal pending
            pending -= 1
            if answer.done():
                if not waiter.cancelled():
                    waiter.exception()  # retrieved: the answer went with the first failure
                return
            if waiter.cancelled():
                answer.cancel()
                return
            error = waiter.exception()
            if isinstance(error, OSError):
                log.error("fsync failed", exc_info=error)
                _storage_error(response)
                answer.set_result(response)
            elif error is not None:
                answer.set_exception(error)
            elif pending == 0:
                self.services.metrics.log_fsyncs.inc(len(flushes))
                answer.set_result(response)

        for waiter in waiters:
            waiter.add_done_callback(one_done)
        return answer

    def describe_producers(self, ctx: RequestContext, req: messages.DescribeProducersRequest) -> messages.DescribeProducersResponse:
        """DescribeProducers: the producers each partition knows and their open transactions (READ on the topic)."""
        topics = []
        for t in req.topics or ():
            topic = self.services.topics.get(t.name)
            allowed = ctx.authorize(Operation.READ, ResourceType.TOPIC, t.name)
            parts = []
            for index in t.partition_indexes or ():
                if not allowed:
                    parts.append(_DpPartition(partition_index=index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                              active_producers=[]))
                elif topic is None or not 0 <= index < len(topic.partitions):
                    parts.append(_DpPartition(partition_index=index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                              active_producers=[]))
                else:
                    state = topic.partitions[index].producer_state
                    parts.append(_DpPartition(partition_index=index, error_code=ErrorCode.NONE, active_producers=[
                        _DpProducer(producer_id=pid, producer_epoch=entry.epoch, last_sequence=entry.last_seq,
                                    last_timestamp=entry.last_timestamp,
                                    coordinator_epoch=entry.coordinator_epoch,
                                    current_txn_start_offset=state.ongoing.get(pid, -1))
                        for pid, entry in sorted(state.producers.items())
                    ]))
            topics.append(_DpTopic(name=t.name, partitions=parts))
        return DescribeProducersResponse(topics=topics)


def _storage_error(response: messages.ProduceResponse) -> None:
    for tr in response.responses:
        for pr in tr.partition_responses:
            if pr.error_code == ErrorCode.NONE:
                pr.error_code = ErrorCode.KAFKA_STORAGE_ERROR


def _refuse_all(req: messages.ProduceRequest, code: int) -> messages.ProduceResponse:
    """Every partition of the request answered with `code` (a refusal of the whole request)."""
    return ProduceResponse(responses=[TopicResponse(name=td.name, topic_id=td.topic_id, partition_responses=[
        PartitionResponse(index=p.index, error_code=code, base_offset=-1) for p in td.partition_data])
        for td in req.topic_data])


def register(table: ApiTable, services: ProduceServices) -> ProduceHandler:
    handler = ProduceHandler(services)
    table.register(ApiKey.PRODUCE, 3, 13, handler.handle)
    table.register(ApiKey.DESCRIBE_PRODUCERS, 0, 0, handler.describe_producers)
    return handler
