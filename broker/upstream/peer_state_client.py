"""The share-group-state RPCs sent to the sidecar instance that owns the state partition of their key, as
Kafka's share-partition leaders send them to the share coordinator of the key: this process's own share
coordinator when it serves the partition, another instance over the wire when that one owns it.

The default persister sends one key per request, so the request's first key names its state partition.
A request for a partition nobody serves yet (a rebalance is under way) fails as unreachable, which the
persister answers with COORDINATOR_NOT_AVAILABLE and the share-partition leader retries.

The requests between sidecars are inter-broker traffic, configured with Kafka's keys for it:
`inter.broker.listener.name` (or `security.inter.broker.protocol`, naming a listener after its protocol)
picks the peer's advertised listener, whose security protocol and this instance's own settings for that
listener give what the client side presents: `sasl.mechanism.inter.broker.protocol` with the username and
password of the listener's JAAS line for it, the listener's truststore to check the peer's certificate and
its keystore as the client certificate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from shoal.broker.common.config import ConfigError
from shoal.broker.security.sasl import parse_jaas
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

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig, Listener

log = structlog.get_logger("shoal.sidecar.state_rpcs")

_R = TypeVar("_R")
# (group id, topic id, partition) -> the state-topic partition holding that key.
StateUnit = Callable[[str, bytes, int], Unit]


class PeerUnavailable(ConnectionError):
    """The owning instance is unknown, or could not be reached or did not answer."""


_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class InterBrokerSettings:
    """Which of a peer's listeners to reach it on, and the client settings for it."""

    listener: str
    client: ClientConfig
    # Nothing was configured: a peer without a listener of that name is reached on its first one.
    any_listener: bool = False


def inter_broker_settings(config: BrokerConfig, client_id: str = "shoal-sidecar-peer") -> InterBrokerSettings:
    """The inter-broker settings from the broker's keys; ConfigError names what is wrong. Without any of
    the keys, the listener named PLAINTEXT (Kafka's default), else the first, with that listener's own
    security settings."""
    by_name = {lst.name: lst for lst in config.listeners()}
    name_key, protocol_key = "inter.broker.listener.name", "security.inter.broker.protocol"
    named = str(config[name_key]).strip().upper() if name_key in config.explicit else ""
    by_protocol = protocol_key in config.explicit
    if named and by_protocol:
        raise ConfigError(f"Only one of {name_key} and {protocol_key} may be set")
    chosen = named or str(config[protocol_key]).strip().upper()
    listener = by_name.get(chosen)
    any_listener = False
    if listener is None:
        if named or by_protocol:
            raise ConfigError(f"the inter-broker listener {chosen} is not one of listeners "
                              f"({', '.join(sorted(by_name))})")
        listener, any_listener = next(iter(by_name.values())), True
    try:
        client = _client_settings(config, listener, client_id)
    except ConfigError as exc:
        if named or by_protocol:
            raise
        # Nothing asked for it: a start-up as before, the requests to other sidecars then fail (logged).
        log.warning("no inter-broker client settings for the requests to other sidecars; set "
                    "inter.broker.listener.name and sasl.mechanism.inter.broker.protocol", reason=str(exc))
        client = {"client.id": client_id}
    return InterBrokerSettings(listener.name, ClientConfig.from_dict(client), any_listener)


def _client_settings(config: BrokerConfig, listener: Listener, client_id: str) -> dict[str, Any]:
    protocol = listener.security_protocol
    client: dict[str, Any] = {"client.id": client_id, "security.protocol": protocol}
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = str(config["sasl.mechanism.inter.broker.protocol"]).strip().upper()
        if mechanism not in _SASL_MECHANISMS:
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol must be one of {', '.join(_SASL_MECHANISMS)} "
                              f"for the SASL inter-broker listener {listener.name}, not {mechanism}")
        try:
            _module, options = parse_jaas(config.jaas_config(listener.name, mechanism))
        except ValueError as exc:
            raise ConfigError(f"listener {listener.name}: {exc}") from exc
        if "username" not in options or "password" not in options:
            raise ConfigError(f"the {mechanism} JAAS config of listener {listener.name} needs username=\"...\" and "
                              "password=\"...\" for the inter-broker client")
        client |= {"sasl.mechanism": mechanism, "sasl.username": options["username"],
                   "sasl.password": options["password"]}
    if protocol in ("SSL", "SASL_SSL"):
        def setting(key: str) -> str:
            return str(config.for_listener(listener.name, key) or "")

        if setting("ssl.truststore.certificates") or setting("ssl.keystore.certificate.chain"):
            raise ConfigError(f"listener {listener.name}: the inter-broker client reads its certificates from "
                              "files: set ssl.truststore.location and ssl.keystore.location for it")
        client["ssl.endpoint.identification.algorithm"] = setting("ssl.endpoint.identification.algorithm")
        if setting("ssl.truststore.location"):
            client["ssl.ca.location"] = setting("ssl.truststore.location")
        if setting("ssl.keystore.location"):  # PEM: the chain and the key in one file
            client["ssl.certificate.location"] = client["ssl.key.location"] = setting("ssl.keystore.location")
            if setting("ssl.key.password"):
                client["ssl.key.password"] = setting("ssl.key.password")
    return client


class PeerShareCoordinatorClient:
    def __init__(self, local: ShareCoordinatorClient, ownership: Ownership, state_unit: StateUnit,
                 settings: InterBrokerSettings | None = None):
        self.local = local
        self.ownership = ownership
        self.state_unit = state_unit
        self.settings = settings or InterBrokerSettings(
            "PLAINTEXT", ClientConfig.from_dict({"client.id": "shoal-sidecar-peer"}), any_listener=True)
        self.config = self.settings.client
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
        endpoint = self.ownership.endpoint(node_id, self.settings.listener, any_listener=self.settings.any_listener)
        if endpoint is None:
            raise PeerUnavailable(f"no {self.settings.listener} listener for sidecar {node_id}")
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
