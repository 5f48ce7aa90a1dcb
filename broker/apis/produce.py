"""Produce: validate each partition's record batches by header and CRC, assign offsets, append, answer.

Batches stay as the client's bytes: only base offsets (and LogAppendTime stamps) are patched in place.
acks=-1 is answered after the data is fsynced; concurrent producers share fsyncs through the log's group commit.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.purgatory import LogKey
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.storage.log_config import ProducePolicy, batch_too_large, needs_recompression, recompress
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import InvalidRecordBatch, iter_batches, parse_batch_header
from shoal.protocol.records import InvalidRecord, InvalidTimestamp, TimestampBounds, validate_batch_for_append

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
DescribeProducersResponse = messages.DescribeProducersResponse
_DpTopic = DescribeProducersResponse.TopicResponse
_DpPartition = DescribeProducersResponse.PartitionResponse
_DpProducer = DescribeProducersResponse.ProducerState


class ProduceHandler:
    def __init__(self, services: ProduceServices):
        self.services = services

    async def handle(self, ctx: RequestContext, req: messages.ProduceRequest) -> messages.ProduceResponse | None:
        """The response, or None for acks=0 (nothing is sent back)."""
        version = ctx.api_version
        acks = req.acks
        responses = []
        flushes: list[tuple[PartitionLog, int]] = []
        if req.transactional_id is not None and not ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                                  req.transactional_id):
            return ProduceResponse(responses=[TopicResponse(name=td.name, topic_id=td.topic_id, partition_responses=[
                PartitionResponse(index=p.index, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                  base_offset=-1) for p in td.partition_data]) for td in req.topic_data])
        if acks not in (-1, 0, 1):
            for td in req.topic_data:
                responses.append(
                    TopicResponse(
                        name=td.name,
                        topic_id=td.topic_id,
                        partition_responses=[
                            PartitionResponse(index=p.index, error_code=ErrorCode.INVALID_REQUIRED_ACKS, base_offset=-1)
                            for p in td.partition_data
                        ],
                    )
                )
            return ProduceResponse(responses=responses)
        for td in req.topic_data:
            topic = self.services.topics.get_by_id(td.topic_id) if version >= 13 else self.services.topics.get(td.name)
            topic_name = topic.name if topic is not None else td.name
            parts = []
            for pd in td.partition_data:
                if topic is None:
                    code = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    parts.append(PartitionResponse(index=pd.index, error_code=code, base_offset=-1))
                    continue
                if not ctx.authorize(Operation.WRITE, ResourceType.TOPIC, topic.name):
                    parts.append(
                        PartitionResponse(index=pd.index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, base_offset=-1)
                    )
                    continue
                if not 0 <= pd.index < len(topic.partitions):
                    parts.append(
                        PartitionResponse(index=pd.index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, base_offset=-1)
                    )
                    continue
                if topic.internal and ctx.header.client_id != ADMIN_CLIENT_ID:
                    log.warning("rejected produce to an internal topic", topic=topic.name, partition=pd.index,
                                client=ctx.connection.client_host)
                    parts.append(PartitionResponse(index=pd.index, error_code=ErrorCode.INVALID_TOPIC_EXCEPTION,
                                                   base_offset=-1,
                                                   error_message=f"Cannot append to internal topic {topic.name}"))
                    continue
                plog = topic.partitions[pd.index]
                refused = self._verify_transaction(req.transactional_id, topic_name, pd.index, plog, pd.records)
                if refused != ErrorCode.NONE:
                    parts.append(PartitionResponse(index=pd.index, error_code=refused, base_offset=-1))
                    continue
                resp = self._append(topic.topic_id, topic_name, pd.index, plog, pd.records, topic.policy)
                parts.append(resp)
                if resp.error_code == ErrorCode.NONE and acks == -1:
                    flushes.append((plog, plog.log_end_offset))
            responses.append(TopicResponse(name=topic_name, topic_id=td.topic_id, partition_responses=parts))
        if flushes:
            try:
                await asyncio.gather(*(plog.flush(offset) for plog, offset in flushes))
                self.services.metrics.log_fsyncs.inc(len(flushes))
            except OSError:
                log.exception("fsync failed")
                for tr in responses:
                    for pr in tr.partition_responses:
                        if pr.error_code == ErrorCode.NONE:
                            pr.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        if acks == 0:
            return None
        return ProduceResponse(responses=responses)

    def _verify_transaction(self, transactional_id: str | None, topic_name: str, index: int, plog: PartitionLog,
                            records: bytes | bytearray | memoryview | None) -> int:
        """KIP-890 part 1 (Kafka's ReplicaManager transaction verification): the first transactional batch
        of a producer on a partition is appended only if the coordinator has the partition in that
        producer's open transaction, so a late retry after an abort or a fenced producer's write cannot
        open a transaction no one will end."""
        if not records:
            return ErrorCode.NONE
        try:
            header = parse_batch_header(records, 0, whole=False)
        except InvalidRecordBatch:
            return ErrorCode.NONE  # _append answers with the right error
        if not header.is_transactional:
            return ErrorCode.NONE
        if transactional_id is None:
            # Kafka refuses transactional records without a transactional id the same way.
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        verify = self.services.verify_txn_partition
        if verify is None or header.producer_id in plog.producer_state.ongoing:
            return ErrorCode.NONE
        code = verify(transactional_id, header.producer_id, header.producer_epoch, (topic_name, index))
        if code == ErrorCode.PRODUCER_FENCED:
            code = ErrorCode.INVALID_PRODUCER_EPOCH  # what Produce has always answered a fenced producer
        if code != ErrorCode.NONE:
            log.info("transactional produce refused by verification", transactional_id=transactional_id,
                     topic=topic_name, partition=index, producer_id=header.producer_id,
                     producer_epoch=header.producer_epoch, error_code=int(code))
        return code

    def _append(
        self, topic_id: bytes, topic_name: str, index: int, plog: PartitionLog,
        records: bytes | bytearray | memoryview | None, policy: ProducePolicy,
    ) -> PartitionResponse:
        if not records:
            return PartitionResponse(index=index, error_code=ErrorCode.CORRUPT_MESSAGE, base_offset=-1,
                                     error_message="empty record set")
        buf = bytearray(records)
        log_append_time = policy.log_append_time
        bounds = None if log_append_time else TimestampBounds(
            int(time.time() * 1000), policy.timestamp_before_max_ms, policy.timestamp_after_max_ms
        )
        try:
            headers = list(iter_batches(buf))
            for pos, header in headers:
                too_large = batch_too_large(header, policy)
                if too_large is not None:
                    log.info("rejected produce", topic=topic_name, partition=index, error=too_large)
                    return PartitionResponse(index=index, error_code=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1,
                                             error_message=too_large)
                validate_batch_for_append(buf, pos, header, timestamp_bounds=bounds,
                                          require_keys=plog.config.compact)
            if needs_recompression(headers, policy):
                buf, headers = recompress(buf, headers, policy)
                for _pos, header in headers:
                    too_large = batch_too_large(header, policy)
                    if too_large is not None:
                        return PartitionResponse(index=index, error_code=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1,
                                                 error_message=too_large)
        except InvalidRecordBatch as exc:
            # Kafka separates a batch that breaks the rules (INVALID_RECORD, not retried) from damaged bytes.
            code = (ErrorCode.INVALID_TIMESTAMP if isinstance(exc, InvalidTimestamp)
                    else ErrorCode.INVALID_RECORD if isinstance(exc, InvalidRecord) else ErrorCode.CORRUPT_MESSAGE)
            log.warning("rejected produce", topic=topic_name, partition=index, error=str(exc), error_code=int(code))
            return PartitionResponse(index=index, error_code=code, base_offset=-1, error_message=str(exc))
        # Only idempotent batches need the producer state; touching it first rebuilds it from the log's tail.
        idempotent = [h for _p, h in headers if h.producer_id >= 0 and h.base_sequence >= 0]
        state = plog.producer_state if idempotent else None
        if state is not None:
            for header in idempotent:
                check = state.check(header.producer_id, header.producer_epoch, header.base_sequence, header.records_count)
                if check.error != ErrorCode.NONE:
                    return PartitionResponse(index=index, error_code=check.error, base_offset=-1,
                                             log_start_offset=plog.log_start_offset)
                if check.duplicate_offset >= 0:
                    # A retry of a batch we already appended: answer with its original offset, append nothing.
                    return PartitionResponse(index=index, error_code=ErrorCode.NONE, base_offset=check.duplicate_offset,
                                             log_append_time_ms=-1, log_start_offset=plog.log_start_offset)
        append_time = int(time.time() * 1000) if log_append_time else -1
        result = plog.append(buf, headers, log_append_time_ms=append_time if log_append_time else None)
        if state is not None:
            # append() set each header's base offset.
            for header in idempotent:
                state.record(header.producer_id, header.producer_epoch, header.base_sequence, header.records_count,
                             header.base_offset, append_time if log_append_time else header.max_timestamp)
        count = sum(h.records_count for _p, h in headers)
        self.services.metrics.messages_in.labels(topic=topic_name).inc(count)
        self.services.metrics.log_bytes_in.labels(topic=topic_name).inc(len(buf))
        self.services.purgatory.notify(LogKey(topic_id, index))
        return PartitionResponse(
            index=index,
            error_code=ErrorCode.NONE,
            base_offset=result.base_offset,
            log_append_time_ms=append_time,
            log_start_offset=result.log_start_offset,
        )


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
                                    coordinator_epoch=0 if pid in state.ongoing else -1,
                                    current_txn_start_offset=state.ongoing.get(pid, -1))
                        for pid, entry in sorted(state.producers.items())
                    ]))
            topics.append(_DpTopic(name=t.name, partitions=parts))
        return DescribeProducersResponse(topics=topics)


def register(table: ApiTable, services: ProduceServices) -> ProduceHandler:
    handler = ProduceHandler(services)
    table.register(ApiKey.PRODUCE, 3, 13, handler.handle)
    table.register(ApiKey.DESCRIBE_PRODUCERS, 0, 0, handler.describe_producers)
    return handler
