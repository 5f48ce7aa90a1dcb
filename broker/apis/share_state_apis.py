"""The five share-group-state RPCs (83-87): how other brokers' persisters reach this broker's share coordinator.

They are inter-broker APIs, so callers need CLUSTER_ACTION on the cluster; the work itself is the
share coordinator's (`broker.share_coordinator`, set up by the broker at start-up).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker
    from shoal.broker.network.connection import RequestContext

# api key -> (response class, name of its per-topic result struct)
_RESPONSES: dict[int, tuple[Any, str]] = {
    ApiKey.INITIALIZE_SHARE_GROUP_STATE: (messages.InitializeShareGroupStateResponse, "InitializeStateResult"),
    ApiKey.READ_SHARE_GROUP_STATE: (messages.ReadShareGroupStateResponse, "ReadStateResult"),
    ApiKey.WRITE_SHARE_GROUP_STATE: (messages.WriteShareGroupStateResponse, "WriteStateResult"),
    ApiKey.DELETE_SHARE_GROUP_STATE: (messages.DeleteShareGroupStateResponse, "DeleteStateResult"),
    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY: (messages.ReadShareGroupStateSummaryResponse, "ReadStateSummaryResult"),
}


def error_response(api_key: int, req: Any, code: int, message: str | None = None) -> Any:
    """The response answering every partition of `req` with the same error."""
    cls, result_name = _RESPONSES[api_key]
    result_cls = getattr(cls, result_name)
    part_cls = cls.PartitionResult
    return cls(results=[
        result_cls(topic_id=t.topic_id, partitions=[
            part_cls(partition=p.partition, error_code=code, error_message=message) for p in t.partitions
        ])
        for t in req.topics
    ])


def _handler(broker: Broker, api_key: int, method: str) -> Callable[[RequestContext, Any], Awaitable[Any]]:
    async def handle(ctx: RequestContext, req: Any) -> Any:
        if not ctx.authorize(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return error_response(api_key, req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        coordinator = getattr(broker, "share_coordinator", None)
        if coordinator is None:  # share groups disabled or coordinator not started
            return error_response(api_key, req, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return await getattr(coordinator, method)(req)

    handle.__name__ = method
    return handle


def register(broker: Broker) -> None:
    broker.register(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, ApiKey.INITIALIZE_SHARE_GROUP_STATE, "initialize_state"))
    broker.register(ApiKey.READ_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, ApiKey.READ_SHARE_GROUP_STATE, "read_state"))
    broker.register(ApiKey.WRITE_SHARE_GROUP_STATE, 0, 1,
                    _handler(broker, ApiKey.WRITE_SHARE_GROUP_STATE, "write_state"))
    broker.register(ApiKey.DELETE_SHARE_GROUP_STATE, 0, 0,
                    _handler(broker, ApiKey.DELETE_SHARE_GROUP_STATE, "delete_state"))
    broker.register(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0, 1,
                    _handler(broker, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, "read_state_summary"))
