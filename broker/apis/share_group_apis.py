"""ShareGroupHeartbeat, ShareGroupDescribe and ListGroups: the client-facing side of the group coordinator.

Authorization happens here (as in Kafka's request layer); membership logic lives in
`shoal.coordinator.share_group_coordinator`, given to the handlers as `ShareGroupServices.share_groups`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.coordinator.share_group_coordinator import ShareGroupCoordinator
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ShareGroupServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.share_group_apis")

HeartbeatResponse = messages.ShareGroupHeartbeatResponse
DescribeResponse = messages.ShareGroupDescribeResponse
DescribedGroup = DescribeResponse.DescribedGroup
ListGroupsResponse = messages.ListGroupsResponse
ListedGroup = ListGroupsResponse.ListedGroup

PROTOCOL_TYPE = "share"
GROUP_TYPE = "share"
CLASSIC_GROUP_TYPE = "classic"
# KIP-848 groups: their group type and protocol type are both "consumer".
CONSUMER_GROUP_TYPE = "consumer"
KNOWN_GROUP_TYPES = frozenset({"classic", "consumer", "share", "streams"})
# Operations Kafka reports for a GROUP resource (AclEntry.supportedOperations).
GROUP_OPERATIONS = (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS,
                    Operation.ALTER_CONFIGS)


def invalid_topic_names(names: list[str] | None) -> str | None:
    """Why a heartbeat's SubscribedTopicNames cannot be used, or None. The schema's strings are not
    nullable, so Kafka never lets a null name reach its coordinator (its request parsing refuses it); the
    codec here reads one as None, so it is refused at request validation, before authorization and the
    coordinator."""
    if names is not None and any(name is None for name in names):
        return "SubscribedTopicNames can't contain null."
    return None


class ShareGroupHandlers:
    """What the share-group APIs (here and in share_group_admin) have in common: the coordinator and
    the group.share.enable switch."""

    def __init__(self, services: ShareGroupServices):
        self.services = services

    @property
    def coordinator(self) -> ShareGroupCoordinator | None:
        return self.services.share_groups

    def _enabled(self) -> bool:
        return bool(self.services.config["group.share.enable"])


class ShareGroupApis(ShareGroupHandlers):

    async def share_group_heartbeat(self, ctx: RequestContext, req: messages.ShareGroupHeartbeatRequest) -> messages.ShareGroupHeartbeatResponse:
        if not self._enabled():
            return HeartbeatResponse(error_code=ErrorCode.UNSUPPORTED_VERSION,
                                     error_message="Share groups are not enabled on this broker.")
        invalid = invalid_topic_names(req.subscribed_topic_names)
        if invalid is not None:
            log.warning("invalid share group heartbeat", group=req.group_id, reason=invalid)
            return HeartbeatResponse(error_code=ErrorCode.INVALID_REQUEST, error_message=invalid)
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        # Clients may not learn anything about topics they cannot describe.
        for name in set(req.subscribed_topic_names or ()):
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
                return HeartbeatResponse(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        coordinator = self.coordinator
        if coordinator is None:
            return HeartbeatResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        # Kafka reports the client address the way Java prints an InetAddress ("/127.0.0.1").
        return await coordinator.heartbeat(req, ctx.header.client_id or "", "/" + ctx.connection.client_host)

    def share_group_describe(self, ctx: RequestContext, req: messages.ShareGroupDescribeRequest) -> messages.ShareGroupDescribeResponse:
        if not self._enabled():
            return DescribeResponse(groups=[
                DescribedGroup(group_id=g, error_code=ErrorCode.UNSUPPORTED_VERSION, members=[]) for g in req.group_ids
            ])
        coordinator = self.coordinator
        out = []
        for group_id in req.group_ids:
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, members=[]))
            elif not group_id:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.INVALID_GROUP_ID, members=[]))
            elif coordinator is None:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, members=[]))
            elif not coordinator.loaded:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, members=[]))
            else:
                [described] = coordinator.describe([group_id])
                out.append(self._restrict(ctx, described, req.include_authorized_operations))
        return DescribeResponse(groups=out)

    @staticmethod
    def _restrict(
        ctx: RequestContext, group: DescribeResponse.DescribedGroup, include_operations: bool
    ) -> DescribeResponse.DescribedGroup:
        if group.error_code != ErrorCode.NONE:
            return group
        topics = {tp.topic_name for m in group.members for tp in m.assignment.topic_partitions}
        if any(not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t) for t in topics):
            return DescribedGroup(
                group_id=group.group_id, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, members=[],
                error_message="The group has described topic(s) that the client is not authorized to describe.",
            )
        if include_operations:
            group.authorized_operations = sum(
                1 << op for op in GROUP_OPERATIONS if ctx.authorize(op, ResourceType.GROUP, group.group_id)
            )
        return group

    def list_groups(self, ctx: RequestContext, req: messages.ListGroupsRequest) -> messages.ListGroupsResponse:
        """Share groups (when enabled), classic and consumer groups."""
        coordinator = self.coordinator
        classic = self.services.classic_groups
        if coordinator is None:
            return ListGroupsResponse(error_code=ErrorCode.NONE, groups=[])
        consumer_groups = self.services.consumer_groups
        if not coordinator.loaded or any(c is not None and not c.loaded for c in (classic, consumer_groups)):
            return ListGroupsResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, groups=[])
        version = ctx.api_version
        states = {s.strip().lower() for s in (req.states_filter or ())} if version >= 4 else set()
        types = {t.strip().lower() for t in (req.types_filter or ())} if version >= 5 else set()
        listed: list[tuple[str, str, str, str]] = []  # id, protocol type, state, group type
        if self._enabled():
            listed += [(gid, PROTOCOL_TYPE, state, GROUP_TYPE) for gid, state in coordinator.list_groups()]
        if classic is not None:
            listed += [(gid, ptype, state, CLASSIC_GROUP_TYPE) for gid, ptype, state in classic.list_groups()]
        consumer = self.services.consumer_groups
        if consumer is not None:
            listed += [(gid, CONSUMER_GROUP_TYPE, state, CONSUMER_GROUP_TYPE) for gid, state in consumer.list_groups()]
        see_all = ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        groups = [
            ListedGroup(group_id=gid, protocol_type=ptype, group_state=state, group_type=gtype)
            for gid, ptype, state, gtype in sorted(listed)
            if (not states or state.lower() in states) and (not types or gtype in types)
            and (see_all or ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, gid))
        ]
        return ListGroupsResponse(error_code=ErrorCode.NONE, groups=groups)


def register(table: ApiTable, services: ShareGroupServices) -> ShareGroupApis:
    h = ShareGroupApis(services)
    table.register(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1, h.share_group_heartbeat)
    table.register(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1, h.share_group_describe)
    table.register(ApiKey.LIST_GROUPS, 0, 5, h.list_groups)
    return h
