"""The share-group-state RPCs sent to the sidecar instance that owns the state partition of their key, as
Kafka's share-partition leaders send them to the share coordinator of the key: this process's own share
coordinator when it serves the partition, another instance over the wire when that one owns it.

The default persister sends one key per request, so the request's first key names its state partition.
A request for a partition nobody serves yet (a rebalance is under way) fails as unreachable, which the
persister answers with COORDINATOR_NOT_AVAILABLE and the share-partition leader retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from shoal.client.connection import BrokerConnection
from shoal.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from shoal.client.security import ClientConfig
from shoal.persister.default_persister import ShareCoordinatorClient
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import DecodeError
from shoal.protocol.share_state_rpcs import (
    DeleteRequest,
    DeleteResponse,
    InitializeRequest,
    InitializeResponse,
    ReadRequest,
    ReadResponse,
    StatePartition,
    StateRequest,
    SummaryRequest,
    SummaryResponse,
    WriteRequest,
    WriteResponse,
)

from .assignment import Unit
from .ownership import NO_OWNER, Ownership

log = structlog.get_logger("shoal.sidecar.state_rpcs")

_R = TypeVar("_R")
# (group id, topic id, partition) -> the state-topic partition holding that key.
StateUnit = Callable[[str, bytes, int], Unit]


class PeerUnavailable(ConnectionError):
    """The owning instance is unknown, or could not be reached or did not answer."""


class PeerShareCoordinatorClient:
    def __init__(self, local: ShareCoordinatorClient, ownership: Ownership, state_unit: StateUnit,
                 config: ClientConfig | None = None):
        self.local = local
        self.ownership = ownership
        self.state_unit = state_unit
        self.config = config or ClientConfig.from_dict({"client.id": "shoal-sidecar-peer"})
        self._conns: dict[tuple[int, str, int], BrokerConnection] = {}
        self._lock = asyncio.Lock()

    def _owner(self, request: StateRequest[StatePartition]) -> int:
        topic = request.topics[0]
        unit = self.state_unit(request.group_id, topic.topic_id, topic.partitions[0].partition)
        owner = self.ownership.owner(unit)
        if owner == self.ownership.node_id and not self.ownership.serves(unit):
            raise PeerUnavailable(f"state partition {unit} is being taken over")
        if owner == NO_OWNER:
            raise PeerUnavailable(f"state partition {unit} has no owner yet")
        return owner

    async def _send(self, node_id: int, api_key: int, request: Any, version: int) -> Any:
        # Its PLAINTEXT listener, else its first: this client speaks no TLS or SASL to other sidecars.
        endpoint = self.ownership.endpoint(node_id, "PLAINTEXT", any_listener=True)
        if endpoint is None:
            raise PeerUnavailable(f"no address for sidecar {node_id}")
        key = (node_id, endpoint.host, endpoint.port)
        try:
            async with self._lock:
                conn = self._conns.get(key)
                if conn is None or not conn.connected:
                    conn = await BrokerConnection(endpoint.host, endpoint.port, self.config, node_id=node_id).connect()
                    self._conns[key] = conn
            return await conn.request(api_key, request, version=min(version, conn.max_version(api_key)))
        except (KafkaConnectionError, KafkaTimeoutError, DecodeError, KafkaError, OSError) as exc:
            self._conns.pop(key, None)
            log.warning("share-state request to another sidecar failed", node_id=node_id, error=str(exc))
            raise PeerUnavailable(str(exc)) from exc

    async def _route(self, request: Any, version: int, api_key: int,
                     local: Callable[[], Any]) -> Any:
        owner = self._owner(request)
        if owner == self.ownership.node_id:
            return await local()
        return await self._send(owner, api_key, request, version)

    async def initialize_state(self, request: InitializeRequest, version: int) -> InitializeResponse:
        result: InitializeResponse = await self._route(
            request, version, ApiKey.INITIALIZE_SHARE_GROUP_STATE, lambda: self.local.initialize_state(request, version))
        return result

    async def read_state(self, request: ReadRequest, version: int) -> ReadResponse:
        result: ReadResponse = await self._route(
            request, version, ApiKey.READ_SHARE_GROUP_STATE, lambda: self.local.read_state(request, version))
        return result

    async def write_state(self, request: WriteRequest, version: int) -> WriteResponse:
        result: WriteResponse = await self._route(
            request, version, ApiKey.WRITE_SHARE_GROUP_STATE, lambda: self.local.write_state(request, version))
        return result

    async def delete_state(self, request: DeleteRequest, version: int) -> DeleteResponse:
        result: DeleteResponse = await self._route(
            request, version, ApiKey.DELETE_SHARE_GROUP_STATE, lambda: self.local.delete_state(request, version))
        return result

    async def read_state_summary(self, request: SummaryRequest, version: int) -> SummaryResponse:
        result: SummaryResponse = await self._route(
            request, version, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY,
            lambda: self.local.read_state_summary(request, version))
        return result

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
