"""Transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions,
ListTransactions, DescribeProducers and WriteTxnMarkers (what Admin.abortTransaction sends to repair a
hanging transaction), with the markers written by `storage/transaction_markers.py`.

The coordinator decides; this module checks topics and ACLs first (as Kafka's request layer does) and
maps PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for request versions older than KIP-588.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.storage.partition_log import AppendRefused, LogClosed
from shoal.coordinator.classic_coordinator import OffsetToCommit
from shoal.coordinator.transaction_coordinator import TopicPartition
from shoal.coordinator.transaction_log import STATE_BY_NAME
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import InvalidRecordBatch, parse_batch_header

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, TransactionServices
    from shoal.broker.network.connection import RequestContext
    from shoal.broker.storage.topic_registry import TopicRegistry
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
WriteTxnMarkersResponse = messages.WriteTxnMarkersResponse
WmResult = WriteTxnMarkersResponse.WritableTxnMarkerResult
WmTopic = WriteTxnMarkersResponse.WritableTxnMarkerTopicResult
WmPartition = WriteTxnMarkersResponse.WritableTxnMarkerPartitionResult

# First version of each API whose clients understand PRODUCER_FENCED (KIP-588).
_FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                 ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


# First version of each API whose clients understand TRANSACTION_ABORTABLE (KIP-890); older ones get
# INVALID_TXN_STATE, as Kafka answers them.
_ABORTABLE_SINCE = {ApiKey.PRODUCE: 11, ApiKey.ADD_PARTITIONS_TO_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 4,
                    ApiKey.END_TXN: 4, ApiKey.ADD_OFFSETS_TO_TXN: 4, ApiKey.INIT_PRODUCER_ID: 5}


def client_error(api: ApiKey, version: int, code: int) -> int:
    """A coordinator error as a client of this API version understands it."""
    if code == ErrorCode.PRODUCER_FENCED and version < _FENCED_SINCE.get(api, 0):
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if code == ErrorCode.TRANSACTION_ABORTABLE and version < _ABORTABLE_SINCE[api]:
        return ErrorCode.INVALID_TXN_STATE
    return code


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
            # Kafka hands an idempotent producer a fresh producer id, whatever id and epoch it names: a
            # client-chosen id could be another producer's.
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
                errors = {tp: client_error(ApiKey.ADD_PARTITIONS_TO_TXN, version, code)
                          for tp, code in self.coordinator.verify_partitions(txn_id, pid, epoch, wanted).items()}
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
        if ctx.api_version >= 5:
            # transaction.version 2: the epoch is bumped by every end, and the answer names what to use next.
            result = await self.coordinator.end_txn_v2(req.transactional_id, req.producer_id, req.producer_epoch,
                                                      req.committed)
            if result.error != ErrorCode.NONE:
                log.info("end_txn refused", transactional_id=req.transactional_id, error_code=result.error)
            return EndTxnResponse(error_code=result.error, producer_id=result.producer_id,
                                  producer_epoch=result.producer_epoch)
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
            added: int = ErrorCode.NONE
            if version >= 5:
                # transaction.version 2 (KIP-890 part 2): the group's offsets partition joins the transaction
                # here; such a producer sends no AddOffsetsToTxn.
                added = await self.coordinator.add_offsets(req.transactional_id, req.producer_id,
                                                           req.producer_epoch, req.group_id, transaction_version=2)
            group_code = client_error(ApiKey.TXN_OFFSET_COMMIT, version, added if added != ErrorCode.NONE else (
                self.coordinator.check_offset_commit(req.transactional_id, req.producer_id, req.producer_epoch,
                                                     req.group_id)))
            offsets: list[OffsetToCommit] = []
            where: list[tuple[str, int]] = []
            for name, p in wanted:
                topic = self.services.topics.get(name)
                if not ctx.authorize(Operation.READ, ResourceType.TOPIC, name):
                    codes[(name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    codes[(name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    codes[(name, p.partition_index)] = group_code
                    offsets.append(OffsetToCommit(name, p.partition_index, p.committed_offset,
                                                  p.committed_leader_epoch if version >= 2 else -1,
                                                  p.committed_metadata or ""))
                    where.append((name, p.partition_index))
            if group_code == ErrorCode.NONE and offsets:
                # KIP-447: from v3 the member's id, generation and instance id are checked by the group.
                group_code, per = await self.services.group_coordinator.commit_transactional_offsets(
                    req.group_id, req.producer_id, req.producer_epoch, req.member_id if version >= 3 else "",
                    req.group_instance_id if version >= 3 else None, req.generation_id_or_member_epoch if version >= 3 else -1,
                    offsets)
                group_code = client_error(ApiKey.TXN_OFFSET_COMMIT, version, group_code)
                for w, c in zip(where, per or [group_code] * len(where), strict=True):
                    codes[w] = group_code if group_code != ErrorCode.NONE else c
            if group_code != ErrorCode.NONE:
                log.info("txn_offset_commit refused", transactional_id=req.transactional_id, group_id=req.group_id,
                         error_code=group_code)
        by_topic: dict[str, list[ToPartition]] = {}
        for (name, index), code in codes.items():
            by_topic.setdefault(name, []).append(ToPartition(partition_index=index, error_code=code))
        return TxnOffsetCommitResponse(topics=[ToTopic(name=n, partitions=ps) for n, ps in by_topic.items()])

    # ---- WriteTxnMarkers ------------------------------------------------------------------------

    async def write_txn_markers(self, ctx: RequestContext, req: messages.WriteTxnMarkersRequest) -> messages.WriteTxnMarkersResponse:
        """Markers written on request: Kafka's coordinators send these to partition leaders; on one broker
        the coordinator writes its own, so what arrives here is Admin.abortTransaction closing a hanging
        transaction (ALTER or CLUSTER_ACTION on the cluster, as in Kafka)."""
        authorized = (ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
                      or ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME))
        out = []
        for marker in req.markers:
            wanted = [(t.name, index) for t in marker.topics for index in t.partition_indexes]
            codes = await asyncio.gather(*(self._requested_marker(authorized, marker, name, index)
                                           for name, index in wanted))
            by_topic: dict[str, list[WmPartition]] = {}
            for (name, index), code in zip(wanted, codes, strict=True):
                by_topic.setdefault(name, []).append(WmPartition(partition_index=index, error_code=code))
            out.append(WmResult(producer_id=marker.producer_id,
                                topics=[WmTopic(name=n, partitions=ps) for n, ps in by_topic.items()]))
        return WriteTxnMarkersResponse(markers=out)

    async def _requested_marker(self, authorized: bool, marker: messages.WriteTxnMarkersRequest.WritableTxnMarker,
                                name: str, index: int) -> int:
        if not authorized:
            return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        topic = self.services.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        try:
            # The partition refuses a marker of an older producer epoch or an older coordinator epoch than
            # the last marker it took for this producer (Kafka's ProducerAppendInfo).
            written = await self.services.markers.write_marker(name, index, marker.producer_id, marker.producer_epoch,
                                                               marker.transaction_result, marker.coordinator_epoch,
                                                               marker.transaction_version)
        except AppendRefused as exc:
            return exc.error_code
        except OSError as exc:
            log.error("write_txn_markers failed", topic=name, partition=index, error=repr(exc))
            return ErrorCode.KAFKA_STORAGE_ERROR
        except LogClosed:
            written = False
        if not written:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        log.info("txn.marker_written_on_request", topic=name, partition=index, producer_id=marker.producer_id,
                 producer_epoch=marker.producer_epoch, commit=marker.transaction_result)
        return ErrorCode.NONE

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


async def add_produce_partitions(coordinator: TransactionCoordinator, topics: TopicRegistry, ctx: RequestContext,
                                 req: messages.ProduceRequest) -> dict[TopicPartition, int]:
    """KIP-890 part 2: a Produce from v12 on adds its transactional partitions to the producer's transaction
    itself (Kafka's AddPartitionsToTxn v5 from broker to coordinator), so a transaction.version 2 producer
    sends no AddPartitionsToTxn. Only partitions not yet in the transaction are written; the refusals by
    partition are returned (a fenced producer's as INVALID_PRODUCER_EPOCH, as Produce always answers it)."""
    txn_id = req.transactional_id
    if txn_id is None:
        return {}
    by_producer: dict[tuple[int, int], list[TopicPartition]] = {}
    for td in req.topic_data:
        topic = topics.get_by_id(td.topic_id) if ctx.api_version >= 13 else topics.get(td.name)
        if topic is None or not ctx.authorize(Operation.WRITE, ResourceType.TOPIC, topic.name):
            continue  # the produce answers these partitions itself
        for pd in td.partition_data:
            if not pd.records or not 0 <= pd.index < len(topic.partitions):
                continue
            try:
                header = parse_batch_header(pd.records, 0, whole=False)
            except InvalidRecordBatch:
                continue
            if header.is_transactional and header.producer_id >= 0:
                by_producer.setdefault((header.producer_id, header.producer_epoch), []).append((topic.name, pd.index))
    refused: dict[TopicPartition, int] = {}
    for (pid, epoch), wanted in by_producer.items():
        verified = coordinator.verify_partitions(txn_id, pid, epoch, wanted)
        missing = [tp for tp, code in verified.items() if code != ErrorCode.NONE]
        if not missing:
            continue
        code = await coordinator.add_partitions(txn_id, pid, epoch, missing, transaction_version=2)
        if code == ErrorCode.PRODUCER_FENCED:
            code = ErrorCode.INVALID_PRODUCER_EPOCH
        if code != ErrorCode.NONE:
            log.info("transactional produce refused: partitions not added", transactional_id=txn_id,
                     producer_id=pid, producer_epoch=epoch, error_code=int(code))
            refused.update(dict.fromkeys(missing, code))
    return refused


def register(table: ApiTable, services: TransactionServices) -> TransactionApis:
    h = TransactionApis(services)
    table.register(ApiKey.INIT_PRODUCER_ID, 0, 5, h.init_producer_id)
    table.register(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5, h.add_partitions_to_txn)
    table.register(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, h.add_offsets_to_txn)
    table.register(ApiKey.END_TXN, 0, 5, h.end_txn)
    table.register(ApiKey.TXN_OFFSET_COMMIT, 0, 5, h.txn_offset_commit)
    table.register(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, h.describe_transactions)
    table.register(ApiKey.LIST_TRANSACTIONS, 0, 1, h.list_transactions)
    table.register(ApiKey.WRITE_TXN_MARKERS, 1, 2, h.write_txn_markers)
    return h
