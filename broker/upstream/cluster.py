"""What Shoal knows of the upstream cluster: its brokers, each partition's leader and leader epoch, topic
ids, the coordinator of each group and transactional id, and the connections to its brokers.

Connections are kept per (broker, lane). A Kafka broker answers one request of a connection at a time, so
a long-polling Fetch would hold up everything queued behind it on a shared connection: each client
connection's fetches get a lane of their own (closed with it); everything else shares the default lane.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from shoal.broker.storage.partition_source import SourceUnavailable
from shoal.client.backoff import exponential_backoff_ms
from shoal.client.connection import BrokerConnection
from shoal.client.errors import AuthenticationError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import DecodeError, MessageBase
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import ZERO_UUID

from .metrics import UpstreamMetrics
from .settings import UpstreamSettings

log = structlog.get_logger("shoal.upstream")

BOOTSTRAP = -1
SHARED_LANE = "shared"
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
# Errors after which the upstream's partition leadership is re-read (KIP-320 and the leader moving).
LEADERSHIP_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
    ErrorCode.KAFKA_STORAGE_ERROR,
})
COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# Metadata re-reads asked for by errors or unknown names start at most this often (the client's
# retry.backoff.ms); a name still unknown after a re-read is asked about again only after a backoff that
# doubles up to the last figure, so clients naming topics that do not exist cannot keep Shoal re-reading.
MIN_REFRESH_GAP_S = 0.1
UNKNOWN_TOPIC_BACKOFF_S = (0.1, 5.0)
_UNKNOWN_TOPICS_KEPT = 10_000


class UpstreamUnavailable(SourceUnavailable):
    """The upstream could not be reached or did not answer; `timed_out` tells a timeout from a refusal."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class UpstreamUnsupported(UpstreamUnavailable):
    """The upstream broker does not serve the API at all (not in its ApiVersions): no retry makes it work."""


class UpstreamStartError(Exception):
    """Shoal cannot start in sidecar mode: the upstream is unreachable or refused the credentials."""


class Lane:
    """Upstream connections of their own for one client connection's requests (its fetches)."""

    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False


@dataclass(frozen=True, slots=True)
class Leadership:
    leader: int
    leader_epoch: int


