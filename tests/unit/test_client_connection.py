"""BrokerConnection and Cluster against a scripted in-process server speaking the Kafka framing."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.client.backoff import exponential_backoff_ms
from shoal.client.cluster import Cluster, parse_bootstrap
from shoal.client.connection import BrokerConnection
from shoal.client.errors import KafkaConnectionError, UnsupportedVersionError
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

Reply = Callable[[messages.RequestHeader, Any], Awaitable[bytes | None]]
API_RANGES = {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (0, 12), ApiKey.LIST_GROUPS: (0, 5)}


def _api_versions_body(error: int = 0) -> Any:
    entry = messages.ApiVersionsResponse.ApiVersion  # type: ignore[attr-defined]
    return messages.ApiVersionsResponse(
        error_code=error, api_keys=[entry(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in API_RANGES.items()]
    )


class ScriptedBroker:
    """Answers ApiVersions itself and hands every other request to `reply`."""

    def __init__(self, reply: Reply | None = None, *, max_api_versions: int = 3):
        self.reply = reply
        self.max_api_versions = max_api_versions
        self.seen: list[tuple[int, int]] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                if int.from_bytes(frame[0:2], "big") == ApiKey.API_VERSIONS:
                    version = int.from_bytes(frame[2:4], "big")
                    correlation = int.from_bytes(frame[4:8], "big")
                    self.seen.append((ApiKey.API_VERSIONS, version))
                    if version > self.max_api_versions:
                        # Kafka's answer to a version it does not know: a v0 body with UNSUPPORTED_VERSION.
                        out = messages.encode_response(_api_versions_body(ErrorCode.UNSUPPORTED_VERSION), 18, 0, correlation)
                    else:
                        out = messages.encode_response(_api_versions_body(), 18, version, correlation)
                    writer.write(bytes(out))
                    continue
                header, body = messages.decode_request(frame)
                self.seen.append((header.api_key, header.api_version))
                assert self.reply is not None
                asyncio.get_running_loop().create_task(self._answer(writer, header, body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def _answer(self, writer: asyncio.StreamWriter, header: messages.RequestHeader, body: Any) -> None:
        assert self.reply is not None
        out = await self.reply(header, body)
        if out is not None:
            writer.write(out)


def _list_groups_reply(delays: dict[str, float]) -> Reply:
    async def reply(header: messages.RequestHeader, body: Any) -> bytes:
        # The requested state filter names the group to return, and how long to hold the answer.
        name = body.states_filter[0]
        await asyncio.sleep(delays[name])
        group = messages.ListGroupsResponse.ListedGroup(group_id=name, protocol_type="share")  # type: ignore[attr-defined]
        response = messages.ListGroupsResponse(error_code=0, groups=[group])
        return bytes(messages.encode_response(response, header.api_key, header.api_version, header.correlation_id))

    return reply


async def _connect(address: str) -> BrokerConnection:
    host, port = address.rsplit(":", 1)
    return await BrokerConnection(host, int(port), ClientConfig(request_timeout_ms=5000)).connect()


async def test_pipelined_requests_are_matched_by_correlation_id() -> None:
    broker = ScriptedBroker(_list_groups_reply({"slow": 0.2, "fast": 0.0, "middle": 0.05}))
    address = await broker.start()
    conn = await _connect(address)
    try:
        calls = [
            conn.request(ApiKey.LIST_GROUPS, messages.ListGroupsRequest(states_filter=[name]), versions=(0, 5))
            for name in ("slow", "fast", "middle")
        ]
        results = await asyncio.gather(*calls)
        assert [r.groups[0].group_id for r in results] == ["slow", "fast", "middle"]
        assert (ApiKey.LIST_GROUPS, 5) in broker.seen
    finally:
        await conn.close()
        await broker.stop()


async def test_api_versions_falls_back_to_v0_on_unsupported_version() -> None:
    broker = ScriptedBroker(max_api_versions=2)
    address = await broker.start()
    conn = await _connect(address)
    try:
        assert broker.seen == [(ApiKey.API_VERSIONS, 3), (ApiKey.API_VERSIONS, 0)]
        assert conn.api_versions[ApiKey.METADATA] == (0, 12)
        assert conn.pick_version(ApiKey.METADATA, 1, 13) == 12
        assert conn.pick_version(ApiKey.LIST_GROUPS, 0, 3) == 3
        with pytest.raises(UnsupportedVersionError):
            conn.pick_version(ApiKey.SHARE_FETCH, 1, 2)  # not advertised
        with pytest.raises(UnsupportedVersionError):
            conn.pick_version(ApiKey.METADATA, 13, 13)  # above the broker's range
    finally:
        await conn.close()
        await broker.stop()


async def test_lost_connection_fails_pending_requests_and_the_cluster_reconnects() -> None:
    async def never(header: messages.RequestHeader, body: Any) -> None:
        return None

    broker = ScriptedBroker(never)
    address = await broker.start()
    cluster = Cluster(address, ClientConfig(request_timeout_ms=5000, reconnect_backoff_ms=10))
    try:
        conn = await cluster.connection(-1)
        pending = asyncio.ensure_future(
            conn.request(ApiKey.LIST_GROUPS, messages.ListGroupsRequest(), versions=(0, 5))
        )
        while not any(k == ApiKey.LIST_GROUPS for k, _ in broker.seen):
            await asyncio.sleep(0.01)
        for w in broker.writers:
            w.close()
        with pytest.raises(KafkaConnectionError):
            await pending
        assert not conn.connected
        again = await cluster.connection(-1)
        assert again is not conn and again.connected
        assert broker.connections == 2
    finally:
        await cluster.close()
        await broker.stop()


async def test_connect_to_a_closed_port_raises_connection_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    cluster = Cluster(f"127.0.0.1:{port}", ClientConfig(request_timeout_ms=300, reconnect_backoff_ms=20))
    with pytest.raises(KafkaConnectionError):
        await cluster.connection(-1)
    await cluster.close()


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1, PLAINTEXT://b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    with pytest.raises(ValueError):
        parse_bootstrap("nohost")
    with pytest.raises(ValueError):
        parse_bootstrap("")


async def test_a_connect_without_an_answer_gives_up_after_the_connection_setup_timeout() -> None:
    """Kafka's socket.connection.setup.timeout.ms: a broker that never answers the connect (here a listener
    whose accept queue is full, as a host gone without a reset would be) fails the connect after that
    timeout, not after the whole request timeout, so the client goes on to another broker."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    host, port = listener.getsockname()
    queued = socket.create_connection((host, port))  # fills the accept queue: the next connects get no answer
    try:
        config = ClientConfig.from_dict({"socket.connection.setup.timeout.ms": 200, "request.timeout.ms": 600_000})
        # The outer deadline only keeps a broken client from hanging the suite for the request timeout.
        with pytest.raises(KafkaConnectionError, match="no answer within 200 ms"):
            await asyncio.wait_for(BrokerConnection(host, port, config).connect(), 60)
    finally:
        queued.close()
        listener.close()


