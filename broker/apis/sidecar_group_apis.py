"""Several sidecars: the answers that name an owner and the requests only the owner serves.

FindCoordinator names the sidecar owning the key's state partition (a group id's `__consumer_offsets`
partition, a share key's `__share_group_state` partition), DescribeCluster every sidecar of the group.
ShareGroupHeartbeat, ShareGroupDescribe and the share-group offset APIs of a group whose partition another
sidecar owns answer NOT_COORDINATOR, and so do the share-state RPCs for a state partition this one does not serve, as Kafka's
coordinators answer for a partition they do not own; the client looks the coordinator up again.
Each handler starts from the standalone one, registered before.
"""

from __future__ import annotations

import base64
import binascii
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.upstream.assignment import Unit
from shoal.broker.upstream.ownership import NO_OWNER
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.share_state_rpcs import (
    DeleteResponse,
    InitializeResponse,
    ReadResponse,
    StatePartition,
    StateRequest,
    StateResponseT,
    SummaryResponse,
    WriteResponse,
    error_response,
    same_error,
)

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, SidecarGroupServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.sidecar.group_apis")

_KEY_TYPE_GROUP, _KEY_TYPE_SHARE = 0, 2
_R = TypeVar("_R")
_STATE_RPCS: dict[int, type[Any]] = {
    ApiKey.INITIALIZE_SHARE_GROUP_STATE: InitializeResponse,
    ApiKey.READ_SHARE_GROUP_STATE: ReadResponse,
    ApiKey.WRITE_SHARE_GROUP_STATE: WriteResponse,
    ApiKey.DELETE_SHARE_GROUP_STATE: DeleteResponse,
    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY: SummaryResponse,
}


def parse_share_key(key: str) -> tuple[str, bytes, int] | None:
    """A SHARE coordinator key, "group:topic-id:partition" (Kafka's SharePartitionKey text), or None."""
    parts = key.rsplit(":", 2)  # a group id may hold colons; a topic id's text and a number do not
    if len(parts) != 3 or not parts[0]:
        return None
    group, topic_text, partition_text = parts
    try:
        topic_id = base64.urlsafe_b64decode(topic_text + "==")
        partition = int(partition_text)
    except (binascii.Error, ValueError):
        return None
    if len(topic_id) != 16 or partition < 0:
        return None
    return group, topic_id, partition