class UpstreamCluster:
    def __init__(self, settings: UpstreamSettings, metrics: UpstreamMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or UpstreamMetrics()
        self.config = settings.client
        self.brokers: dict[int, tuple[str, int]] = {}
        self.cluster_id: str | None = None
        self.leaders: dict[tuple[str, int], Leadership] = {}
        self.topic_names: dict[bytes, str] = {}
        self.topic_ids: dict[str, bytes] = {}
        self.partition_counts: dict[str, int] = {}
        self._conns: dict[tuple[int, Hashable], BrokerConnection] = {}
        self._connecting: dict[tuple[int, Hashable], asyncio.Task[BrokerConnection]] = {}
        self._coordinators: dict[tuple[int, str], int] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._last_refresh = -MIN_REFRESH_GAP_S
        # Per topic name (or id) still unknown after a re-read: (when it may cause another, the backoff).
        self._unknown: dict[str | bytes, tuple[float, float]] = {}
        # Called when a metadata answer changed the topics (created, deleted, partitions added).
        self.topic_listeners: list[Callable[[], None]] = []
        self._closed = False

    # ---- start-up ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, authenticate and read the upstream's metadata, or raise UpstreamStartError saying why."""
        where = self.settings.bootstrap_text
        try:
            await self.refresh_metadata()
        except AuthenticationError as exc:
            # A refused SASL login, or a TLS handshake that failed (an untrusted certificate either way round).
            raise UpstreamStartError(f"authentication with upstream {where} failed: {exc}") from exc
        except UpstreamUnavailable as exc:
            raise UpstreamStartError(f"upstream {where} is unreachable: {exc}") from exc
        except KafkaError as exc:
            raise UpstreamStartError(f"upstream {where} failed: {exc}") from exc
        log.info("upstream connected", bootstrap=where, cluster_id=self.cluster_id, brokers=sorted(self.brokers),
                 topics=len({name for name, _ in self.leaders}))

    # ---- connections ---------------------------------------------------------------------------

    async def connection(self, node_id: int, lane: Hashable = SHARED_LANE) -> BrokerConnection:
        if self._closed:
            raise UpstreamUnavailable("upstream client is closed")
        key = (node_id, lane)
        conn = self._conns.get(key)
        if conn is not None and conn.connected:
            return conn
        task = self._connecting.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(node_id))
            self._connecting[key] = task
            task.add_done_callback(lambda _t: self._connecting.pop(key, None))
        conn = await asyncio.shield(task)
        self._conns[key] = conn
        return conn

    async def _connect(self, node_id: int) -> BrokerConnection:
        """Try the broker's address (or every bootstrap address) until the request timeout; a refused
        login is final at once."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        delay = self.config.reconnect_backoff_ms / 1000
        last = ""
        failures = 0  # in a row: each doubles the next connect's setup timeout, as in Kafka's clients
        while True:
            if node_id == BOOTSTRAP or node_id not in self.brokers:
                addresses = random.sample(self.settings.bootstrap, len(self.settings.bootstrap))
            else:
                addresses = [self.brokers[node_id]]
            for host, port in addresses:
                setup_timeout_ms = exponential_backoff_ms(self.config.socket_connection_setup_timeout_ms,
                                                          self.config.socket_connection_setup_timeout_max_ms,
                                                          failures)
                try:
                    return await BrokerConnection(host, port, self.config, node_id=node_id).connect(setup_timeout_ms)
                except KafkaConnectionError as exc:
                    last = str(exc)
                except (KafkaTimeoutError, DecodeError) as exc:
                    last = f"{host}:{port}: {exc}"
                failures += 1
            if time.monotonic() + delay >= deadline:
                raise UpstreamUnavailable(last or f"cannot connect to upstream broker {node_id}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)

    def close_lane(self, lane: Hashable) -> None:
        """Close the connections of a lane whose client connection went away."""
        if isinstance(lane, Lane):
            lane.closed = True
        for key in [k for k in self._conns if k[1] == lane]:
            conn = self._conns.pop(key)
            asyncio.get_running_loop().create_task(conn.close())

    async def close(self) -> None:
        self._closed = True
        if self._refresh is not None:
            self._refresh.cancel()
        for task in list(self._connecting.values()):
            task.cancel()
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # ---- requests -----------------------------------------------------------------------------

    @staticmethod
    def version_for(conn: BrokerConnection, api_key: int, wanted: int) -> int:
        """The version to send: the client's own when the upstream speaks it, else the nearest it does.
        The codec carries every field both versions share; the records stay bytes either way."""
        rng = conn.api_versions.get(api_key)
        if rng is None:
            raise UpstreamUnsupported(f"upstream broker {conn.node_id} does not serve {messages.API_NAMES.get(api_key)}")
        spec = messages.REQUESTS[api_key].spec.valid
        lo = max(rng[0], spec.low)
        hi = rng[1] if spec.high is None else min(rng[1], spec.high)
        return min(max(wanted, lo), hi)

    async def send(self, node_id: int, api_key: int, body: MessageBase, wanted_version: int, *,
                   lane: Hashable = SHARED_LANE, expect_response: bool = True,
                   timeout_ms: int | None = None) -> Any:
        labels = {"api": messages.API_NAMES.get(api_key, str(api_key)), "broker": str(node_id)}
        started = time.monotonic()
        try:
            conn = await self.connection(node_id, lane)
            version = self.version_for(conn, api_key, wanted_version)
            response = await conn.request(api_key, body, version=version, expect_response=expect_response,
                                          timeout_ms=timeout_ms)
        except KafkaTimeoutError as exc:
            self.metrics.request_failures.labels(**labels).inc()
            raise UpstreamUnavailable(str(exc), timed_out=True) from exc
        except (KafkaConnectionError, DecodeError, UpstreamUnavailable) as exc:
            self.metrics.request_failures.labels(**labels).inc()
            if isinstance(exc, UpstreamUnavailable):
                raise
            raise UpstreamUnavailable(str(exc)) from exc
        self.metrics.request_latency.labels(**labels).observe(time.monotonic() - started)
        self.metrics.observe_response(labels["api"], response)
        return response

    def unserved(self, api_keys: Iterable[int]) -> list[int]:
        """The APIs among `api_keys` that no upstream broker connected so far serves (none lists it in its
        ApiVersions); empty before any connection."""
        conns = [c for (_node, lane), c in self._conns.items() if lane == SHARED_LANE and c.connected]
        return [key for key in api_keys if conns and all(key not in c.api_versions for c in conns)]

    async def any_node(self) -> int:
        """A broker to send cluster-wide requests to (any broker forwards to the controller)."""
        if not self.brokers:
            return BOOTSTRAP
        connected = [node for (node, lane), c in self._conns.items() if lane == SHARED_LANE and c.connected
                     and node in self.brokers]
        return connected[0] if connected else random.choice(list(self.brokers))

    # ---- metadata -----------------------------------------------------------------------------

    async def metadata(self, body: messages.MetadataRequest, version: int) -> messages.MetadataResponse:
        """Forward a Metadata request and learn from its answer."""
        node = await self.any_node()
        response: messages.MetadataResponse = await self.send(node, ApiKey.METADATA, body, version)
        self._apply(response, full=body.topics is None)
        return response

    async def refresh_metadata(self, topics: Iterable[str] | None = None) -> None:
        names = None if topics is None else sorted(set(topics))
        req_topics = None if names is None else [messages.MetadataRequest.MetadataRequestTopic(name=n) for n in names]
        await self.metadata(messages.MetadataRequest(topics=req_topics, allow_auto_topic_creation=False), 12)

    def request_refresh(self) -> None:
        """Re-read the metadata in the background (coalesced, and at most every MIN_REFRESH_GAP_S): a leader
        moved or a topic changed."""
        if self._refresh is None or self._refresh.done():
            self.metrics.metadata_refreshes.inc()
            self._refresh = asyncio.get_running_loop().create_task(self._background_refresh())

    async def _background_refresh(self) -> None:
        gap = self._last_refresh + MIN_REFRESH_GAP_S - time.monotonic()
        if gap > 0:
            await asyncio.sleep(gap)
        try:
            await self.refresh_metadata()
        except Exception as exc:  # the next error asks again
            log.warning("upstream metadata refresh failed", error=str(exc))
        finally:
            self._last_refresh = time.monotonic()

    async def learn_topics(self, names: Iterable[str]) -> None:
        """Re-read the metadata at once when some of `names` is not known (joining a refresh already under
        way), so a topic created on the upstream is seen by the request that names it. A name that stays
        unknown backs off (UNKNOWN_TOPIC_BACKOFF_S) before it can cause another re-read."""
        now = time.monotonic()
        unknown = [n for n in names if n not in self.topic_ids]
        due = [n for n in unknown if self._unknown.get(n, (0.0, 0.0))[0] <= now]
        if not due:
            return
        # A re-read already under way may have started before the topic was created: then one more.
        for _ in range(2):
            joined = self._refresh is not None and not self._refresh.done()
            self.request_refresh()
            refresh = self._refresh
            if refresh is not None:
                await asyncio.shield(refresh)
            if not joined or all(n in self.topic_ids for n in due):
                break
        for name in due:
            if name in self.topic_ids:
                self._unknown.pop(name, None)
            else:
                self._back_off(name)

    def request_refresh_for(self, topic: str | bytes) -> None:
        """A request named a topic (by name or id) the metadata lacks: re-read it in the background, unless
        that name or id caused a re-read within its backoff (UNKNOWN_TOPIC_BACKOFF_S, doubling)."""
        if self._unknown.get(topic, (0.0, 0.0))[0] > time.monotonic():
            return
        self._back_off(topic)
        self.request_refresh()

    def _back_off(self, topic: str | bytes) -> None:
        if len(self._unknown) > _UNKNOWN_TOPICS_KEPT:
            self._unknown.clear()
        first, most = UNKNOWN_TOPIC_BACKOFF_S
        backoff = min(most, self._unknown.get(topic, (0.0, first / 2))[1] * 2)
        self._unknown[topic] = (time.monotonic() + backoff, backoff)

    def _apply(self, response: messages.MetadataResponse, *, full: bool) -> None:
        if full:
            before = (dict(self.topic_ids), dict(self.partition_counts))
            self._apply_answer(response, full=True)
            changed = before != (self.topic_ids, self.partition_counts)
        else:  # only the topics it names, so a client's Metadata for a few topics costs no full comparison
            changed = any(self._changes(topic) for topic in response.topics)
            self._apply_answer(response, full=False)
        if changed:
            for listener in self.topic_listeners:
                listener()

    def _changes(self, topic: messages.MetadataResponse.MetadataResponseTopic) -> bool:
        """Whether the answer's topic is new here, or has another id or partition count."""
        if topic.error_code not in (ErrorCode.NONE, ErrorCode.LEADER_NOT_AVAILABLE) or topic.name is None:
            return False
        new_id = topic.topic_id and topic.topic_id != ZERO_UUID and self.topic_ids.get(topic.name) != topic.topic_id
        return bool(new_id) or self.partition_counts.get(topic.name) != len(topic.partitions)

    def _apply_answer(self, response: messages.MetadataResponse, *, full: bool) -> None:
        if response.brokers:
            self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        if response.cluster_id is not None:
            self.cluster_id = response.cluster_id
        if full:
            self.leaders.clear()
            self.topic_names.clear()
            self.topic_ids.clear()
            self.partition_counts.clear()
        for topic in response.topics:
            if topic.error_code not in (ErrorCode.NONE, ErrorCode.LEADER_NOT_AVAILABLE) or topic.name is None:
                continue
            for key in [k for k in self.leaders if k[0] == topic.name]:
                del self.leaders[key]
            if topic.topic_id and topic.topic_id != ZERO_UUID:
                old = self.topic_ids.get(topic.name)
                if old is not None and old != topic.topic_id:
                    self.topic_names.pop(old, None)  # the topic was deleted and created again
                self.topic_names[topic.topic_id] = topic.name
                self.topic_ids[topic.name] = topic.topic_id
            self.partition_counts[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                epoch = p.leader_epoch if p.leader_epoch is not None else -1
                self.leaders[(topic.name, p.partition_index)] = Leadership(p.leader_id, epoch)

    def leader(self, topic: str | None, partition: int) -> int:
        if topic is None:
            return -1
        found = self.leaders.get((topic, partition))
        return -1 if found is None or found.leader < 0 else found.leader

    def topic_name(self, name: str | None, topic_id: bytes | None) -> str | None:
        if name:
            return name
        if topic_id and topic_id != ZERO_UUID:
            return self.topic_names.get(topic_id)
        return None

    # ---- coordinators -------------------------------------------------------------------------

    async def coordinator(self, key_type: int, key: str) -> int:
        """The upstream broker coordinating a group or transactional id (asked once, then cached)."""
        cached = self._coordinators.get((key_type, key))
        if cached is not None and cached in self.brokers:
            return cached
        node = await self.any_node()
        conn = await self.connection(node)
        version = self.version_for(conn, ApiKey.FIND_COORDINATOR, 6)
        if version >= 4:
            body = messages.FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key])
            response = await self.send(node, ApiKey.FIND_COORDINATOR, body, version)
            c = response.coordinators[0]
            code, node_id, host, port = c.error_code, c.node_id, c.host, c.port
        else:
            body = messages.FindCoordinatorRequest(key=key, key_type=key_type)
            response = await self.send(node, ApiKey.FIND_COORDINATOR, body, version)
            code, node_id, host, port = response.error_code, response.node_id, response.host, response.port
        if code != ErrorCode.NONE:
            raise CoordinatorLookupFailed(code)
        self.brokers.setdefault(node_id, (host, port))
        self._coordinators[(key_type, key)] = node_id
        return int(node_id)

    def forget_coordinator(self, key_type: int, key: str) -> None:
        self._coordinators.pop((key_type, key), None)


class CoordinatorLookupFailed(Exception):
    """The upstream's FindCoordinator answered an error; the client gets that code for its request."""

    def __init__(self, error_code: int):
        super().__init__(f"upstream FindCoordinator error {error_code}")
        self.error_code = error_code