@given(initial=st.integers(1, 60_000), ceiling=st.integers(1, 600_000), attempts=st.integers(0, 200))
def test_exponential_backoff_doubles_to_its_ceiling_within_its_jitter(initial: int, ceiling: int, attempts: int) -> None:
    exact = [exponential_backoff_ms(initial, ceiling, a, jitter=0) for a in (attempts, attempts + 1)]
    if attempts == 0:
        assert exact[0] == min(initial, ceiling)
    assert exact[1] == min(2 * exact[0], ceiling)  # each attempt doubles it, until the ceiling holds it
    assert exact[0] * 0.8 <= exponential_backoff_ms(initial, ceiling, attempts) <= exact[0] * 1.2


async def test_the_connection_setup_timeout_grows_with_each_failed_connect_in_a_row() -> None:
    """As Kafka's clients (socket.connection.setup.timeout.max.ms): each connect that got no answer doubles
    the next one's setup timeout, up to the maximum, so a broker that is slow to accept is not given up on
    forever at the first value."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    host, port = listener.getsockname()
    queued = socket.create_connection((host, port))  # fills the accept queue: the next connects get no answer
    cluster = Cluster(f"{host}:{port}", ClientConfig.from_dict({
        "socket.connection.setup.timeout.ms": 50, "socket.connection.setup.timeout.max.ms": 100,
        "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 10, "request.timeout.ms": 400}))
    try:
        # The request timeout ends the tries; the last one's message names the timeout it had: the ceiling,
        # within the jitter, not the 50 ms of the first.
        with pytest.raises(KafkaConnectionError, match=r"no answer within (8\d|9\d|1[01]\d|120) ms"):
            await asyncio.wait_for(cluster.connection(-1), 60)
    finally:
        await cluster.close()
        queued.close()
        listener.close()


def test_request_timeout_and_api_timeout_come_from_the_config_unless_given_as_arguments() -> None:
    from shoal.client.admin import AsyncAdmin
    from shoal.client.consumer.share_consumer import AsyncShareConsumer
    from shoal.client.producer.producer import AsyncProducer

    config = {"request.timeout.ms": "700", "default.api.timeout.ms": "9000"}
    makers: list[Callable[..., Any]] = [AsyncAdmin, AsyncProducer, AsyncShareConsumer]
    for make in makers:
        kwargs: dict[str, Any] = {"group_id": "g"} if make is AsyncShareConsumer else {}
        client = make("127.0.0.1:1", config=config, **kwargs)
        assert (client.config.request_timeout_ms, client.config.default_api_timeout_ms) == (700, 9000)
        assert make("127.0.0.1:1", **kwargs).config.request_timeout_ms == 30_000
        assert make("127.0.0.1:1", config=config, request_timeout_ms=1200, **kwargs).config.request_timeout_ms == 1200
