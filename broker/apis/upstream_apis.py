"""Sidecar mode's handlers: the client's request is translated for the upstream and the upstream's answer
for the client; the routing itself lives in `shoal.broker.upstream.forwarder`.

Registered after the standalone handlers when `upstream.bootstrap.servers` is set, so they take the
dispatch entries of the APIs they serve; every other API keeps its standalone handler.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog

from shoal.broker.common.purgatory import LogKey
from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.upstream.cluster import (
    SHARED_LANE,
    CoordinatorLookupFailed,
    Lane,
    UpstreamUnavailable,
    UpstreamUnsupported,
)
from shoal.broker.upstream.forwarder import DELETE_RECORDS, LIST_OFFSETS
from shoal.broker.upstream.state_topic_names import is_state_topic
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import ZERO_UUID

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, UpstreamServices
    from shoal.broker.network.connection import KafkaConnection, RequestContext

log = structlog.get_logger("shoal.sidecar")

_FETCH_LANE = "sidecar.fetch_lane"
_GROUP_LANE = "sidecar.group_lane"
# Group requests the coordinator holds until the group's rebalance moves on (up to the rebalance timeout):
# on the shared upstream connection they held up every request behind them, other groups' heartbeats too.
_WAITING_GROUP_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
# ConfigResource types (Kafka's ConfigResource.Type codes) whose ACL resource is not the cluster.
_CONFIG_TOPIC, _CONFIG_GROUP = 2, 32

_Response = TypeVar("_Response", bound=MessageBase)
_Item = TypeVar("_Item")
_ConfigRequest = TypeVar("_ConfigRequest", messages.DescribeConfigsRequest, messages.IncrementalAlterConfigsRequest,
                          messages.AlterConfigsRequest)
_Answer = TypeVar("_Answer")
# The group APIs answered by one coordinator call with a top-level error code.
GroupRequest = (messages.JoinGroupRequest | messages.SyncGroupRequest | messages.HeartbeatRequest
                | messages.LeaveGroupRequest | messages.ConsumerGroupHeartbeatRequest)


class ConfigResource(Protocol):
    """A resource of DescribeConfigs or IncrementalAlterConfigs: the same two fields in both."""

    @property
    def resource_type(self) -> int: ...
    @property
    def resource_name(self) -> str: ...


class SidecarHandlers:
    def __init__(self, services: UpstreamServices):
        self.services = services
        self.forward = services.forwarder

    def _lane(self, ctx: RequestContext, which: str = _FETCH_LANE) -> Lane:
        """This client connection's own upstream connections for its fetches, or for its JoinGroup and
        SyncGroup (see cluster.py): a broker answers one request of a connection at a time, and these wait."""
        conn = ctx.connection
        lane = conn.attachments.get(which)
        if lane is None:
            lane = conn.attachments[which] = Lane()
        return lane  # type: ignore[no-any-return]

    def _may(self, ctx: RequestContext, operation: Operation, name: str | None, topic_id: bytes | None) -> bool:
        """Shoal's own ACLs on an upstream topic, named or given by id (an id Shoal cannot name yet is let
        through: the upstream answers UNKNOWN_TOPIC_ID for it)."""
        resolved = self.forward.cluster.topic_name(name, topic_id)
        return resolved is None or ctx.authorize(operation, ResourceType.TOPIC, resolved)

    def on_connection_closed(self, conn: KafkaConnection) -> None:
        for which in (_FETCH_LANE, _GROUP_LANE):
            lane = conn.attachments.get(which)
            if lane is not None:
                self.services.forwarder.cluster.close_lane(lane)

    async def _guard(self, ctx: RequestContext, call: Awaitable[_Answer],
                     on_error: Callable[[int], _Answer] | None = None) -> _Answer | None:
        """Run a forwarded call. An unreachable upstream or a failed coordinator lookup becomes the API's
        retriable error when it has a place for one, else a logged close (the client retries elsewhere)."""
        api = messages.API_NAMES.get(ctx.header.api_key)
        try:
            return await call
        except CoordinatorLookupFailed as exc:
            code = exc.error_code
            reason = str(exc)
        except UpstreamUnsupported as exc:
            # As a Kafka broker answers an API it has switched off (ConsumerGroupHeartbeat without the
            # consumer protocol): retrying cannot help.
            code = ErrorCode.UNSUPPORTED_VERSION
            reason = str(exc)
        except UpstreamUnavailable as exc:
            if ctx.connection.closed:
                return None  # the client left while its request was upstream
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE if on_error is not None else ErrorCode.REQUEST_TIMED_OUT
            reason = str(exc)
        if on_error is not None:
            log.warning("upstream request failed; answering a retriable error", api=api, error_code=code, error=reason)
            return on_error(code)
        log.warning("upstream request failed; closing the client connection", api=api, error=reason)
        ctx.close_after_response()
        return None

    # ---- discovery ----------------------------------------------------------------------------

    async def metadata(self, ctx: RequestContext, req: messages.MetadataRequest) -> messages.MetadataResponse | None:
        response: messages.MetadataResponse | None = await self._guard(ctx, self.forward.metadata(req, ctx.api_version))
        if response is None:
            return None
        node_id = self.services.node_id
        broker = messages.MetadataResponse.MetadataResponseBroker
        # Every partition is led by a sidecar as far as the client knows (the one the sidecar group assigned
        # it to); its leader epoch stays the upstream's.
        response.brokers = [broker(node_id=n, host=host, port=port, rack=None)
                            for n, host, port in self._sidecars(ctx)]
        # Each sidecar names itself the controller: GROUP config changes go to the controller, and group
        # configs are each sidecar's own (not shared between sidecars yet).
        response.controller_id = node_id
        response.cluster_id = self.services.cluster_id
        for topic in response.topics:
            if topic.name is not None and not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                topic.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                topic.partitions = []
                continue
            for p in topic.partitions:
                if p.leader_id >= 0:
                    p.leader_id = self._leader(topic.name, p.partition_index)
                    if p.leader_id < 0:
                        p.error_code = ErrorCode.LEADER_NOT_AVAILABLE  # a rebalance of the sidecars is under way
                p.replica_nodes = [p.leader_id] if p.leader_id >= 0 else [node_id]
                p.isr_nodes = [p.leader_id] if p.leader_id >= 0 else []
                p.offline_replicas = []
        return response

    def _leader(self, topic: str | None, partition: int) -> int:
        """The sidecar leading an upstream partition: this one, or another in the sidecar group."""
        ownership = self.services.ownership
        if ownership is None or topic is None:
            return self.services.node_id
        return ownership.owner((topic, partition))

    def _sidecars(self, ctx: RequestContext) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every sidecar on the client's listener."""
        name = ctx.connection.listener.name
        ownership = self.services.ownership
        if ownership is None:
            lst = self.services.advertised_listener(name)
            return [(self.services.node_id, lst.host, lst.port)]
        found = []
        for node in sorted(ownership.members()):
            endpoint = ownership.endpoint(node, name)
            if endpoint is not None:
                found.append((node, endpoint.host, endpoint.port))
        return found

    async def describe_topic_partitions(self, ctx: RequestContext,
                                        req: messages.DescribeTopicPartitionsRequest
                                        ) -> messages.DescribeTopicPartitionsResponse | None:
        """KIP-966's paged topic description, from the upstream, with Shoal as every partition's leader."""
        response = await self._guard(
            ctx, self.forward.to_any_broker(ApiKey.DESCRIBE_TOPIC_PARTITIONS, req, ctx.api_version))
        if response is None:
            return None
        node_id = self.services.node_id
        for topic in response.topics:
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                topic.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                topic.partitions = []
                continue
            for p in topic.partitions:
                if p.leader_id >= 0:
                    p.leader_id = self._leader(topic.name, p.partition_index)
                    if p.leader_id < 0:
                        p.error_code = ErrorCode.LEADER_NOT_AVAILABLE
                p.replica_nodes = [p.leader_id] if p.leader_id >= 0 else [node_id]
                p.isr_nodes = [p.leader_id] if p.leader_id >= 0 else []
                p.eligible_leader_replicas = []
                p.last_known_elr = []
                p.offline_replicas = []
        return response

    # ---- data path ----------------------------------------------------------------------------

    async def produce(self, ctx: RequestContext, req: messages.ProduceRequest) -> messages.ProduceResponse | None:
        denied = [t for t in req.topic_data if not self._may(ctx, Operation.WRITE, t.name, t.topic_id)]
        if denied:
            return _all_partitions_error(req, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        if any(is_state_topic(self.forward.cluster.topic_name(t.name, t.topic_id)) for t in req.topic_data):
            # The sidecars' own state on the upstream, as Kafka refuses clients' produce to internal topics.
            return _all_partitions_error(req, ErrorCode.INVALID_TOPIC_EXCEPTION)
        response: messages.ProduceResponse | None = await self._guard(ctx, self.forward.produce(req, ctx.api_version))
        self._wake_share_fetches(req)
        return response

    def _wake_share_fetches(self, req: messages.ProduceRequest) -> None:
        """Share fetches parked on these partitions look again (records produced straight to the upstream
        are found when their long poll ends)."""
        purgatory = self.services.purgatory
        if purgatory is None:
            return
        cluster = self.forward.cluster
        for t in req.topic_data:
            topic_id = t.topic_id if t.topic_id and t.topic_id != ZERO_UUID else cluster.topic_ids.get(t.name or "")
            if topic_id is not None:
                for p in t.partition_data:
                    purgatory.notify(LogKey(topic_id, p.index))

    async def fetch(self, ctx: RequestContext, req: messages.FetchRequest) -> messages.FetchResponse | None:
        if req.replica_id >= 0 or (req.replica_state is not None and req.replica_state.replica_id >= 0):
            return messages.FetchResponse(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, session_id=0, responses=[])
        denied = [t for t in req.topics if not self._may(ctx, Operation.READ, t.topic, t.topic_id)]
        response: messages.FetchResponse | None
        if denied and len(denied) == len(req.topics):
            response = messages.FetchResponse(error_code=ErrorCode.NONE, session_id=0, responses=[], node_endpoints=[])
        else:
            if denied:
                req.topics = [t for t in req.topics if all(t is not d for d in denied)]
            response = await self._guard(ctx, self.forward.fetch(req, ctx.api_version, self._lane(ctx)))
            if response is None:
                return None
        # Kafka answers the partitions the principal may not read with TOPIC_AUTHORIZATION_FAILED.
        data = messages.FetchResponse
        response.responses += [data.FetchableTopicResponse(topic=t.topic, topic_id=t.topic_id, partitions=[
            data.PartitionData(partition_index=p.partition, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                               high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, records=None)
            for p in t.partitions]) for t in denied]
        return response

    async def list_offsets(self, ctx: RequestContext, req: messages.ListOffsetsRequest) -> messages.ListOffsetsResponse | None:
        return await self._partly(
            ctx, req, "topics", req.topics, lambda t: ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t.name),
            lambda: self.forward.list_offsets(req, ctx.api_version), messages.ListOffsetsResponse, "topics",
            lambda t: LIST_OFFSETS.topic_cls(name=t.name, partitions=[LIST_OFFSETS.error_partition(
                p.partition_index, ErrorCode.TOPIC_AUTHORIZATION_FAILED) for p in t.partitions]))

    async def offset_for_leader_epoch(self, ctx: RequestContext, req: messages.OffsetForLeaderEpochRequest
                                      ) -> messages.OffsetForLeaderEpochResponse | None:
        return await self._guard(ctx, self.forward.offset_for_leader_epoch(req, ctx.api_version))

    async def delete_records(self, ctx: RequestContext, req: messages.DeleteRecordsRequest) -> messages.DeleteRecordsResponse | None:
        return await self._partly(
            ctx, req, "topics", req.topics, lambda t: ctx.authorize(Operation.DELETE, ResourceType.TOPIC, t.name),
            lambda: self.forward.delete_records(req, ctx.api_version), messages.DeleteRecordsResponse, "topics",
            lambda t: DELETE_RECORDS.topic_cls(name=t.name, partitions=[DELETE_RECORDS.error_partition(
                p.partition_index, ErrorCode.TOPIC_AUTHORIZATION_FAILED) for p in t.partitions]))

    # ---- administration -----------------------------------------------------------------------

    async def to_any_broker(self, ctx: RequestContext, req: MessageBase) -> MessageBase | None:
        return await self._guard(ctx, self.forward.to_any_broker(ctx.header.api_key, req, ctx.api_version))

    async def _partly(self, ctx: RequestContext, req: MessageBase, items: str, listed: Sequence[_Item],
                      allowed: Callable[[_Item], bool], forward: Callable[[], Awaitable[_Response]],
                      response_cls: type[_Response], results: str,
                      refused: Callable[[_Item], MessageBase]) -> _Response | None:
        """Forward the items of a request the principal may act on; the others are answered here with their
        authorization error, as Kafka answers each item of these requests on its own. `listed` is the
        request's field `items`, given typed so the callbacks are checked against its item class."""
        denied = [item for item in listed if not allowed(item)]
        if denied:
            setattr(req, items, [item for item in listed if all(item is not d for d in denied)])
        if getattr(req, items) or not denied:
            response = await self._guard(ctx, forward())
            if response is None:
                return None
        else:
            response = response_cls(**{results: []})
        getattr(response, results).extend(refused(item) for item in denied)
        return response

    async def create_topics(self, ctx: RequestContext, req: messages.CreateTopicsRequest) -> messages.CreateTopicsResponse | None:
        cluster_ok = ctx.authorize(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
        result = messages.CreateTopicsResponse.CreatableTopicResult
        return await self._partly(
            ctx, req, "topics", req.topics, lambda t: cluster_ok or ctx.authorize(Operation.CREATE, ResourceType.TOPIC, t.name),
            lambda: self.forward.to_any_broker(ApiKey.CREATE_TOPICS, req, ctx.api_version),
            messages.CreateTopicsResponse, "topics",
            lambda t: result(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, num_partitions=-1,
                             replication_factor=-1, configs=[]))

    async def delete_topics(self, ctx: RequestContext, req: messages.DeleteTopicsRequest) -> messages.DeleteTopicsResponse | None:
        result = messages.DeleteTopicsResponse.DeletableTopicResult
        forward = lambda: self.forward.to_any_broker(ApiKey.DELETE_TOPICS, req, ctx.api_version)  # noqa: E731
        if ctx.api_version < 6:
            return await self._partly(
                ctx, req, "topic_names", req.topic_names, lambda n: ctx.authorize(Operation.DELETE, ResourceType.TOPIC, n), forward,
                messages.DeleteTopicsResponse, "responses",
                lambda n: result(name=n, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED))
        return await self._partly(
            ctx, req, "topics", req.topics, lambda t: self._may(ctx, Operation.DELETE, t.name, t.topic_id), forward,
            messages.DeleteTopicsResponse, "responses",
            lambda t: result(name=t.name, topic_id=t.topic_id, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED))

    async def create_partitions(self, ctx: RequestContext, req: messages.CreatePartitionsRequest) -> messages.CreatePartitionsResponse | None:
        result = messages.CreatePartitionsResponse.CreatePartitionsTopicResult
        return await self._partly(
            ctx, req, "topics", req.topics, lambda t: ctx.authorize(Operation.ALTER, ResourceType.TOPIC, t.name),
            lambda: self.forward.to_any_broker(ApiKey.CREATE_PARTITIONS, req, ctx.api_version),
            messages.CreatePartitionsResponse, "results",
            lambda t: result(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED))

    async def describe_configs(self, ctx: RequestContext, req: messages.DescribeConfigsRequest
                               ) -> messages.DescribeConfigsResponse | None:
        return await self._groups_here(ctx, req, messages.DescribeConfigsResponse,
                                       lambda: self._describe_configs(ctx, req),
                                       lambda upstream, local: upstream.results.extend(local.results))

    async def incremental_alter_configs(self, ctx: RequestContext, req: messages.IncrementalAlterConfigsRequest
                                        ) -> messages.IncrementalAlterConfigsResponse | None:
        return await self._groups_here(ctx, req, messages.IncrementalAlterConfigsResponse,
                                       lambda: self._incremental_alter_configs(ctx, req),
                                       lambda upstream, local: upstream.responses.extend(local.responses))

    async def alter_configs(self, ctx: RequestContext, req: messages.AlterConfigsRequest
                            ) -> messages.AlterConfigsResponse | None:
        """The legacy AlterConfigs (v0-2), split as IncrementalAlterConfigs is."""
        result = messages.AlterConfigsResponse.AlterConfigsResourceResponse
        return await self._groups_here(
            ctx, req, messages.AlterConfigsResponse,
            lambda: self._partly(
                ctx, req, "resources", req.resources, lambda r: self._may_config(ctx, Operation.ALTER_CONFIGS, r),
                lambda: self.forward.to_any_broker(ApiKey.ALTER_CONFIGS, req, ctx.api_version),
                messages.AlterConfigsResponse, "responses",
                lambda r: result(error_code=_config_denied(r), resource_type=r.resource_type,
                                 resource_name=r.resource_name)),
            lambda upstream, local: upstream.responses.extend(local.responses))

    async def _groups_here(self, ctx: RequestContext, req: _ConfigRequest, answer: type[_Response],
                           upstream: Callable[[], Awaitable[_Response | None]],
                           join: Callable[[_Response, _Response], None]) -> _Response | None:
        """GROUP resources are the sidecar's own (share groups live here)."""
        return await self._split(ctx, req, "resources", req.resources, _is_group_resource, answer, upstream, join)

    async def _split(self, ctx: RequestContext, req: MessageBase, items: str, listed: Sequence[_Item],
                     here: Callable[[_Item], bool], answer: type[_Response],
                     upstream: Callable[[], Awaitable[_Response | None]],
                     join: Callable[[_Response, _Response], None]) -> _Response | None:
        """The items of `req.<items>` (`listed`, given typed) that `here` picks are answered by the API's
        standalone handler, the rest by `upstream`; the answers are joined (the upstream's first)."""
        handler = self.services.local_handlers.get(ctx.header.api_key)
        # Picked before the local handler runs: a group it deletes is not the sidecar's any more.
        picked = [here(item) for item in listed]
        mine = [item for item, ours in zip(listed, picked, strict=True) if ours]
        others = [item for item, ours in zip(listed, picked, strict=True) if not ours]
        if handler is None or not mine:
            return await upstream()
        setattr(req, items, mine)
        try:
            local = await _answer_of(handler(ctx, req))
        finally:
            setattr(req, items, listed)
        assert isinstance(local, answer), local
        if not others:
            return local
        setattr(req, items, others)
        try:
            response = await upstream()
        finally:
            setattr(req, items, listed)
        if response is not None:
            join(response, local)
        return response

    async def _describe_configs(self, ctx: RequestContext, req: messages.DescribeConfigsRequest
                                ) -> messages.DescribeConfigsResponse | None:
        result = messages.DescribeConfigsResponse.DescribeConfigsResult
        return await self._partly(
            ctx, req, "resources", req.resources, lambda r: self._may_config(ctx, Operation.DESCRIBE_CONFIGS, r),
            lambda: self.forward.to_any_broker(ApiKey.DESCRIBE_CONFIGS, req, ctx.api_version),
            messages.DescribeConfigsResponse, "results",
            lambda r: result(error_code=_config_denied(r), resource_type=r.resource_type,
                             resource_name=r.resource_name, configs=[]))

    async def _incremental_alter_configs(self, ctx: RequestContext, req: messages.IncrementalAlterConfigsRequest
                                         ) -> messages.IncrementalAlterConfigsResponse | None:
        result = messages.IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
        return await self._partly(
            ctx, req, "resources", req.resources, lambda r: self._may_config(ctx, Operation.ALTER_CONFIGS, r),
            lambda: self.forward.to_any_broker(ApiKey.INCREMENTAL_ALTER_CONFIGS, req, ctx.api_version),
            messages.IncrementalAlterConfigsResponse, "responses",
            lambda r: result(error_code=_config_denied(r), resource_type=r.resource_type,
                             resource_name=r.resource_name))

    @staticmethod
    def _may_config(ctx: RequestContext, operation: Operation, resource: ConfigResource) -> bool:
        if resource.resource_type == _CONFIG_TOPIC:
            return ctx.authorize(operation, ResourceType.TOPIC, resource.resource_name)
        if resource.resource_type == _CONFIG_GROUP:
            return ctx.authorize(operation, ResourceType.GROUP, resource.resource_name)
        return ctx.authorize(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    # ---- transactions -------------------------------------------------------------------------

    async def init_producer_id(self, ctx: RequestContext, req: messages.InitProducerIdRequest
                               ) -> messages.InitProducerIdResponse | None:
        def error(code: int) -> messages.InitProducerIdResponse:
            return messages.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)

        if req.transactional_id:
            if not _may_txn(ctx, req.transactional_id):
                return error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif not ctx.authorize(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) \
                and not ctx.authorize_any(Operation.WRITE, ResourceType.TOPIC):
            return error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        return await self._guard(ctx, self.forward.init_producer_id(req, ctx.api_version), error)

    async def add_partitions_to_txn(self, ctx: RequestContext, req: messages.AddPartitionsToTxnRequest
                                    ) -> messages.AddPartitionsToTxnResponse | None:
        def error(code: int) -> messages.AddPartitionsToTxnResponse:
            if ctx.api_version >= 4:
                return messages.AddPartitionsToTxnResponse(error_code=code, results_by_transaction=[])
            result = messages.AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
            part = messages.AddPartitionsToTxnResponse.AddPartitionsToTxnPartitionResult
            return messages.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=[
                result(name=t.name, results_by_partition=[part(partition_index=i, partition_error_code=code)
                                                          for i in t.partitions])
                for t in req.v3_and_below_topics])

        ids = [t.transactional_id for t in req.transactions] if ctx.api_version >= 4 \
            else [req.v3_and_below_transactional_id]
        if any(not _may_txn(ctx, txn_id) for txn_id in ids):
            return error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return await self._guard(ctx, self.forward.add_partitions_to_txn(req, ctx.api_version), error)

    async def add_offsets_to_txn(self, ctx: RequestContext, req: messages.AddOffsetsToTxnRequest) -> messages.AddOffsetsToTxnResponse | None:
        if not _may_txn(ctx, req.transactional_id):
            return messages.AddOffsetsToTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return messages.AddOffsetsToTxnResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return await self._guard(
            ctx, self.forward.txn_request(req.transactional_id, ApiKey.ADD_OFFSETS_TO_TXN, req, ctx.api_version),
            lambda code: messages.AddOffsetsToTxnResponse(error_code=code))

    async def end_txn(self, ctx: RequestContext, req: messages.EndTxnRequest) -> messages.EndTxnResponse | None:
        if not _may_txn(ctx, req.transactional_id):
            return messages.EndTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return await self._guard(
            ctx, self.forward.txn_request(req.transactional_id, ApiKey.END_TXN, req, ctx.api_version),
            lambda code: messages.EndTxnResponse(error_code=code))

    async def txn_offset_commit(self, ctx: RequestContext, req: messages.TxnOffsetCommitRequest
                                ) -> messages.TxnOffsetCommitResponse | None:
        # Kafka sends TxnOffsetCommit to the group's coordinator, not the transaction's.
        def error(code: int) -> messages.TxnOffsetCommitResponse:
            topic = messages.TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
            part = messages.TxnOffsetCommitResponse.TxnOffsetCommitResponsePartition
            return messages.TxnOffsetCommitResponse(topics=[
                topic(name=t.name, partitions=[part(partition_index=p.partition_index, error_code=code)
                                               for p in t.partitions]) for t in req.topics])

        if not _may_txn(ctx, req.transactional_id):
            return error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return error(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return await self._guard(
            ctx, self.forward.group_request(req.group_id, ApiKey.TXN_OFFSET_COMMIT, req, ctx.api_version), error)

    # ---- groups -------------------------------------------------------------------------------

    async def group_call(self, ctx: RequestContext, req: GroupRequest) -> MessageBase | None:
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat: a top-level error code."""
        cls = messages.RESPONSES[ctx.header.api_key].cls
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        lane = self._lane(ctx, _GROUP_LANE) if ctx.header.api_key in _WAITING_GROUP_APIS else SHARED_LANE
        return await self._guard(
            ctx, self.forward.group_request(req.group_id, ctx.header.api_key, req, ctx.api_version, lane),
            lambda code: cls(error_code=code))

    async def offset_commit(self, ctx: RequestContext, req: messages.OffsetCommitRequest
                            ) -> messages.OffsetCommitResponse | None:
        def error(code: int) -> messages.OffsetCommitResponse:
            topic = messages.OffsetCommitResponse.OffsetCommitResponseTopic
            part = messages.OffsetCommitResponse.OffsetCommitResponsePartition
            return messages.OffsetCommitResponse(topics=[
                topic(name=t.name, topic_id=t.topic_id,
                      partitions=[part(partition_index=p.partition_index, error_code=code) for p in t.partitions])
                for t in req.topics])

        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return error(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return await self._guard(
            ctx, self.forward.group_request(req.group_id, ApiKey.OFFSET_COMMIT, req, ctx.api_version), error)

    async def consumer_group_describe(self, ctx: RequestContext, req: messages.ConsumerGroupDescribeRequest
                                      ) -> messages.ConsumerGroupDescribeResponse | None:
        if any(not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, g) for g in req.group_ids):
            return messages.ConsumerGroupDescribeResponse(groups=[
                messages.ConsumerGroupDescribeResponse.DescribedGroup(
                    group_id=g, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_state="", assignor_name="",
                    members=[]) for g in req.group_ids])
        return await self._guard(ctx, self.forward.consumer_group_describe(req, ctx.api_version))

    async def list_groups(self, ctx: RequestContext, req: messages.ListGroupsRequest) -> messages.ListGroupsResponse | None:
        """The upstream's groups and the sidecar's own share groups in one answer, as Kafka's admin client
        joins the answers of every broker. A group the principal may not describe is left out, as Kafka's
        broker does (unless it may describe the cluster)."""
        response: messages.ListGroupsResponse | None = await self._guard(
            ctx, self.forward.list_groups(req, ctx.api_version),
            lambda code: messages.ListGroupsResponse(error_code=code, groups=[]))
        if response is None:
            return None
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            response.groups = [g for g in response.groups
                               if ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)]
        handler = self.services.local_handlers.get(ApiKey.LIST_GROUPS)
        if handler is None:
            return response
        local = await _answer_of(handler(ctx, req))
        assert isinstance(local, messages.ListGroupsResponse), local
        # A group id names one group: where both have it, the sidecar's share group is the one it serves.
        own = {g.group_id for g in local.groups}
        response.groups = [g for g in response.groups if g.group_id not in own] + list(local.groups)
        if response.error_code == ErrorCode.NONE:
            response.error_code = local.error_code
        return response

    def _is_share_group(self, group_id: str) -> bool:
        return self.services.share_group_exists(group_id)

    async def describe_groups(self, ctx: RequestContext, req: messages.DescribeGroupsRequest) -> messages.DescribeGroupsResponse | None:
        """Share groups are described by the sidecar (as Kafka answers DescribeGroups for one), the others
        by the upstream."""
        return await self._split(ctx, req, "groups", req.groups, self._is_share_group, messages.DescribeGroupsResponse,
                                 lambda: self._describe_upstream_groups(ctx, req),
                                 lambda upstream, local: upstream.groups.extend(local.groups))

    async def _describe_upstream_groups(self, ctx: RequestContext, req: messages.DescribeGroupsRequest
                                        ) -> messages.DescribeGroupsResponse | None:
        if any(not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, g) for g in req.groups):
            return messages.DescribeGroupsResponse(groups=[messages.DescribeGroupsResponse.DescribedGroup(
                group_id=g, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_state="", protocol_type="",
                protocol_data="", members=[]) for g in req.groups])
        return await self._guard(ctx, self.forward.describe_groups(req, ctx.api_version))

    async def delete_groups(self, ctx: RequestContext, req: messages.DeleteGroupsRequest) -> messages.DeleteGroupsResponse | None:
        """Share groups are deleted by the sidecar, the others by the upstream."""
        return await self._split(ctx, req, "groups_names", req.groups_names, self._is_share_group,
                                 messages.DeleteGroupsResponse,
                                 lambda: self._delete_upstream_groups(ctx, req),
                                 lambda upstream, local: upstream.results.extend(local.results))

    async def _delete_upstream_groups(self, ctx: RequestContext, req: messages.DeleteGroupsRequest
                                      ) -> messages.DeleteGroupsResponse | None:
        if any(not ctx.authorize(Operation.DELETE, ResourceType.GROUP, g) for g in req.groups_names):
            return messages.DeleteGroupsResponse(results=[messages.DeleteGroupsResponse.DeletableGroupResult(
                group_id=g, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED) for g in req.groups_names])
        return await self._guard(ctx, self.forward.delete_groups(req, ctx.api_version))

    async def offset_delete(self, ctx: RequestContext, req: messages.OffsetDeleteRequest) -> messages.OffsetDeleteResponse | None:
        if not ctx.authorize(Operation.DELETE, ResourceType.GROUP, req.group_id):
            return messages.OffsetDeleteResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[])
        return await self._guard(
            ctx, self.forward.group_request(req.group_id, ApiKey.OFFSET_DELETE, req, ctx.api_version),
            lambda code: messages.OffsetDeleteResponse(error_code=code, topics=[]))

    async def offset_fetch(self, ctx: RequestContext, req: messages.OffsetFetchRequest
                           ) -> messages.OffsetFetchResponse | None:
        def error(code: int) -> messages.OffsetFetchResponse:
            if ctx.api_version >= 8:
                group = messages.OffsetFetchResponse.OffsetFetchResponseGroup
                return messages.OffsetFetchResponse(groups=[group(group_id=g.group_id, topics=[], error_code=code)
                                                            for g in req.groups])
            return messages.OffsetFetchResponse(topics=[], error_code=code)

        groups = [g.group_id for g in req.groups] if ctx.api_version >= 8 else [req.group_id]
        if any(not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, g) for g in groups):
            return error(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return await self._guard(ctx, self.forward.offset_fetch(req, ctx.api_version), error)


def _is_group_resource(resource: ConfigResource) -> bool:
    return resource.resource_type == _CONFIG_GROUP


async def _answer_of(answered: object) -> object:
    """A standalone handler's answer: some are plain functions, some coroutines."""
    if inspect.isawaitable(answered):
        return await answered
    return answered


def _may_txn(ctx: RequestContext, transactional_id: str) -> bool:
    return ctx.authorize(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


def _config_denied(resource: ConfigResource) -> int:
    if resource.resource_type == _CONFIG_TOPIC:
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if resource.resource_type == _CONFIG_GROUP:
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def _all_partitions_error(req: messages.ProduceRequest, code: int) -> messages.ProduceResponse:
    topic = messages.ProduceResponse.TopicProduceResponse
    part = messages.ProduceResponse.PartitionProduceResponse
    return messages.ProduceResponse(responses=[
        topic(name=t.name, topic_id=t.topic_id,
              partition_responses=[part(index=p.index, error_code=code, base_offset=-1) for p in t.partition_data])
        for t in req.topic_data], node_endpoints=[])


# The APIs answered by the upstream alone (the config APIs also answer GROUP resources here, and the group
# listing, describing and deleting APIs the sidecar's share groups): one the upstream does not serve at all
# is not advertised either (see wiring).
UPSTREAM_ONLY_APIS = (
    ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.DELETE_RECORDS, ApiKey.OFFSET_FOR_LEADER_EPOCH,
    ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.INIT_PRODUCER_ID,
    ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT,
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.CONSUMER_GROUP_HEARTBEAT,
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE, ApiKey.CONSUMER_GROUP_DESCRIBE,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS,
)


def register(table: ApiTable, services: UpstreamServices) -> SidecarHandlers:
    h = SidecarHandlers(services)
    services.connection_listeners.append(h.on_connection_closed)
    table.register(ApiKey.METADATA, 0, 13, h.metadata)
    table.register(ApiKey.PRODUCE, 3, 13, h.produce)
    table.register(ApiKey.FETCH, 4, 17, h.fetch)
    table.register(ApiKey.LIST_OFFSETS, 1, 11, h.list_offsets)
    table.register(ApiKey.DELETE_RECORDS, 0, 2, h.delete_records)
    table.register(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, h.offset_for_leader_epoch)
    table.register(ApiKey.CREATE_TOPICS, 2, 7, h.create_topics)
    table.register(ApiKey.DELETE_TOPICS, 1, 6, h.delete_topics)
    table.register(ApiKey.CREATE_PARTITIONS, 0, 3, h.create_partitions)
    table.register(ApiKey.DESCRIBE_CONFIGS, 1, 4, h.describe_configs)
    table.register(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, h.incremental_alter_configs)
    table.register(ApiKey.ALTER_CONFIGS, 0, 2, h.alter_configs)
    table.register(ApiKey.INIT_PRODUCER_ID, 0, 5, h.init_producer_id)
    table.register(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5, h.add_partitions_to_txn)
    table.register(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, h.add_offsets_to_txn)
    table.register(ApiKey.END_TXN, 0, 4, h.end_txn)
    table.register(ApiKey.TXN_OFFSET_COMMIT, 0, 3, h.txn_offset_commit)
    table.register(ApiKey.JOIN_GROUP, 0, 9, h.group_call)
    table.register(ApiKey.SYNC_GROUP, 0, 5, h.group_call)
    table.register(ApiKey.HEARTBEAT, 0, 4, h.group_call)
    table.register(ApiKey.LEAVE_GROUP, 0, 5, h.group_call)
    table.register(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, h.group_call)
    table.register(ApiKey.OFFSET_COMMIT, 2, 10, h.offset_commit)
    table.register(ApiKey.OFFSET_FETCH, 1, 10, h.offset_fetch)
    table.register(ApiKey.OFFSET_DELETE, 0, 0, h.offset_delete)
    table.register(ApiKey.LIST_GROUPS, 0, 5, h.list_groups)
    table.register(ApiKey.DESCRIBE_GROUPS, 0, 6, h.describe_groups)
    table.register(ApiKey.DELETE_GROUPS, 0, 2, h.delete_groups)
    table.register(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, h.consumer_group_describe)
    table.register(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, 0, h.describe_topic_partitions)
    return h
