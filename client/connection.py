"""One TCP (or TLS) connection to a broker: framing, pipelined requests matched by correlation id,
ApiVersions negotiation and SASL authentication."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable
from typing import Any

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import DecodeError, MessageBase
from shoal.protocol.errors import ErrorCode
from shoal.protocol.frames import FrameReader, FrameSizeError

from .errors import (
    AuthenticationError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    UnsupportedVersionError,
    for_code,
)
from .security import ClientConfig, sasl_exchange

_SIZE = struct.Struct(">i")
_MAX_FRAME = 512 * 1024 * 1024
CLIENT_SOFTWARE_NAME = "shoal-python"
CLIENT_SOFTWARE_VERSION = "0.1.0"


class _ResponseStream(asyncio.BufferedProtocol):
    """The socket side of a BrokerConnection: receives into the FrameReader's buffers (a large response
    lands in its own buffer, uncopied), hands each frame to the connection, and keeps write flow control."""

    def __init__(self, owner: BrokerConnection):
        self.owner = owner
        self.frames = FrameReader(_MAX_FRAME)
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._can_write: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (the broker's loop, in sidecar mode) are not asyncio.Transport subclasses.
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.frames.buffer_updated(nbytes)
        except FrameSizeError as exc:
            self.owner._fail(KafkaConnectionError(None, f"invalid response frame size {exc.size}"))
            return
        for frame in frames:
            self.owner._on_response(frame)

    def eof_received(self) -> bool | None:
        return None  # close the transport: the broker closed its side

    def connection_lost(self, exc: Exception | None) -> None:
        owner = self.owner
        owner._fail(KafkaConnectionError(None, f"connection to {owner.host}:{owner.port} lost: {exc!r}"))
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake_writers(exc)

    def pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writers(None)

    def _wake_writers(self, exc: Exception | None) -> None:
        waiter, self._can_write = self._can_write, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(ConnectionResetError(str(exc)))

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self._can_write is not None:
            await asyncio.shield(self._can_write)


class BrokerConnection:
    """Pipelines requests to one broker; responses are routed back by correlation id, in any order."""

    def __init__(self, host: str, port: int, config: ClientConfig, *, node_id: int = -1):
        self.host = host
        self.port = port
        self.node_id = node_id
        self.config = config
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._stream: _ResponseStream | None = None
        self._pending: dict[int, tuple[asyncio.Future[Any], int, int]] = {}
        self._correlation = 0
        self._closed = False
        self._close_reason: KafkaError | None = None
        self.on_close: Callable[[BrokerConnection], None] | None = None

    def __repr__(self) -> str:
        return f"BrokerConnection(node={self.node_id}, {self.host}:{self.port})"

    @property
    def connected(self) -> bool:
        return self._stream is not None and not self._closed

    # ---- set-up --------------------------------------------------------------------------------

    async def connect(self, setup_timeout_ms: float | None = None) -> BrokerConnection:
        """Connect, negotiate versions and authenticate; the connect itself fails after `setup_timeout_ms`
        (default socket.connection.setup.timeout.ms), and never later than the request timeout."""
        if setup_timeout_ms is None:
            setup_timeout_ms = self.config.socket_connection_setup_timeout_ms
        timeout = min(setup_timeout_ms, self.config.request_timeout_ms) / 1000
        ssl_ctx = self.config.ssl_context()
        loop = asyncio.get_running_loop()
        try:
            _, self._stream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ResponseStream(self), self.host, self.port, ssl=ssl_ctx,
                    server_hostname=self.host if ssl_ctx else None,
                ),
                timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            # Retrying cannot help: the server's certificate is not trusted (Kafka's SslAuthenticationException).
            self._closed = True
            raise AuthenticationError(None, f"TLS handshake with {self.host}:{self.port} failed: {exc}") from exc
        except TimeoutError as exc:
            self._closed = True
            raise KafkaConnectionError(None, f"cannot connect to {self.host}:{self.port}: no answer within "
                                             f"{timeout * 1000:.0f} ms") from exc
        except OSError as exc:
            self._closed = True
            raise KafkaConnectionError(None, f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        try:
            await self._negotiate_versions()
            if self.config.uses_sasl:
                await self._authenticate()
        except BaseException:
            await self.close()
            raise
        return self

    async def _negotiate_versions(self) -> None:
        # v3 first (flexible, carries our software name); a broker that does not know v3 answers in the v0
        # shape with UNSUPPORTED_VERSION (Kafka) or a mixed body (librdkafka's mock), so fall back to v0.
        body = messages.ApiVersionsRequest(
            client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION
        )
        response: Any = None
        try:
            response = await self.request(ApiKey.API_VERSIONS, body, version=3)
        except (DecodeError, UnsupportedVersionError):
            response = None
        if response is None or response.error_code == ErrorCode.UNSUPPORTED_VERSION:
            response = await self.request(ApiKey.API_VERSIONS, body, version=0)
        if response.error_code:
            raise for_code(response.error_code, "ApiVersions")
        self.api_versions = {a.api_key: (a.min_version, a.max_version) for a in response.api_keys}

    async def _authenticate(self) -> None:
        cfg = self.config
        handshake_v = self.pick_version(ApiKey.SASL_HANDSHAKE, 1, 1)
        response = await self.request(
            ApiKey.SASL_HANDSHAKE, messages.SaslHandshakeRequest(mechanism=cfg.sasl_mechanism), version=handshake_v
        )
        if response.error_code:
            raise AuthenticationError(
                response.error_code, f"{cfg.sasl_mechanism} not enabled; broker offers {response.mechanisms}"
            )
        auth_v = self.pick_version(ApiKey.SASL_AUTHENTICATE, 0, 2)
        exchange = sasl_exchange(cfg)
        out: bytes | None = exchange.first()
        while out is not None:
            response = await self.request(
                ApiKey.SASL_AUTHENTICATE, messages.SaslAuthenticateRequest(auth_bytes=out), version=auth_v
            )
            if response.error_code:
                raise AuthenticationError(response.error_code, response.error_message)
            out = exchange.step(response.auth_bytes or b"")

    # ---- versions --------------------------------------------------------------------------------

    def max_version(self, api_key: int) -> int:
        """The broker's highest version of `api_key`, or -1 if it does not serve it."""
        rng = self.api_versions.get(api_key)
        return -1 if rng is None else rng[1]

    def pick_version(self, api_key: int, our_min: int, our_max: int) -> int:
        """The highest version both sides speak within [our_min, our_max]."""
        spec = messages.REQUESTS[api_key].spec.valid
        lo, hi = max(our_min, spec.low), our_max if spec.high is None else min(our_max, spec.high)
        rng = self.api_versions.get(api_key)
        if rng is not None:
            lo, hi = max(lo, rng[0]), min(hi, rng[1])
            if lo <= hi:
                return hi
        name = messages.API_NAMES.get(api_key, str(api_key))
        raise UnsupportedVersionError(
            None, f"{self.host}:{self.port} serves {name} {rng or 'not at all'}; this client needs {our_min}-{our_max}"
        )

    # ---- requests --------------------------------------------------------------------------------

    async def request(
        self,
        api_key: int,
        body: MessageBase,
        *,
        version: int | None = None,
        versions: tuple[int, int] | None = None,
        expect_response: bool = True,
        timeout_ms: int | None = None,
    ) -> Any:
        """Send one request and wait for its decoded response body.

        Give either an exact `version` or a `versions` range to negotiate within.
        """
        stream = self._stream
        if self._closed or stream is None or stream.transport is None:
            raise self._close_reason or KafkaConnectionError(None, f"connection to {self.host}:{self.port} is closed")
        if version is None:
            spec_high = messages.REQUESTS[api_key].spec.valid.high
            lo, hi = versions if versions is not None else (0, 0x7FFF if spec_high is None else spec_high)
            version = self.pick_version(api_key, lo, hi)
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        correlation_id = self._correlation
        frame = messages.encode_request(body, api_key, version, correlation_id, self.config.client_id)
        future: asyncio.Future[Any] | None = None
        if expect_response:
            future = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = (future, api_key, version)
        stream.transport.write(_SIZE.pack(len(frame)) + frame)
        try:
            await stream.drain()
        except (OSError, RuntimeError) as exc:
            self._fail(KafkaConnectionError(None, f"write to {self.host}:{self.port} failed: {exc}"))
        if future is None:
            return None
        timeout = (timeout_ms if timeout_ms is not None else self.config.request_timeout_ms) / 1000
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self._pending.pop(correlation_id, None)
            # Like Kafka's clients, give up on the whole connection: its stream may be stuck.
            self._fail(KafkaTimeoutError(None, f"no response from {self.host}:{self.port} within {timeout:.1f}s"))
            raise KafkaTimeoutError(None, f"{messages.API_NAMES.get(api_key)} timed out after {timeout:.1f}s") from None

    def _on_response(self, payload: bytes | bytearray) -> None:
        if len(payload) < 4:
            self._fail(KafkaConnectionError(None, f"invalid response frame size {len(payload)}"))
            return
        correlation_id = int.from_bytes(payload[0:4], "big", signed=True)
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return  # a response we stopped waiting for (timed out)
        future, api_key, version = entry
        if future.done():
            return
        try:
            # A memoryview, so that the decoder copies each field out of a large frame once.
            _, body = messages.decode_response(memoryview(payload), api_key, version)
        except Exception as exc:  # a malformed body fails this request, not the connection
            future.set_exception(DecodeError(f"cannot decode {messages.API_NAMES.get(api_key)} v{version}: {exc}"))
        else:
            future.set_result(body)

    def _fail(self, reason: KafkaError) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = reason
            if self._stream is not None and self._stream.transport is not None:
                with contextlib.suppress(Exception):
                    self._stream.transport.close()
            if self.on_close is not None:
                self.on_close(self)
        pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(reason)

    async def close(self) -> None:
        self._fail(KafkaConnectionError(None, "connection closed by the client"))
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._stream.closed), 1.0)
