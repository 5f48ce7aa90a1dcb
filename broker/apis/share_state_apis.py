"""The five share-group-state RPCs (83-87): how other brokers' persisters reach this broker's share coordinator.

They are inter-broker APIs, so callers need CLUSTER_ACTION on the cluster; the work itself is the
share coordinator's (`ShareStateServices.share_coordinator`, set up by the broker at start-up).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.coordinator.share_coordinator import ShareCoordinator
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
    from shoal.broker.apis.services import ApiTable, ShareStateServices
    from shoal.broker.network.connection import RequestContext

# The request of one of the five RPCs; each names its partitions the same way.
_RequestT = TypeVar("_RequestT", bound=StateRequest[StatePartition])


def _handler(
    services: ShareStateServices, response_cls: type[StateResponseT],
    method: Callable[[ShareCoordinator, _RequestT], Awaitable[StateResponseT]],
) -> Callable[[RequestContext, _RequestT], Awaitable[StateResponseT]]:
    async def handle(ctx: RequestContext, req: _RequestT) -> StateResponseT:
        if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return error_response(response_cls, req, same_error(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
        coordinator = services.share_coordinator
        if coordinator is None:  # share groups disabled or coordinator not started
            return error_response(response_cls, req, same_error(req, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        return await method(coordinator, req)

    handle.__name__ = method.__name__
    return handle


def register(table: ApiTable, services: ShareStateServices) -> None:
    table.register(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, 0,
                    _handler(services, InitializeResponse, ShareCoordinator.initialize_state))
    table.register(ApiKey.READ_SHARE_GROUP_STATE, 0, 0,
                    _handler(services, ReadResponse, ShareCoordinator.read_state))
    table.register(ApiKey.WRITE_SHARE_GROUP_STATE, 0, 1,
                    _handler(services, WriteResponse, ShareCoordinator.write_state))
    table.register(ApiKey.DELETE_SHARE_GROUP_STATE, 0, 0,
                    _handler(services, DeleteResponse, ShareCoordinator.delete_state))
    table.register(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0, 1,
                    _handler(services, SummaryResponse, ShareCoordinator.read_state_summary))
