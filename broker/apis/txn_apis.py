"""Transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions,
ListTransactions and DescribeProducers, plus the marker writer the transaction coordinator uses.

The coordinator decides; this module checks topics and ACLs first (as Kafka's request layer does) and
maps PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for request versions older than KIP-588.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.purgatory import LogKey
from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.coordinator.transaction_coordinator import TopicPartition
from shoal.coordinator.transaction_log import STATE_BY_NAME
from shoal.coordinator.txn_offsets import TxnOffset
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker
    from shoal.broker.apis.services import ApiTable, TransactionServices
    from shoal.broker.network.connection import RequestContext
    from shoal.coordinator.transaction_coordinator import TransactionCoordinator

log = structlog.get_logger("shoal.txn")

InitProducerIdResponse = messages.InitProducerIdResponse
ApTopic = messages.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
AddPartitionsToTxnResponse = messages.AddPartitionsToTxnResponse
ApTopicResult = messages.AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
ApPartitionResult = messages.AddPartitionsToTxnResponse.AddPartitionsToTxnPartitionResult
ApTxnResult = messages.AddPartitionsToTxnResponse.AddPartitionsToTxnResult
AddOffsetsToTxnResponse = messages.AddOffsetsToTxnResponse
EndTxnResponse = messages.EndTxnResponse
TxnOffsetCommitResponse = messages.TxnOffsetCommitResponse
ToTopic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
ToPartition = TxnOffsetCommitResponse.TxnOffsetCommitResponsePartition
CONSUMER_OFFSETS = "__consumer_offsets"
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes
MAX_GROUP_ID_BYTES = 32767  # an int16-length string in the OffsetCommit key
DescribeTransactionsResponse = messages.DescribeTransactionsResponse
DtState = DescribeTransactionsResponse.TransactionState
DtTopic = DescribeTransactionsResponse.TopicData
ListTransactionsResponse = messages.ListTransactionsResponse
LtState = ListTransactionsResponse.TransactionState
DescribeProducersResponse = messages.DescribeProducersResponse
DpTopic = DescribeProducersResponse.TopicResponse
DpPartition = DescribeProducersResponse.PartitionResponse
DpProducer = DescribeProducersResponse.ProducerState

# First version of each API whose clients understand PRODUCER_FENCED (KIP-588).
_FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                 ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


def client_error(api: ApiKey, version: int, code: int) -> int:
    if code == ErrorCode.PRODUCER_FENCED and version < _FENCED_SINCE[api]:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


class BrokerMarkerWriter:
    """Writes COMMIT/ABORT control batches to the broker's partition logs for the coordinator."""

    def __init__(self, broker: Broker):
        self.broker = broker

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[TopicPartition]) -> None:
        flushes = []
        offsets_partitions = []
        now = int(time.time() * 1000)
        for topic_name, index in partitions:
            topic = self.broker.topics.get(topic_name)
            if topic is None or not 0 <= index < len(topic.partitions):
                continue  # deleted since it joined the transaction: nothing to mark
            plog = topic.partitions[index]
            result = plog.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=0, timestamp_ms=now)
            flushes.append(plog.flush(result.last_offset + 1))
            if topic_name == CONSUMER_OFFSETS:
                offsets_partitions.append(index)
            self.broker.purgatory.notify(LogKey(topic.topic_id, index))
        await asyncio.gather(*flushes)
        for index in offsets_partitions:
            # The marker is durable: the transaction's offset commits there are now final (or dropped).
            self.broker.txn_offsets.on_marker(index, producer_id, commit)


