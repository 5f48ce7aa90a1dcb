"""What a client knows about the cluster: brokers, topics (name <-> id), partition leaders, coordinators,
and one connection per broker, reopened with exponential backoff."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import ZERO_UUID

from .backoff import exponential_backoff_ms
from .connection import BrokerConnection
from .errors import (
    KafkaConnectionError,
    KafkaError,
    UnknownTopicError,
    for_code,
)
from .security import ClientConfig

METADATA_VERSIONS = (1, 12)
BOOTSTRAP_NODE = -1
COORDINATOR_GROUP = 0


def parse_bootstrap(servers: str | Iterable[str]) -> list[tuple[str, int]]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep:
            raise ValueError(f"bootstrap server {item!r} needs host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("bootstrap_servers is empty")
    return out


@dataclass(slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    error_code: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: bytes
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    is_internal: bool = False


@dataclass(slots=True)
class _Backoff:
    failures: int = 0  # failed connects in a row
    next_attempt: float = 0.0


class Cluster:
    """Shared by the producer, share consumer and admin: metadata cache plus per-broker connections."""

    def __init__(self, bootstrap_servers: str | Iterable[str], config: ClientConfig):
        self.config = config
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.topic_names: dict[bytes, str] = {}
        self.controller_id = -1
        self.cluster_id: str | None = None
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task[BrokerConnection]] = {}
        self._backoff: dict[int, _Backoff] = {}
        self._metadata_lock = asyncio.Lock()
        self._metadata_at = 0.0
        self._closed = False

    # ---- connections -----------------------------------------------------------------------------

    async def connection(self, node_id: int) -> BrokerConnection:
        """An open connection to `node_id`, connecting (with backoff between failures) if needed."""
        if self._closed:
            raise KafkaConnectionError(None, "client is closed")
        conn = self._connections.get(node_id)
        if conn is not None and conn.connected:
            return conn
        task = self._connecting.get(node_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect_with_retry(node_id))
            self._connecting[node_id] = task
            task.add_done_callback(lambda _t: self._connecting.pop(node_id, None))
        return await asyncio.shield(task)

    async def _connect_with_retry(self, node_id: int) -> BrokerConnection:
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        last: KafkaError | None = None
        while True:
            addresses = [self.brokers[node_id]] if node_id in self.brokers else []
            if node_id == BOOTSTRAP_NODE or not addresses:
                if node_id != BOOTSTRAP_NODE:
                    raise KafkaConnectionError(None, f"broker {node_id} is not in the cluster metadata")
                addresses = list(self.bootstrap)
                random.shuffle(addresses)
            for host, port in addresses:
                state = self._backoff.setdefault(node_id, _Backoff())
                wait = state.next_attempt - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                setup_timeout_ms = exponential_backoff_ms(self.config.socket_connection_setup_timeout_ms,
                                                          self.config.socket_connection_setup_timeout_max_ms,
                                                          state.failures)
                try:
                    conn = await BrokerConnection(host, port, self.config, node_id=node_id).connect(setup_timeout_ms)
                except KafkaError as exc:
                    # Only connection-level failures are worth retrying; a refused SASL login is final.
                    if not isinstance(exc, KafkaConnectionError):
                        raise
                    last = exc
                    state.failures += 1
                    delay = exponential_backoff_ms(self.config.reconnect_backoff_ms,
                                                   self.config.reconnect_backoff_max_ms, state.failures - 1)
                    state.next_attempt = time.monotonic() + delay / 1000
                    continue
                state.failures = 0
                state.next_attempt = 0.0
                conn.on_close = self._forget
                self._connections[node_id] = conn
                return conn
            if time.monotonic() >= deadline:
                raise last or KafkaConnectionError(None, f"cannot connect to broker {node_id}")

    def _forget(self, conn: BrokerConnection) -> None:
        if self._connections.get(conn.node_id) is conn:
            del self._connections[conn.node_id]

    async def any_connection(self) -> BrokerConnection:
        """A connection to some broker: an open one if there is one, else a known broker, else bootstrap."""
        for conn in self._connections.values():
            if conn.connected:
                return conn
        # Brokers that failed their last connects go last: a dead one would hold each try for the request timeout.
        tried = sorted(random.sample(list(self.brokers), len(self.brokers)),
                       key=lambda n: self._backoff[n].failures if n in self._backoff else 0)
        for node_id in tried:
            with contextlib.suppress(KafkaConnectionError):
                return await self.connection(node_id)
        return await self.connection(BOOTSTRAP_NODE)

    async def request(
        self, node_id: int, api_key: int, body: MessageBase, versions: tuple[int, int], **kw: Any
    ) -> Any:
        conn = await self.connection(node_id)
        return await conn.request(api_key, body, versions=versions, **kw)

    # ---- metadata --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh_metadata()

    async def refresh_metadata(self, topics: Iterable[str] | None = None, *, allow_auto_create: bool = False) -> None:
        """Fetch metadata for `topics` (None = all topics) and merge it into the cache."""
        names = None if topics is None else sorted(set(topics))
        async with self._metadata_lock:
            conn = await self.any_connection()
            version = conn.pick_version(ApiKey.METADATA, *METADATA_VERSIONS)
            req_topics = None
            if names is not None:
                req_topics = [messages.MetadataRequest.MetadataRequestTopic(name=n) for n in names]
            body = messages.MetadataRequest(topics=req_topics, allow_auto_topic_creation=allow_auto_create)
            response = await conn.request(ApiKey.METADATA, body, version=version)
            self._apply_metadata(response, full=names is None)

    def _apply_metadata(self, response: Any, *, full: bool) -> None:
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        self.controller_id = response.controller_id if response.controller_id is not None else -1
        self.cluster_id = response.cluster_id
        if full:
            self.topics.clear()
            self.topic_names.clear()
        for t in response.topics:
            if t.error_code and t.error_code != ErrorCode.LEADER_NOT_AVAILABLE:
                old = self.topics.pop(t.name, None)
                if old is not None:
                    self.topic_names.pop(old.topic_id, None)
                continue
            tid = t.topic_id or ZERO_UUID
            info = TopicInfo(t.name, tid, is_internal=bool(t.is_internal))
            for p in t.partitions:
                epoch = p.leader_epoch if p.leader_epoch is not None else -1
                info.partitions[p.partition_index] = PartitionInfo(p.partition_index, p.leader_id, epoch, p.error_code)
            self.topics[t.name] = info
            if tid != ZERO_UUID:
                self.topic_names[tid] = t.name
        self._metadata_at = time.monotonic()

    async def topic(self, name: str, *, allow_auto_create: bool = False) -> TopicInfo:
        """Topic metadata, fetched if missing or stale; raises UnknownTopicError if the broker has none."""
        info = self.topics.get(name)
        stale = time.monotonic() - self._metadata_at > self.config.metadata_max_age_ms / 1000
        if info is None or stale or not info.partitions:
            await self.refresh_metadata([name], allow_auto_create=allow_auto_create)
            info = self.topics.get(name)
        if info is None or not info.partitions:
            raise UnknownTopicError(None, f"topic {name!r} does not exist")
        return info

    async def topic_name(self, topic_id: bytes) -> str | None:
        name = self.topic_names.get(topic_id)
        if name is None:
            await self.refresh_metadata()
            name = self.topic_names.get(topic_id)
        return name

    def leader(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        if info is None or partition not in info.partitions:
            return -1
        return info.partitions[partition].leader

    # ---- coordinators ----------------------------------------------------------------------------

    async def find_coordinator(self, key: str, key_type: int = COORDINATOR_GROUP) -> int:
        """The node id of the coordinator for `key`, retrying while it is loading or not yet known."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        delay = self.config.reconnect_backoff_ms / 1000
        while True:
            conn = await self.any_connection()
            version = conn.pick_version(ApiKey.FIND_COORDINATOR, 1, 6)
            if version >= 4:  # batched form (KIP-699)
                body = messages.FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key])
                response = await conn.request(ApiKey.FIND_COORDINATOR, body, version=version)
                c = response.coordinators[0]
                code, msg, node, host, port = c.error_code, c.error_message, c.node_id, c.host, c.port
            else:
                body = messages.FindCoordinatorRequest(key=key, key_type=key_type)
                response = await conn.request(ApiKey.FIND_COORDINATOR, body, version=version)
                code, msg = response.error_code, response.error_message
                node, host, port = response.node_id, response.host, response.port
            if code == 0:
                if node not in self.brokers or self.brokers[node] != (host, port):
                    self.brokers[node] = (host, port)
                return int(node)
            error = for_code(code, msg)
            if not error.retriable or time.monotonic() >= deadline:
                raise error
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)

    # ---- shutdown --------------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        conns, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
