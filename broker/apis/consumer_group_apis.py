"""ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848): the client-facing side of the consumer-group
coordinator. Authorization happens here, as in Kafka's request layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.apis.share_group_apis import invalid_topic_names
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.coordinator.consumer_coordinator import ConsumerGroupCoordinator
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ConsumerGroupServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.consumer_group_apis")

HeartbeatResponse = messages.ConsumerGroupHeartbeatResponse
DescribeResponse = messages.ConsumerGroupDescribeResponse
DescribedGroup = DescribeResponse.DescribedGroup
# Operations Kafka reports for a GROUP resource (AclEntry.supportedOperations).
GROUP_OPERATIONS = (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS,
                    Operation.ALTER_CONFIGS)


class ConsumerGroupApis:
    def __init__(self, services: ConsumerGroupServices):
        self.services = services

    @property
    def coordinator(self) -> ConsumerGroupCoordinator | None:
        return self.services.consumer_groups

    async def heartbeat(self, ctx: RequestContext, req: messages.ConsumerGroupHeartbeatRequest) -> messages.ConsumerGroupHeartbeatResponse:
        invalid = invalid_topic_names(req.subscribed_topic_names)
        if invalid is not None:
            log.warning("invalid consumer group heartbeat", group=req.group_id, reason=invalid)
            return HeartbeatResponse(error_code=ErrorCode.INVALID_REQUEST, error_message=invalid)
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        for name in set(req.subscribed_topic_names or ()):
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
                return HeartbeatResponse(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        coordinator = self.coordinator
        if coordinator is None:
            return HeartbeatResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return await coordinator.heartbeat(req, ctx.api_version, ctx.header.client_id or "",
                                           "/" + ctx.connection.client_host)

    def describe(self, ctx: RequestContext, req: messages.ConsumerGroupDescribeRequest) -> messages.ConsumerGroupDescribeResponse:
        coordinator = self.coordinator
        out = []
        for group_id in req.group_ids:
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                          members=[]))
            elif not group_id:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.INVALID_GROUP_ID, members=[]))
            elif coordinator is None:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                          members=[]))
            elif not coordinator.loaded:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                          members=[]))
            elif coordinator.groups.held_by_other_type(group_id):
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                                          error_message=f"Group {group_id} is not a consumer group.", members=[]))
            else:
                out.append(self._restrict(ctx, coordinator.describe(group_id), req.include_authorized_operations))
        return DescribeResponse(groups=out)

    @staticmethod
    def _restrict(ctx: RequestContext, group: DescribedGroup, include_operations: bool) -> DescribedGroup:
        if group.error_code != ErrorCode.NONE:
            return group
        topics = {tp.topic_name for m in group.members for a in (m.assignment, m.target_assignment)
                  for tp in a.topic_partitions}
        if any(not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t) for t in topics):
            return DescribedGroup(
                group_id=group.group_id, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, members=[],
                error_message="The group has described topic(s) that the client is not authorized to describe.")
        if include_operations:
            group.authorized_operations = sum(
                1 << op for op in GROUP_OPERATIONS if ctx.authorize(op, ResourceType.GROUP, group.group_id))
        return group


def register(table: ApiTable, services: ConsumerGroupServices) -> ConsumerGroupApis:
    h = ConsumerGroupApis(services)
    table.register(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, h.heartbeat)
    table.register(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, h.describe)
    return h
