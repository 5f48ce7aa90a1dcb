"""Cluster administration as Kafka answers it on one node: DescribeLogDirs, ElectLeaders, partition
reassignments, client quotas, DescribeQuorum and UpdateFeatures.

This broker is the only replica and the leader of every partition, so elections are never needed and the
only assignment a partition can have is the one it has. Quotas are kept and described here;
security/client_quota_manager.py enforces the byte rates.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.storage.client_quotas import QuotaOp, QuotaRequestError
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode, shorten
from shoal.protocol.uuids import ZERO_UUID

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ClusterAdminServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.cluster_admin")

ELECTION_PREFERRED, ELECTION_UNCLEAN = 0, 1
# Kafka's ApiError(ELECTION_NOT_NEEDED) carries the error's default message.
ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
METADATA_TOPIC = "__cluster_metadata"
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3

_LogDirs = messages.DescribeLogDirsResponse
_Elect = messages.ElectLeadersResponse
_Reassign = messages.AlterPartitionReassignmentsResponse
_ListReassign = messages.ListPartitionReassignmentsResponse
_DescQuotas = messages.DescribeClientQuotasResponse
_AlterQuotas = messages.AlterClientQuotasResponse
_Quorum = messages.DescribeQuorumResponse
_Features = messages.UpdateFeaturesResponse


class ClusterAdmin:
    def __init__(self, services: ClusterAdminServices):
        self.services = services

    # ---- DescribeLogDirs ------------------------------------------------------------------------

    def describe_log_dirs(self, ctx: RequestContext, req: messages.DescribeLogDirsRequest) -> messages.DescribeLogDirsResponse:
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return _LogDirs(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[])
        topics = self.services.topics
        wanted: list[tuple[str, list[int]]]
        if req.topics is None:
            wanted = [(t.name, list(range(len(t.partitions)))) for t in topics.by_name.values()]
        else:
            wanted = [(t.topic, list(t.partitions)) for t in req.topics]
        out: dict[str, list[_LogDirs.DescribeLogDirsPartition]] = {}
        for name, indexes in wanted:
            topic = topics.get(name)
            if topic is None:
                continue  # as Kafka: partitions this broker does not hold are left out
            for index in indexes:
                if 0 <= index < len(topic.partitions):
                    plog = topic.partitions[index]
                    out.setdefault(name, []).append(_LogDirs.DescribeLogDirsPartition(
                        partition_index=index, partition_size=plog.size_bytes(), offset_lag=0, is_future_key=False))
        log_dir = Path(self.services.config["log.dirs"]).resolve()
        try:
            st = os.statvfs(log_dir)
            total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        except OSError:
            total = usable = -1
        result = _LogDirs.DescribeLogDirsResult(
            error_code=ErrorCode.NONE, log_dir=str(log_dir),
            topics=[_LogDirs.DescribeLogDirsTopic(name=name, partitions=parts) for name, parts in out.items()],
            total_bytes=total, usable_bytes=usable)
        return _LogDirs(error_code=ErrorCode.NONE, results=[result])

    # ---- ElectLeaders ---------------------------------------------------------------------------

    def elect_leaders(self, ctx: RequestContext, req: messages.ElectLeadersRequest) -> messages.ElectLeadersResponse:
        election = req.election_type if ctx.api_version >= 1 else ELECTION_PREFERRED
        allowed = ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
        if election not in (ELECTION_PREFERRED, ELECTION_UNCLEAN) and allowed:
            return _Elect(error_code=ErrorCode.INVALID_REQUEST, replica_election_results=[])
        topics = self.services.topics
        results = []
        if req.topic_partitions is None:
            if not allowed:
                return _Elect(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, replica_election_results=[])
            # Every partition already has its preferred leader; Kafka leaves those out of an all-partition answer.
            results = [_Elect.ReplicaElectionResult(topic=name, partition_result=[]) for name in topics.by_name]
            return _Elect(error_code=ErrorCode.NONE, replica_election_results=results)
        for tp in req.topic_partitions:
            parts = []
            topic = topics.get(tp.topic)
            for index in tp.partitions:
                if not allowed:
                    code, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
                elif topic is None:
                    code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {shorten(tp.topic)}"
                elif not 0 <= index < len(topic.partitions):
                    code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {shorten(tp.topic)}-{index}"
                else:
                    code, message = ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE
                parts.append(_Elect.PartitionResult(partition_id=index, error_code=code, error_message=message))
            results.append(_Elect.ReplicaElectionResult(topic=tp.topic, partition_result=parts))
        return _Elect(error_code=ErrorCode.NONE if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                      replica_election_results=results)

    # ---- partition reassignments ----------------------------------------------------------------

    def alter_partition_reassignments(self, ctx: RequestContext,
                                      req: messages.AlterPartitionReassignmentsRequest) -> messages.AlterPartitionReassignmentsResponse:
        allowed = ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
        node = self.services.node_id
        responses = []
        for t in req.topics:
            topic = self.services.topics.get(t.name)
            parts = []
            for p in t.partitions:
                code, message = ErrorCode.NONE, None
                if not allowed:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                elif topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    message = f"Unable to find partition {shorten(t.name)}:{p.partition_index}."
                elif p.replicas is None:
                    code, message = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None  # nothing to cancel
                else:
                    message = _assignment_problem(p.replicas, node)
                    if message is not None:
                        code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                        log.info("reassignment refused", topic=shorten(t.name), partition=p.partition_index,
                                 reason=message)
                parts.append(_Reassign.ReassignablePartitionResponse(partition_index=p.partition_index,
                                                                    error_code=code, error_message=message))
            responses.append(_Reassign.ReassignableTopicResponse(name=t.name, partitions=parts))
        top = ErrorCode.NONE if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return _Reassign(error_code=top, error_message=None, responses=responses)

    def list_partition_reassignments(self, ctx: RequestContext,
                                     req: messages.ListPartitionReassignmentsRequest) -> messages.ListPartitionReassignmentsResponse:
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return _ListReassign(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, topics=[])
        # A reassignment completes the moment it is accepted: none is ever in progress.
        return _ListReassign(error_code=ErrorCode.NONE, error_message=None, topics=[])

    # ---- client quotas --------------------------------------------------------------------------

    def describe_client_quotas(self, ctx: RequestContext, req: messages.DescribeClientQuotasRequest) -> messages.DescribeClientQuotasResponse:
        if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
            return _DescQuotas(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, entries=None)
        try:
            found = self.services.client_quotas.describe(
                [(c.entity_type, c.match_type, c.match) for c in req.components], req.strict)
        except QuotaRequestError as exc:
            code = ErrorCode.UNSUPPORTED_VERSION if exc.unsupported else ErrorCode.INVALID_REQUEST
            return _DescQuotas(error_code=code, error_message=str(exc), entries=None)
        return _DescQuotas(error_code=ErrorCode.NONE, error_message=None, entries=[
            _DescQuotas.EntryData(
                entity=[_DescQuotas.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                values=[_DescQuotas.ValueData(key=k, value=v) for k, v in sorted(values.items())])
            for entity, values in found
        ])

    def alter_client_quotas(self, ctx: RequestContext, req: messages.AlterClientQuotasRequest) -> messages.AlterClientQuotasResponse:
        allowed = ctx.authorize(Operation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)
        out = []
        for entry in req.entries:
            entity = tuple((e.entity_type, e.entity_name) for e in entry.entity)
            if not allowed:
                code, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
            else:
                ops = [QuotaOp(o.key, o.value, o.remove) for o in entry.ops]
                message = self.services.client_quotas.alter(entity, ops, req.validate_only)
                code = ErrorCode.NONE if message is None else ErrorCode.INVALID_REQUEST
                if message is not None:
                    log.info("client quota refused", entity=str(entity)[:200], reason=message)
            out.append(_AlterQuotas.EntryData(
                error_code=code, error_message=message,
                entity=[_AlterQuotas.EntityData(entity_type=t, entity_name=n) for t, n in entity]))
        return _AlterQuotas(entries=out)

    # ---- DescribeQuorum -------------------------------------------------------------------------

    def describe_quorum(self, ctx: RequestContext, req: messages.DescribeQuorumRequest) -> messages.DescribeQuorumResponse:
        """This node as the single voter and leader of a metadata quorum. Shoal keeps its metadata in files,
        not in a replicated log, so offsets are unknown (-1)."""
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return _Quorum(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, topics=[], nodes=[])
        node = self.services.node_id
        now = int(time.time() * 1000)
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                if t.topic_name != METADATA_TOPIC or p.partition_index != 0:
                    parts.append(_Quorum.PartitionData(partition_index=p.partition_index,
                                                       error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                       leader_id=-1, leader_epoch=-1, high_watermark=-1,
                                                       current_voters=[], observers=[]))
                    continue
                voter = _Quorum.ReplicaState(replica_id=node, replica_directory_id=ZERO_UUID, log_end_offset=-1,
                                             last_fetch_timestamp=now, last_caught_up_timestamp=now)
                parts.append(_Quorum.PartitionData(partition_index=0, error_code=ErrorCode.NONE, leader_id=node,
                                                   leader_epoch=0, high_watermark=-1, current_voters=[voter],
                                                   observers=[]))
            topics.append(_Quorum.TopicData(topic_name=t.topic_name, partitions=parts))
        lst = self.services.advertised_listener(ctx.connection.listener.name)
        nodes = [_Quorum.Node(node_id=node, listeners=[_Quorum.Listener(name=lst.name, host=lst.host, port=lst.port)])]
        return _Quorum(error_code=ErrorCode.NONE, topics=topics, nodes=nodes)

    # ---- UpdateFeatures -------------------------------------------------------------------------

    def update_features(self, ctx: RequestContext, req: messages.UpdateFeaturesRequest) -> messages.UpdateFeaturesResponse:
        allowed = ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
        finalized = self.services.finalized_features()
        results = []
        for update in req.feature_updates:
            code, message = ErrorCode.NONE, None
            if not allowed:
                code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            elif update.feature not in finalized:
                code = ErrorCode.INVALID_UPDATE_VERSION
                message = (f"Invalid update version {update.max_version_level} for feature {shorten(update.feature)}. "
                           f"The controller does not support the given {shorten(update.feature)} feature.")
            elif update.max_version_level != finalized[update.feature]:
                # The level follows from the broker's configuration (group.share.enable), not from this API.
                code = ErrorCode.INVALID_UPDATE_VERSION
                message = (f"Invalid update version {update.max_version_level} for feature {update.feature}. "
                           f"Its level on this broker is {finalized[update.feature]}, set by its configuration.")
            if code != ErrorCode.NONE:
                log.info("feature update refused", feature=shorten(update.feature), level=update.max_version_level,
                         error_code=int(code))
            results.append(_Features.UpdatableFeatureResult(feature=update.feature, error_code=code,
                                                            error_message=message))
        if not allowed:
            return _Features(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, results=results)
        if ctx.api_version >= 2:
            # v2 has no per-feature results: the first failure is the answer.
            failed = next((r for r in results if r.error_code != ErrorCode.NONE), None)
            if failed is not None:
                return _Features(error_code=failed.error_code, error_message=failed.error_message, results=[])
        return _Features(error_code=ErrorCode.NONE, error_message=None, results=results)


def _assignment_problem(replicas: list[int], node: int) -> str | None:
    """Kafka's checks of a manual assignment, on a cluster whose only broker is `node`."""
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    seen: set[int] = set()
    for broker in replicas:
        if broker in seen:
            return f"The manual partition assignment includes the broker {broker} more than once."
        seen.add(broker)
        if broker != node:
            return f"The manual partition assignment includes broker {broker}, but no such broker is registered."
    return None


def register(table: ApiTable, services: ClusterAdminServices) -> ClusterAdmin:
    h = ClusterAdmin(services)
    table.register(ApiKey.DESCRIBE_LOG_DIRS, 1, 4, h.describe_log_dirs)
    table.register(ApiKey.ELECT_LEADERS, 0, 2, h.elect_leaders)
    table.register(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 0, h.alter_partition_reassignments)
    table.register(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, h.list_partition_reassignments)
    table.register(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, h.describe_client_quotas)
    table.register(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1, h.alter_client_quotas)
    table.register(ApiKey.DESCRIBE_QUORUM, 0, 2, h.describe_quorum)
    table.register(ApiKey.UPDATE_FEATURES, 0, 2, h.update_features)
    return h
