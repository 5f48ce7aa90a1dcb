"""ShareFetch and ShareAcknowledge: requests translated to `SharePartitionManager` calls, its results to
responses. The sessions, acknowledgements, acquisition and long polls live in the manager."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.share.share_partition import AckBatch, AcquireMode
from shoal.broker.share.share_partition_manager import (
    AckRules,
    FetchParams,
    PartitionResult,
    ShareFetchResult,
    SharePartitionManager,
    TopicReadAuthorizer,
)
from shoal.protocol import messages
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.topic_id_partition import TopicIdPartition
from shoal.protocol.uuids import MAX_MEMBER_ID_LENGTH

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ShareFetchServices
    from shoal.broker.network.connection import RequestContext


SfRequest = messages.ShareFetchRequest
SfResponse = messages.ShareFetchResponse
SfTopic = SfResponse.ShareFetchableTopicResponse
SfPartition = SfResponse.PartitionData
SfAcquired = SfResponse.AcquiredRecords
SfLeader = SfResponse.LeaderIdAndEpoch
SaRequest = messages.ShareAcknowledgeRequest
SaResponse = messages.ShareAcknowledgeResponse
SaTopic = SaResponse.ShareAcknowledgeTopicResponse
SaPartition = SaResponse.PartitionData
SaLeader = SaResponse.LeaderIdAndEpoch


class ShareFetchHandlers:
    def __init__(self, services: ShareFetchServices):
        self.services = services
        self.enabled = bool(services.config["group.share.enable"])
        self.manager = SharePartitionManager(
            topics=services.topics, leaders=services.share_partitions, purgatory=services.purgatory,
            group_configs=services.group_configs, metrics=services.metrics.share,
            max_sessions=int(services.config["group.share.max.share.sessions"]),
            broker_max_bytes=int(services.config["fetch.max.bytes"]),
        )
        services.connection_listeners.append(self.manager.on_connection_closed)

    # ---- ShareFetch -----------------------------------------------------------------------------

    async def share_fetch(self, ctx: RequestContext, req: SfRequest) -> SfResponse:
        version = ctx.api_version
        code, message, ids = self._admit(ctx, req.group_id, req.member_id)
        if ids is None:
            return SfResponse(error_code=code, error_message=message)
        group, member = ids
        is_renew = version >= 2 and req.is_renew_ack
        if is_renew and (req.max_bytes or req.min_bytes or req.max_records or req.max_wait_ms):
            return SfResponse(error_code=ErrorCode.INVALID_REQUEST,
                              error_message="a renew-only ShareFetch must not ask for records")
        mode = AcquireMode(req.share_acquire_mode) if version >= 2 and req.share_acquire_mode in (0, 1) \
            else AcquireMode.BATCH_OPTIMIZED
        # As Kafka: never more than the consumer's quota allows in one window, which would throttle it for sure.
        max_bytes = req.max_bytes if req.max_bytes <= 0 else max(1, int(min(
            req.max_bytes, self.services.quotas.fetch_max_bytes(ctx))))
        params = FetchParams(max_wait_ms=req.max_wait_ms, min_bytes=min(req.min_bytes, max_bytes), max_bytes=max_bytes,
                             max_records=req.max_records, batch_size=req.batch_size, mode=mode,
                             headers_only=req.shoal_headers_only)
        acks = {TopicIdPartition(t.topic_id, p.partition_index): _ack_batches(p.acknowledgement_batches)
                for t in req.topics for p in t.partitions}
        forgotten = [TopicIdPartition(ft.topic_id, index) for ft in req.forgotten_topics_data for index in ft.partitions]
        result = await self.manager.fetch(ctx.connection, _topic_reader(ctx), group, member, req.share_session_epoch,
                                          acks, forgotten, _ack_rules(version, is_renew), params)
        if result.error_code != ErrorCode.NONE:
            return SfResponse(error_code=result.error_code, error_message=result.error_message)
        response = self._response(group, result, req.shoal_headers_only)
        throttle_ms = self.services.quotas.throttle_fetch(ctx, response, ApiKey.SHARE_FETCH, version)
        if throttle_ms > 0:
            # Over the consumer_byte_rate quota: as Kafka, no records, only the acknowledgements' outcomes.
            withheld = await self.manager.withhold_records(group, member, result, [tp for tp, b in acks.items() if b])
            response = self._response(group, withheld, req.shoal_headers_only)
            response.throttle_time_ms = throttle_ms
        return response

    def _response(self, group: str, result: ShareFetchResult, headers_only: bool) -> SfResponse:
        by_topic: dict[bytes, list[SfPartition]] = {}
        for tp, pr in result.partitions.items():
            by_topic.setdefault(tp.topic_id, []).append(self._fetched_partition(tp.partition, pr, headers_only))
        return SfResponse(
            error_code=ErrorCode.NONE,
            acquisition_lock_timeout_ms=self.manager.lock_timeout_ms(group),
            responses=[SfTopic(topic_id=tid, partitions=parts) for tid, parts in by_topic.items()],
            node_endpoints=[],
        )

    def _fetched_partition(self, index: int, pr: PartitionResult, headers_only: bool) -> SfPartition:
        pd = SfPartition(
            partition_index=index,
            error_code=pr.error_code,
            acknowledge_error_code=pr.acknowledge_error_code,
            current_leader=SfLeader(leader_id=self.services.node_id, leader_epoch=0),
            records=b"",
            acquired_records=[SfAcquired(first_offset=r.first_offset, last_offset=r.last_offset,
                                         delivery_count=r.delivery_count) for r in pr.acquired],
        )
        if pr.acquired:
            if headers_only:
                pd.shoal_batch_headers = pr.records
            else:
                pd.records = pr.records
        return pd

    # ---- ShareAcknowledge -----------------------------------------------------------------------

    async def share_acknowledge(self, ctx: RequestContext, req: SaRequest) -> SaResponse:
        version = ctx.api_version
        code, message, ids = self._admit(ctx, req.group_id, req.member_id)
        if ids is None:
            return SaResponse(error_code=code, error_message=message)
        group, member = ids
        is_renew = version >= 2 and req.is_renew_ack
        acks = {TopicIdPartition(t.topic_id, p.partition_index): _ack_batches(p.acknowledgement_batches)
                for t in req.topics for p in t.partitions}
        result = await self.manager.acknowledge(_topic_reader(ctx), group, member, req.share_session_epoch, acks,
                                                _ack_rules(version, is_renew))
        if result.error_code != ErrorCode.NONE:
            return SaResponse(error_code=result.error_code, error_message=result.error_message)
        by_topic: dict[bytes, list[SaPartition]] = {}
        for tp, err in result.partitions.items():
            by_topic.setdefault(tp.topic_id, []).append(SaPartition(
                partition_index=tp.partition, error_code=err,
                current_leader=SaLeader(leader_id=self.services.node_id, leader_epoch=0)))
        return SaResponse(error_code=ErrorCode.NONE, acquisition_lock_timeout_ms=self.manager.lock_timeout_ms(group),
                          responses=[SaTopic(topic_id=tid, partitions=parts) for tid, parts in by_topic.items()],
                          node_endpoints=[])

    # ---- admission --------------------------------------------------------------------------------

    def _admit(self, ctx: RequestContext, group_id: str | None,
               member_id: str | None) -> tuple[int, str | None, tuple[str, str] | None]:
        """(NONE, None, (group id, member id)) for a well-formed, authorized request while share groups
        are enabled, else the error code and message to answer with."""
        if not self.enabled:
            return ErrorCode.UNSUPPORTED_VERSION, "share groups are disabled", None
        if not group_id:
            return ErrorCode.INVALID_REQUEST, "GroupId must be set", None
        if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
            return ErrorCode.INVALID_REQUEST, "MemberId must be 1 to 36 characters", None
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, group_id):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, None, None
        return ErrorCode.NONE, None, (group_id, member_id)


def _ack_batches(batches: list[SfRequest.AcknowledgementBatch] | list[SaRequest.AcknowledgementBatch]) -> list[AckBatch]:
    return [AckBatch(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in batches]


def _ack_rules(version: int, is_renew: bool) -> AckRules:
    # RENEW (4) exists from version 2 on, and only a renew-only request may carry it.
    return AckRules(max_type=AcknowledgeType.RENEW if version >= 2 else AcknowledgeType.REJECT, is_renew=is_renew)


def _topic_reader(ctx: RequestContext) -> TopicReadAuthorizer:
    def may_read(topic: str) -> bool:
        return ctx.authorize(Operation.READ, ResourceType.TOPIC, topic)
    return may_read


def register(table: ApiTable, services: ShareFetchServices) -> ShareFetchHandlers:
    h = ShareFetchHandlers(services)
    table.register(ApiKey.SHARE_FETCH, 1, 2, h.share_fetch)
    table.register(ApiKey.SHARE_ACKNOWLEDGE, 1, 2, h.share_acknowledge)
    return h
