"""The five share-group-state RPCs (83-87): how other brokers' persisters reach this broker's share coordinator.

They are inter-broker APIs, so callers need CLUSTER_ACTION on the cluster; the work itself is the
share coordinator's (`broker.share_coordinator`, set up by the broker at start-up).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
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
    from shoal.broker.apis.broker import Broker
    from shoal.broker.network.connection import RequestContext

def _handler(
    broker: Broker, response_cls: type[StateResponseT], method: str
) -> Callable[[RequestContext, Any], Awaitable[StateResponseT]]:
    async def handle(ctx: RequestContext, req: StateRequest[StatePartition]) -> StateResponseT:
        if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return error_response(response_cls, req, same_error(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
        coordinator = getattr(broker, "share_coordinator", None)
        if coordinator is None:  # share groups disabled or coordinator not started
            return error_response(response_cls, req, same_error(req, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        response: StateResponseT = await getattr(coordinator, method)(req)
        return response

    handle.__name__ = method
    return handle


def register(broker: Broker) -> None:
    broker.register(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, InitializeResponse, "initialize_state"))
    broker.register(ApiKey.READ_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, ReadResponse, "read_state"))
    broker.register(ApiKey.WRITE_SHARE_GROUP_STATE, 0, 1,
                    _handler(broker, WriteResponse, "write_state"))
    broker.register(ApiKey.DELETE_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, DeleteResponse, "delete_state"))
    broker.register(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0, 1,
                    _handler(broker, SummaryResponse, "read_state_summary"))
