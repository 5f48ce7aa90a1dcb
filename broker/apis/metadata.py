"""ApiVersions, Metadata, FindCoordinator and DescribeCluster: how clients discover this broker."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.storage.topic_registry import INTERNAL_TOPICS, Topic, validate_topic_name
from shoal.coordinator.transaction_coordinator import TRANSACTION_VERSION
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import ZERO_UUID

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, DiscoveryServices
    from shoal.broker.common.config import Listener
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.metadata")

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
ApiVersionsResponse = messages.ApiVersionsResponse
MetadataResponse = messages.MetadataResponse
MdBroker = MetadataResponse.MetadataResponseBroker
MdTopic = MetadataResponse.MetadataResponseTopic
MdPartition = MetadataResponse.MetadataResponsePartition
FindCoordinatorResponse = messages.FindCoordinatorResponse
Coordinator = FindCoordinatorResponse.Coordinator
DescribeClusterResponse = messages.DescribeClusterResponse
DescribeTopicPartitionsResponse = messages.DescribeTopicPartitionsResponse
_DtpTopic = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
_DtpPartition = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition
_DtpCursor = DescribeTopicPartitionsResponse.Cursor
# Kafka's max.request.partition.size.limit default: the most partitions one response describes.
MAX_DESCRIBED_PARTITIONS = 2000
# Operations Kafka reports for a TOPIC resource.
TOPIC_OPERATIONS = (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
                    Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS)
DcBroker = DescribeClusterResponse.DescribeClusterBroker
# Operations Kafka reports for the CLUSTER resource (AclEntry.supportedOperations).
CLUSTER_OPERATIONS = (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                      Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE)


def authorized_operations(ctx: RequestContext, operations: tuple[Operation, ...], resource_type: ResourceType,
                          name: str) -> int:
    """The bit field Kafka answers include_*_authorized_operations with: bit n set when operation n is allowed."""
    return sum(1 << op for op in operations if ctx.authorize(op, resource_type, name))

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2


class DiscoveryHandlers:
    def __init__(self, services: DiscoveryServices):
        self.services = services

    def api_versions(self, ctx: RequestContext, req: messages.ApiVersionsRequest) -> messages.ApiVersionsResponse:
        feature = ApiVersionsResponse.SupportedFeatureKey
        finalized = ApiVersionsResponse.FinalizedFeatureKey
        # share.version 2 (Kafka 4.4) adds dead-letter topics for share groups (KIP-1191).
        share_level = 2 if self.services.config["group.share.enable"] else 0
        # Sidecar mode forwards transactions to the upstream cluster, which decides its own version.
        txn_level = 0 if self.services.config.upstream else TRANSACTION_VERSION
        # transaction.version 2 (KIP-890 part 2): a client that speaks it ends every transaction with an epoch
        # bump (EndTxn v5) and lets the broker add its partitions (Produce v12, TxnOffsetCommit v5); older
        # clients keep using AddPartitionsToTxn, AddOffsetsToTxn and EndTxn up to v4.
        return ApiVersionsResponse(
            error_code=ErrorCode.NONE,
            api_keys=self.services.api_version_entries(),
            supported_features=[feature(name="share.version", min_version=0, max_version=2),
                                feature(name="transaction.version", min_version=0, max_version=2)],
            finalized_features_epoch=0,
            finalized_features=[
                finalized(name="share.version", max_version_level=share_level, min_version_level=share_level),
                finalized(name="transaction.version", max_version_level=txn_level, min_version_level=txn_level)],
        )

    def _listener(self, ctx: RequestContext) -> Listener:
        return self.services.advertised_listener(ctx.connection.listener.name)

    def metadata(self, ctx: RequestContext, req: messages.MetadataRequest) -> messages.MetadataResponse:
        version = ctx.api_version
        topics = self.services.topics
        lst = self._listener(ctx)
        brokers = [MdBroker(node_id=self.services.node_id, host=lst.host, port=lst.port, rack=None)]
        with_ops = version >= 8 and req.include_topic_authorized_operations
        out = []
        if req.topics is None or (version == 0 and not req.topics):
            for topic in list(topics.by_name.values()):
                if ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                    out.append(self._topic(topic, ctx, with_ops))
        elif version < 12 and any(rt.name is None or rt.topic_id != ZERO_UUID for rt in req.topics):
            # As Kafka: v10 and v11 carry topic ids but cannot look them up, and their response cannot hold a
            # null name; the whole request is refused, each topic answered INVALID_REQUEST with "" for null.
            log.debug("metadata request refused: topic ids need v12", api_version=version, client=ctx.connection.client_host)
            return MetadataResponse(brokers=[], cluster_id=None, controller_id=-1, topics=[
                MdTopic(error_code=ErrorCode.INVALID_REQUEST, name=rt.name or "", topic_id=rt.topic_id,
                        is_internal=False, partitions=[])
                for rt in req.topics
            ], cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED, error_code=ErrorCode.NONE)
        else:
            auto_create = self.services.config["auto.create.topics.enable"] and (version < 4 or req.allow_auto_topic_creation)
            for rt in req.topics:
                topic = None
                if rt.name is None:
                    topic = topics.get_by_id(rt.topic_id)
                    if topic is None:
                        out.append(MdTopic(error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None, topic_id=rt.topic_id))
                        continue
                else:
                    topic = topics.get(rt.name)
                # Kafka checks DESCRIBE before existence, so an unauthorized client cannot probe which topics exist.
                described = topic.name if topic is not None else rt.name or ""  # rt.name is set: not by id
                if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, described):
                    out.append(MdTopic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=rt.name))
                    continue
                if topic is None:
                    topic, code = self._maybe_auto_create(ctx, described, auto_create)
                    if topic is None:
                        out.append(MdTopic(error_code=code, name=rt.name, is_internal=False))
                        continue
                out.append(self._topic(topic, ctx, with_ops))
        # v8-v10 only: later versions moved the cluster's operations to DescribeCluster.
        cluster_ops = (authorized_operations(ctx, CLUSTER_OPERATIONS, ResourceType.CLUSTER, CLUSTER_NAME)
                       if 8 <= version <= 10 and req.include_cluster_authorized_operations
                       else AUTHORIZED_OPERATIONS_OMITTED)
        return MetadataResponse(
            brokers=brokers,
            cluster_id=self.services.cluster_id,
            controller_id=self.services.node_id,
            topics=out,
            cluster_authorized_operations=cluster_ops,
            error_code=ErrorCode.NONE,
        )

    def _maybe_auto_create(self, ctx: RequestContext, name: str, enabled: bool) -> tuple[Topic | None, int]:
        if validate_topic_name(name) is not None:
            return None, ErrorCode.INVALID_TOPIC_EXCEPTION
        if not enabled:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if name in INTERNAL_TOPICS:
            # Only the broker creates an internal topic (`__transaction_state` on the first transactional
            # producer), with the partition count its coordinator places keys by, never num.partitions.
            log.info("not auto-creating an internal topic", topic=name)
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not ctx.authorize(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME) and not ctx.authorize(
            Operation.CREATE, ResourceType.TOPIC, name
        ):
            return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        count = int(self.services.config["num.partitions"])
        too_many = self.services.budget.problem(count)
        if too_many is not None:
            log.warning("refused topic auto-creation", topic=name, reason=too_many)
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        topic = self.services.topics.create(name, count)
        self.services.on_topic_created(topic)
        return topic, ErrorCode.NONE

    def _topic(self, topic: Topic, ctx: RequestContext, with_ops: bool) -> MdTopic:
        node = self.services.node_id
        return MdTopic(
            error_code=ErrorCode.NONE,
            name=topic.name,
            topic_id=topic.topic_id,
            is_internal=topic.internal,
            partitions=[
                MdPartition(
                    error_code=ErrorCode.NONE,
                    partition_index=i,
                    leader_id=node,
                    leader_epoch=0,
                    replica_nodes=[node],
                    isr_nodes=[node],
                    offline_replicas=[],
                )
                for i in range(len(topic.partitions))
            ],
            topic_authorized_operations=authorized_operations(ctx, TOPIC_OPERATIONS, ResourceType.TOPIC, topic.name)
            if with_ops else AUTHORIZED_OPERATIONS_OMITTED,
        )

    def find_coordinator(self, ctx: RequestContext, req: messages.FindCoordinatorRequest) -> messages.FindCoordinatorResponse:
        version = ctx.api_version
        lst = self._listener(ctx)
        key_type = req.key_type if version >= 1 else KEY_TYPE_GROUP
        keys = req.coordinator_keys if version >= 4 else [req.key]
        coordinators = []
        for key in keys:
            if key_type == KEY_TYPE_TRANSACTION and not ctx.authorize(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                                                       key):
                coordinators.append(Coordinator(key=key, node_id=-1, host="", port=-1,
                                                error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
            elif key_type == KEY_TYPE_GROUP and not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, key):
                coordinators.append(
                    Coordinator(key=key, node_id=-1, host="", port=-1, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
                )
            elif key_type == KEY_TYPE_SHARE and not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
                coordinators.append(
                    Coordinator(key=key, node_id=-1, host="", port=-1, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
                )
            elif key_type not in (KEY_TYPE_GROUP, KEY_TYPE_SHARE, KEY_TYPE_TRANSACTION):
                coordinators.append(Coordinator(key=key, node_id=-1, host="", port=-1, error_code=ErrorCode.INVALID_REQUEST))
            else:
                coordinators.append(
                    Coordinator(key=key, node_id=self.services.node_id, host=lst.host, port=lst.port, error_code=ErrorCode.NONE)
                )
        if version >= 4:
            return FindCoordinatorResponse(coordinators=coordinators)
        c = coordinators[0]
        return FindCoordinatorResponse(
            error_code=c.error_code, error_message=c.error_message, node_id=c.node_id, host=c.host, port=c.port
        )

    def describe_cluster(self, ctx: RequestContext, req: messages.DescribeClusterRequest) -> messages.DescribeClusterResponse:
        lst = self._listener(ctx)
        return DescribeClusterResponse(
            error_code=ErrorCode.NONE,
            endpoint_type=1,
            cluster_id=self.services.cluster_id,
            controller_id=self.services.node_id,
            brokers=[DcBroker(broker_id=self.services.node_id, host=lst.host, port=lst.port, rack=None, is_fenced=False)],
            cluster_authorized_operations=authorized_operations(ctx, CLUSTER_OPERATIONS, ResourceType.CLUSTER, CLUSTER_NAME)
            if req.include_cluster_authorized_operations else AUTHORIZED_OPERATIONS_OMITTED,
        )


    def describe_topic_partitions(self, ctx: RequestContext, req: messages.DescribeTopicPartitionsRequest) -> messages.DescribeTopicPartitionsResponse:
        """KIP-966's paginated topic description: topics by name, at most ResponsePartitionLimit partitions."""
        topics = self.services.topics
        limit = max(1, min(req.response_partition_limit, MAX_DESCRIBED_PARTITIONS))
        if req.topics:
            names = sorted({t.name for t in req.topics})
        else:
            names = sorted(n for n in topics.by_name if ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, n))
        cursor = req.cursor
        if cursor is not None:
            names = [n for n in names if n >= cursor.topic_name]
        out: list[_DtpTopic] = []
        next_cursor: _DtpCursor | None = None
        budget = limit
        for name in names:
            if budget <= 0:
                next_cursor = _DtpCursor(topic_name=name, partition_index=0)
                break
            topic = topics.get(name)
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
                out.append(_DtpTopic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name, topic_id=ZERO_UUID,
                                     partitions=[]))
                continue
            if topic is None:
                out.append(_DtpTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, topic_id=ZERO_UUID,
                                     partitions=[]))
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            indexes = list(range(max(first, 0), len(topic.partitions)))
            shown, rest = indexes[:budget], indexes[budget:]
            budget -= len(shown)
            out.append(_DtpTopic(
                error_code=ErrorCode.NONE, name=name, topic_id=topic.topic_id, is_internal=topic.internal,
                partitions=[_DtpPartition(error_code=ErrorCode.NONE, partition_index=i, leader_id=self.services.node_id,
                                          leader_epoch=0, replica_nodes=[self.services.node_id],
                                          isr_nodes=[self.services.node_id], eligible_leader_replicas=[],
                                          last_known_elr=[], offline_replicas=[]) for i in shown],
                topic_authorized_operations=authorized_operations(ctx, TOPIC_OPERATIONS, ResourceType.TOPIC, name),
            ))
            if rest:
                next_cursor = _DtpCursor(topic_name=name, partition_index=rest[0])
                break
        return DescribeTopicPartitionsResponse(topics=out, next_cursor=next_cursor)


def register(table: ApiTable, services: DiscoveryServices) -> DiscoveryHandlers:
    h = DiscoveryHandlers(services)
    table.register(ApiKey.API_VERSIONS, 0, 4, h.api_versions)
    table.register(ApiKey.METADATA, 0, 13, h.metadata)
    table.register(ApiKey.FIND_COORDINATOR, 0, 6, h.find_coordinator)
    table.register(ApiKey.DESCRIBE_CLUSTER, 0, 2, h.describe_cluster)
    table.register(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, 0, h.describe_topic_partitions)
    return h