class TransactionApis:
    def __init__(self, services: TransactionServices):
        self.services = services

    @property
    def coordinator(self) -> TransactionCoordinator:
        return self.services.transaction_coordinator

    def _txn_authorized(self, ctx: RequestContext, transactional_id: str) -> bool:
        return ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)

    # ---- InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(self, ctx: RequestContext, req: messages.InitProducerIdRequest) -> messages.InitProducerIdResponse:
        version = ctx.api_version
        pid = req.producer_id if version >= 3 else -1
        epoch = req.producer_epoch if version >= 3 else -1
        if req.transactional_id is None:
            # Since KIP-679 WRITE on any topic also allows an idempotent producer, as in Kafka.
            if not ctx.authorize(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) and not ctx.authorize_any(
                Operation.WRITE, ResourceType.TOPIC
            ):
                return InitProducerIdResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1,
                                              producer_epoch=-1)
            if pid >= 0:
                # An idempotent producer bumping its own epoch keeps its id.
                return InitProducerIdResponse(error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=(epoch + 1) & 0x7FFF)
            return InitProducerIdResponse(error_code=ErrorCode.NONE, producer_id=self.services.producer_ids.allocate(),
                                          producer_epoch=0)
        if req.transactional_id and not self._txn_authorized(ctx, req.transactional_id):
            return InitProducerIdResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1,
                                          producer_epoch=-1)
        result = await self.coordinator.init_producer_id(req.transactional_id, req.transaction_timeout_ms, pid, epoch)
        if result.error != ErrorCode.NONE:
            log.info("init_producer_id refused", transactional_id=req.transactional_id, error_code=result.error)
        return InitProducerIdResponse(error_code=client_error(ApiKey.INIT_PRODUCER_ID, version, result.error),
                                      producer_id=result.producer_id, producer_epoch=result.producer_epoch)

    # ---- AddPartitionsToTxn ---------------------------------------------------------------------

    async def add_partitions_to_txn(self, ctx: RequestContext, req: messages.AddPartitionsToTxnRequest) -> messages.AddPartitionsToTxnResponse:
        version = ctx.api_version
        if version <= 3:
            results = await self._add_one(ctx, version, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                          req.v3_and_below_producer_epoch, req.v3_and_below_topics, verify_only=False)
            return AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)
        if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return AddPartitionsToTxnResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
        out = []
        for txn in req.transactions:
            results = await self._add_one(ctx, version, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                          txn.topics, verify_only=txn.verify_only)
            out.append(ApTxnResult(transactional_id=txn.transactional_id, topic_results=results))
        return AddPartitionsToTxnResponse(error_code=ErrorCode.NONE, results_by_transaction=out)

    async def _add_one(self, ctx: RequestContext, version: int, txn_id: str, pid: int, epoch: int,
                       topics: list[ApTopic], *, verify_only: bool) -> list[ApTopicResult]:
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        errors: dict[TopicPartition, int] = {}
        if not self._txn_authorized(ctx, txn_id):
            errors = dict.fromkeys(wanted, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        else:
            for name, p in wanted:
                topic = self.services.topics.get(name)
                if not ctx.authorize(Operation.WRITE, ResourceType.TOPIC, name):
                    errors[(name, p)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif topic is None or not 0 <= p < len(topic.partitions):
                    errors[(name, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if errors:
                # Kafka adds nothing when any partition is refused: the rest were not attempted.
                for tp in wanted:
                    errors.setdefault(tp, ErrorCode.OPERATION_NOT_ATTEMPTED)
                log.info("add_partitions_to_txn refused", transactional_id=txn_id,
                         partitions=[f"{t}-{p}" for (t, p), e in errors.items() if e != ErrorCode.OPERATION_NOT_ATTEMPTED])
            elif verify_only:
                errors = self.coordinator.verify_partitions(txn_id, pid, epoch, wanted)
            else:
                code = await self.coordinator.add_partitions(txn_id, pid, epoch, wanted)
                errors = dict.fromkeys(wanted, client_error(ApiKey.ADD_PARTITIONS_TO_TXN, version, code))
        by_topic: dict[str, list[ApPartitionResult]] = {}
        for (name, p), code in errors.items():
            by_topic.setdefault(name, []).append(ApPartitionResult(partition_index=p, partition_error_code=code))
        return [ApTopicResult(name=name, results_by_partition=parts) for name, parts in by_topic.items()]

    # ---- AddOffsetsToTxn / EndTxn ---------------------------------------------------------------

    async def add_offsets_to_txn(self, ctx: RequestContext, req: messages.AddOffsetsToTxnRequest) -> messages.AddOffsetsToTxnResponse:
        if not self._txn_authorized(ctx, req.transactional_id):
            return AddOffsetsToTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return AddOffsetsToTxnResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        code = await self.coordinator.add_offsets(req.transactional_id, req.producer_id, req.producer_epoch,
                                                  req.group_id)
        return AddOffsetsToTxnResponse(error_code=client_error(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version, code))

    async def end_txn(self, ctx: RequestContext, req: messages.EndTxnRequest) -> messages.EndTxnResponse:
        if not self._txn_authorized(ctx, req.transactional_id):
            return EndTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        code = await self.coordinator.end_txn(req.transactional_id, req.producer_id, req.producer_epoch, req.committed)
        if code != ErrorCode.NONE:
            log.info("end_txn refused", transactional_id=req.transactional_id, error_code=code)
        return EndTxnResponse(error_code=client_error(ApiKey.END_TXN, ctx.api_version, code),
                              producer_id=req.producer_id, producer_epoch=req.producer_epoch)

    async def txn_offset_commit(self, ctx: RequestContext, req: messages.TxnOffsetCommitRequest) -> messages.TxnOffsetCommitResponse:
        version = ctx.api_version
        codes: dict[tuple[str, int], int] = {}
        wanted = [(t.name, p) for t in req.topics for p in t.partitions]
        if not self._txn_authorized(ctx, req.transactional_id):
            codes = {(n, p.partition_index): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for n, p in wanted}
        elif not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            codes = {(n, p.partition_index): ErrorCode.GROUP_AUTHORIZATION_FAILED for n, p in wanted}
        elif not req.group_id or len(req.group_id.encode()) > MAX_GROUP_ID_BYTES:
            codes = {(n, p.partition_index): ErrorCode.INVALID_GROUP_ID for n, p in wanted}
        else:
            group_code = client_error(ApiKey.TXN_OFFSET_COMMIT, version, self.coordinator.check_offset_commit(
                req.transactional_id, req.producer_id, req.producer_epoch, req.group_id))
            offsets = []
            for name, p in wanted:
                topic = self.services.topics.get(name)
                if not ctx.authorize(Operation.READ, ResourceType.TOPIC, name):
                    codes[(name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    codes[(name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif len((p.committed_metadata or "").encode()) > OFFSET_METADATA_MAX_BYTES:
                    codes[(name, p.partition_index)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                else:
                    codes[(name, p.partition_index)] = group_code
                    offsets.append(TxnOffset(name, p.partition_index, p.committed_offset,
                                             p.committed_leader_epoch if version >= 2 else -1,
                                             p.committed_metadata or ""))
            if group_code != ErrorCode.NONE:
                log.info("txn_offset_commit refused", transactional_id=req.transactional_id, group_id=req.group_id,
                         error_code=group_code)
            elif offsets:
                await self.services.txn_offsets.commit(req.group_id, req.producer_id, req.producer_epoch, offsets)
        by_topic: dict[str, list[ToPartition]] = {}
        for (name, index), code in codes.items():
            by_topic.setdefault(name, []).append(ToPartition(partition_index=index, error_code=code))
        return TxnOffsetCommitResponse(topics=[ToTopic(name=n, partitions=ps) for n, ps in by_topic.items()])

    # ---- Describe / List ------------------------------------------------------------------------

    def describe_transactions(self, ctx: RequestContext, req: messages.DescribeTransactionsRequest) -> messages.DescribeTransactionsResponse:
        out = []
        for txn_id in req.transactional_ids:
            st = DtState(error_code=ErrorCode.NONE, transactional_id=txn_id, transaction_state="",
                         transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1,
                         topics=[])
            out.append(st)
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
                st.error_code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                continue
            meta = self.coordinator.describe(txn_id)
            if meta is None:
                st.error_code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
                continue
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(meta.partitions):
                by_topic.setdefault(topic, []).append(p)
            st.transaction_state = meta.state.display_name
            st.transaction_timeout_ms = meta.timeout_ms
            st.transaction_start_time_ms = meta.start_ms
            st.producer_id = meta.producer_id
            st.producer_epoch = meta.producer_epoch
            st.topics = [DtTopic(topic=t, partitions=ps) for t, ps in by_topic.items()]
        return DescribeTransactionsResponse(transaction_states=out)

    def list_transactions(self, ctx: RequestContext, req: messages.ListTransactionsRequest) -> messages.ListTransactionsResponse:
        states = set(req.state_filters or [])
        unknown = sorted(s for s in states if s not in STATE_BY_NAME)
        duration = req.duration_filter if ctx.api_version >= 1 else -1
        found = self.coordinator.list(states - set(unknown), set(req.producer_id_filters or []), duration)
        if unknown and not states - set(unknown):
            found = []
        listed = [LtState(transactional_id=m.transactional_id, producer_id=m.producer_id,
                          transaction_state=m.state.display_name)
                  for m in found if ctx.authorize(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, m.transactional_id)]
        return ListTransactionsResponse(error_code=ErrorCode.NONE, unknown_state_filters=unknown,
                                        transaction_states=listed)


def register(table: ApiTable, services: TransactionServices) -> TransactionApis:
    h = TransactionApis(services)
    table.register(ApiKey.INIT_PRODUCER_ID, 0, 5, h.init_producer_id)
    table.register(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5, h.add_partitions_to_txn)
    table.register(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, h.add_offsets_to_txn)
    table.register(ApiKey.END_TXN, 0, 4, h.end_txn)
    table.register(ApiKey.TXN_OFFSET_COMMIT, 0, 3, h.txn_offset_commit)
    table.register(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, h.describe_transactions)
    table.register(ApiKey.LIST_TRANSACTIONS, 0, 1, h.list_transactions)
    return h