class SidecarGroupHandlers:
    def __init__(self, services: SidecarGroupServices):
        self.services = services
        self.ownership = services.ownership

    async def _local(self, key: int, ctx: RequestContext, req: object, expected: type[_R]) -> _R:
        """The standalone handler's answer to the request."""
        answer = self.services.local_handlers[key](ctx, req)
        if inspect.isawaitable(answer):
            answer = await answer
        assert isinstance(answer, expected), answer
        return answer

    def _key_unit(self, key_type: int, key: str) -> Unit | None:
        if key_type == _KEY_TYPE_GROUP:
            return self.services.group_unit(key)
        if key_type == _KEY_TYPE_SHARE:
            parsed = parse_share_key(key)
            return None if parsed is None else self.services.state_unit(*parsed)
        return None  # transactional ids: the upstream's coordinators, forwarded by this sidecar

    async def find_coordinator(self, ctx: RequestContext, req: messages.FindCoordinatorRequest
                               ) -> messages.FindCoordinatorResponse:
        response = await self._local(ApiKey.FIND_COORDINATOR, ctx, req, messages.FindCoordinatorResponse)
        version = ctx.api_version
        key_type = req.key_type if version >= 1 else _KEY_TYPE_GROUP
        listener = ctx.connection.listener.name
        if version >= 4:
            for c in response.coordinators:
                if c.error_code == ErrorCode.NONE:
                    c.error_code, c.node_id, c.host, c.port = self._coordinator(key_type, c.key, listener)
                    c.error_message = None
            return response
        if response.error_code == ErrorCode.NONE:
            response.error_code, response.node_id, response.host, response.port = \
                self._coordinator(key_type, req.key, listener)
            response.error_message = None
        return response

    def _coordinator(self, key_type: int, key: str, listener: str) -> tuple[int, int, str, int]:
        """(error code, node id, host, port) of the sidecar coordinating `key`."""
        if key_type == _KEY_TYPE_SHARE and parse_share_key(key) is None:
            return ErrorCode.INVALID_REQUEST, -1, "", -1
        unit = self._key_unit(key_type, key)
        node = self.services.node_id if unit is None else self.ownership.owner(unit)
        endpoint = None if node == NO_OWNER else self.ownership.endpoint(node, listener)
        if endpoint is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
        return ErrorCode.NONE, node, endpoint.host, endpoint.port

    async def describe_cluster(self, ctx: RequestContext, req: messages.DescribeClusterRequest
                               ) -> messages.DescribeClusterResponse:
        response = await self._local(ApiKey.DESCRIBE_CLUSTER, ctx, req, messages.DescribeClusterResponse)
        if response.error_code != ErrorCode.NONE:
            return response
        broker = messages.DescribeClusterResponse.DescribeClusterBroker
        listener = ctx.connection.listener.name
        brokers = []
        for node in sorted(self.ownership.members()):
            endpoint = self.ownership.endpoint(node, listener)
            if endpoint is not None:
                brokers.append(broker(broker_id=node, host=endpoint.host, port=endpoint.port, rack=None,
                                      is_fenced=False))
        response.brokers = brokers  # the controller stays this sidecar (see upstream_apis.metadata)
        return response

    def _serves_group(self, group_id: str) -> bool:
        return self.ownership.serves(self.services.group_unit(group_id))

    async def share_group_heartbeat(self, ctx: RequestContext, req: messages.ShareGroupHeartbeatRequest
                                    ) -> messages.ShareGroupHeartbeatResponse:
        if req.group_id and ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id) \
                and not self._serves_group(req.group_id):
            return messages.ShareGroupHeartbeatResponse(
                error_code=ErrorCode.NOT_COORDINATOR, error_message="another sidecar coordinates this group",
                member_epoch=0, heartbeat_interval_ms=0)
        return await self._local(ApiKey.SHARE_GROUP_HEARTBEAT, ctx, req, messages.ShareGroupHeartbeatResponse)

    async def share_group_describe(self, ctx: RequestContext, req: messages.ShareGroupDescribeRequest
                                   ) -> messages.ShareGroupDescribeResponse:
        response = await self._local(ApiKey.SHARE_GROUP_DESCRIBE, ctx, req, messages.ShareGroupDescribeResponse)
        for group in response.groups:
            if group.error_code in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND) and group.group_id \
                    and not self._serves_group(group.group_id):
                group.error_code, group.error_message, group.members = ErrorCode.NOT_COORDINATOR, None, []
        return response

    async def describe_share_group_offsets(self, ctx: RequestContext, req: messages.DescribeShareGroupOffsetsRequest
                                          ) -> messages.DescribeShareGroupOffsetsResponse:
        response = await self._local(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, ctx, req,
                                     messages.DescribeShareGroupOffsetsResponse)
        for group in response.groups:
            if group.error_code in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND) and group.group_id \
                    and not self._serves_group(group.group_id):
                group.error_code, group.error_message, group.topics = ErrorCode.NOT_COORDINATOR, None, []
        return response

    def _elsewhere(self, ctx: RequestContext, group_id: str) -> bool:
        """A group the caller may see whose coordinator is another sidecar."""
        return bool(group_id) and ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id) \
            and not self._serves_group(group_id)

    async def alter_share_group_offsets(self, ctx: RequestContext, req: messages.AlterShareGroupOffsetsRequest
                                        ) -> messages.AlterShareGroupOffsetsResponse:
        if self._elsewhere(ctx, req.group_id):
            return messages.AlterShareGroupOffsetsResponse(error_code=ErrorCode.NOT_COORDINATOR, responses=[])
        return await self._local(ApiKey.ALTER_SHARE_GROUP_OFFSETS, ctx, req, messages.AlterShareGroupOffsetsResponse)

    async def delete_share_group_offsets(self, ctx: RequestContext, req: messages.DeleteShareGroupOffsetsRequest
                                         ) -> messages.DeleteShareGroupOffsetsResponse:
        if self._elsewhere(ctx, req.group_id):
            return messages.DeleteShareGroupOffsetsResponse(error_code=ErrorCode.NOT_COORDINATOR, responses=[])
        return await self._local(ApiKey.DELETE_SHARE_GROUP_OFFSETS, ctx, req, messages.DeleteShareGroupOffsetsResponse)

    def _state_rpc(self, key: int, response_cls: type[StateResponseT]
                   ) -> Callable[[RequestContext, StateRequest[StatePartition]], Awaitable[StateResponseT]]:
        async def handle(ctx: RequestContext, req: StateRequest[StatePartition]) -> StateResponseT:
            units = {self.services.state_unit(req.group_id, t.topic_id, p.partition)
                     for t in req.topics for p in t.partitions}
            if any(not self.ownership.serves(u) for u in units):
                return error_response(response_cls, req, same_error(req, ErrorCode.NOT_COORDINATOR))
            return await self._local(key, ctx, req, response_cls)

        return handle


def wrapped_keys() -> list[int]:
    """The APIs whose standalone handlers these start from."""
    return [ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.SHARE_GROUP_HEARTBEAT,
            ApiKey.SHARE_GROUP_DESCRIBE, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, ApiKey.ALTER_SHARE_GROUP_OFFSETS,
            ApiKey.DELETE_SHARE_GROUP_OFFSETS, *_STATE_RPCS]


def register(table: ApiTable, services: SidecarGroupServices, versions: dict[int, tuple[int, int]]) -> None:
    """`versions`: each wrapped API's range, as the standalone handler registered it."""
    h = SidecarGroupHandlers(services)
    own: dict[int, Callable[..., Any]] = {
        ApiKey.FIND_COORDINATOR: h.find_coordinator,
        ApiKey.DESCRIBE_CLUSTER: h.describe_cluster,
        ApiKey.SHARE_GROUP_HEARTBEAT: h.share_group_heartbeat,
        ApiKey.SHARE_GROUP_DESCRIBE: h.share_group_describe,
        ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: h.describe_share_group_offsets,
        ApiKey.ALTER_SHARE_GROUP_OFFSETS: h.alter_share_group_offsets,
        ApiKey.DELETE_SHARE_GROUP_OFFSETS: h.delete_share_group_offsets,
    }
    for key, cls in _STATE_RPCS.items():
        own[key] = h._state_rpc(key, cls)
    for key, handler in own.items():
        if key in services.local_handlers:
            low, high = versions[key]
            table.register(key, low, high, handler)
