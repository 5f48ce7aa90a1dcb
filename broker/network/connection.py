"""One client connection: Kafka framing, many requests in flight, responses strictly in request order.

A request whose handler has started runs to completion even if the client goes away, as in Kafka: an
acknowledgement half way through its state write must finish (or roll back), never stop in between.
Only the response is dropped. Handlers parked in a long poll are woken through `wake_key` instead.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from shoal.broker.common.purgatory import ConnectionClosedKey
from shoal.broker.security.authorizer import ANONYMOUS, Operation, Principal, ResourceType
from shoal.broker.security.sasl import (
    PRE_AUTH_APIS,
    REAUTH_APIS,
    SASL_PROTOCOLS,
    SaslSession,
    log_failure,
    log_success,
)
from shoal.broker.security.scram import AuthenticationFailed
from shoal.broker.security.tls import TlsSession, principal_from_certificate
from shoal.protocol import messages
from shoal.protocol.codec import Buffer, MessageBase

from .framing import FrameReader, FrameSizeError, Rejected, decode_body, decode_header

if TYPE_CHECKING:
    from shoal.broker.common.config import Listener
    from shoal.broker.network.request_channel import Api, RequestChannel

log = structlog.get_logger("shoal.connection")


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request beyond its body."""

    header: messages.RequestHeader
    connection: KafkaConnection
    received_at: float = field(default_factory=time.monotonic)
    close_after: bool = False
    # The request's size on the wire (header and body), what Kafka's produce quota records.
    size: int = 0

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def principal(self) -> Principal:
        return self.connection.principal

    def authorize(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return self.connection.broker.authorizer.authorize(
            self.connection.principal, self.connection.client_host, operation, resource_type, name
        )

    def authorize_any(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether the principal may do `operation` on some resource of the type (Kafka's authorizeByResourceType)."""
        return self.connection.broker.authorizer.authorize_any(
            self.connection.principal, self.connection.client_host, operation, resource_type
        )

    @property
    def quota_user(self) -> str:
        return self.connection.principal.name

    @property
    def quota_client_id(self) -> str:
        return self.header.client_id or ""

    def throttle_connection(self, throttle_ms: int) -> None:
        self.connection.throttle(throttle_ms)

    def close_after_response(self) -> None:
        """Close the connection once this request's response has been written (e.g. a failed login)."""
        self.close_after = True


class _Slot:
    """A place in the response queue; filled when the handler finishes."""

    __slots__ = ("ready", "payload", "close_after")

    def __init__(self) -> None:
        self.ready = False
        # A response as buffers to write in order (large record sets are not copied into one).
        self.payload: list[Buffer] | None = None
        self.close_after = False


# What a connection receives small requests into; a larger one gets a buffer of its own (FrameReader).
_SCRATCH_BYTES = 64 * 1024


class KafkaConnection(asyncio.BufferedProtocol):
    """Frames are `int32 size` + request; handlers may finish out of order, responses never leave out of order.

    Requests are received straight into the FrameReader's buffers (asyncio's BufferedProtocol): a large
    Produce lands in a buffer of its own, whose record sets are appended to the log without a copy."""

    def __init__(self, broker: RequestChannel, listener: Listener):
        self.broker = broker
        self.listener = listener
        self.principal: Principal = ANONYMOUS
        self.client_host = ""
        self.client_port = 0
        self.transport: asyncio.Transport | None = None
        self._frames = FrameReader(int(broker.config["socket.request.max.bytes"]), scratch_size=_SCRATCH_BYTES)
        self._pending: collections.deque[_Slot] = collections.deque()
        self._reading_paused = False
        self._flush_scheduled = False
        self._closed = False
        self._last_activity = time.monotonic()
        self._idle_handle: asyncio.TimerHandle | None = None
        # While a quota throttles this client its requests are not read (KIP-219: the broker mutes the channel).
        self._throttle_handle: asyncio.TimerHandle | None = None
        self._throttled_until = 0.0
        self._max_in_flight = int(broker.config["queued.max.requests"])
        self._idle_ms = int(broker.config["connections.max.idle.ms"])
        # Per-connection state other layers attach (share sessions bound to this socket, ...).
        self.attachments: dict[str, Any] = {}
        self.sasl: SaslSession | None = None
        if listener.security_protocol in SASL_PROTOCOLS:
            self.sasl = SaslSession(listener.name, int(broker.config.for_listener(listener.name, "connections.max.reauth.ms")))
        self._tls: TlsSession | None = None
        tls_context = broker.ssl_contexts.get(listener.name)
        if tls_context is not None:
            self._tls = TlsSession(tls_context)
        self._tls_in = memoryview(bytearray(_SCRATCH_BYTES if tls_context is not None else 0))

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        if peer:
            self.client_host, self.client_port = peer[0], peer[1]
        self.broker.on_connection_opened(self)
        self._arm_idle_timer()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._tls is not None:
            # Ciphertext lands in the scratch buffer of the TLS session's own; frames are cut from the plaintext.
            return self._tls_in
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._last_activity = time.monotonic()
        try:
            if self._tls is not None:
                plaintext = self._tls_received(bytes(self._tls_in[:nbytes]))
                frames = self._frames.feed(plaintext) if plaintext else []
            else:
                frames = self._frames.buffer_updated(nbytes)
        except FrameSizeError as exc:
            self._dispatch(exc.frames)
            log.warning(
                "request frame size rejected, closing connection",
                size=exc.size,
                limit=exc.limit,
                client=self.client_host,
            )
            self.close()
            return
        self._dispatch(frames)

    def _dispatch(self, frames: list[bytes | bytearray]) -> None:
        for frame in frames:
            if self._closed:
                return
            if self.sasl is not None and self.sasl.raw_tokens:
                self._on_raw_sasl_token(bytes(frame))
            else:
                self._on_frame(frame)

    def _tls_received(self, data: bytes) -> bytes:
        """Decrypt; on the handshake's completion take the SSL principal. Returns plaintext (maybe empty)."""
        tls = self._tls
        assert tls is not None
        was_done = tls.handshake_done
        try:
            plaintext, reply = tls.receive(data)
        except ssl.SSLError as exc:
            # Also what a plaintext client on a TLS port ends up as: logged, dropped, nothing else touched.
            log.warning(
                "TLS handshake failed, closing connection" if not was_done else "TLS error, closing connection",
                client=self.client_host, listener=self.listener.name, reason=exc.reason or str(exc),
            )
            # Send the TLS alert OpenSSL produced so the client learns why (e.g. unknown CA).
            self._write_raw(tls.drain())
            self.close()
            return b""
        if reply:
            self._write_raw(reply)
        if tls.handshake_done and not was_done:
            principal = principal_from_certificate(tls.peer_certificate())
            if principal is not None and self.sasl is None:
                # On SSL listeners the client certificate names the principal; on SASL_SSL SASL does.
                self.principal = principal
            log.debug("TLS handshake complete", client=self.client_host, version=tls.version(),
                      principal=str(self.principal))
        if tls.peer_closed:
            self.close()
        return plaintext

    def _write_raw(self, data: Buffer) -> None:
        if data and self.transport is not None and not self._closed:
            self.transport.write(data)

    def _write(self, payload: list[Buffer]) -> None:
        if self._tls is not None:
            self._write_raw(self._tls.send(b"".join(payload)))
        elif len(payload) == 1:
            self._write_raw(payload[0])
        elif self.transport is not None and not self._closed:
            self.transport.writelines(payload)  # one vectored write, no joined copy

    def _on_raw_sasl_token(self, token: bytes) -> None:
        """SaslHandshake v0: the mechanism's tokens arrive as bare frames and are answered the same way."""
        session = self.sasl
        assert session is not None
        try:
            challenge = session.evaluate(token)
        except AuthenticationFailed as exc:
            # v0 has no way to carry an error: log it and close, as Kafka does.
            log_failure(self.client_host, session, exc)
            self.close()
            return
        if session.authenticated and session.principal is not None:
            self.principal = session.principal
            log_success(self.client_host, session)
        slot = _Slot()
        slot.payload = [len(challenge).to_bytes(4, "big") + challenge]
        slot.ready = True
        self._pending.append(slot)
        self._flush_ready()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        if self._throttle_handle is not None:
            self._throttle_handle.cancel()
        # Handlers still running are not cancelled: they finish and their responses are dropped.
        self._pending.clear()
        self.broker.purgatory.notify(self.wake_key)
        self.broker.on_connection_closed(self)

    @property
    def wake_key(self) -> ConnectionClosedKey:
        """Purgatory key notified when this connection closes, so its long polls end early."""
        return ConnectionClosedKey(self)

    def pause_writing(self) -> None:
        # The client reads slower than we answer: stop reading its requests until the buffer drains.
        if self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True

    def resume_writing(self) -> None:
        self._maybe_resume_reading()

    # ---- requests ----------------------------------------------------------------------------

    def _on_frame(self, frame: bytes | bytearray) -> None:
        head = decode_header(frame)
        if isinstance(head, Rejected):
            self._reject(head)
            return
        sasl = self.sasl
        if sasl is not None and not self._sasl_allows(sasl, head.header.api_key):
            self.close()
            return
        decoded = decode_body(frame, head, self.broker.apis)
        if isinstance(decoded, Rejected):
            if decoded.answer_api_versions:
                # KIP-511: answer an unknown ApiVersions version in v0 form so the client can downgrade.
                self._respond_now(self.broker.api_versions_fallback(head.header), head.header, 0)
            else:
                self._reject(decoded)
            return
        header, api, body = decoded.header, decoded.api, decoded.body
        self.broker.metrics.bytes_in.inc(len(frame) + 4)
        ctx = RequestContext(header, self, size=len(frame))
        slot = _Slot()
        self._pending.append(slot)
        if len(self._pending) >= self._max_in_flight and self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        if api.is_async:
            self.broker.track_request(asyncio.get_running_loop().create_task(
                self._run_async(api, ctx, api.handler(ctx, body), slot)))
            return
        try:
            response = api.handler(ctx, body)
        except Exception:
            log.exception("handler failed", api=api.name, api_version=header.api_version)
            self.broker.metrics.request_errors.labels(api=api.name).inc()
            self.close()
            return
        if isinstance(response, MessageBase) or response is None:
            self._complete(slot, api, ctx, response)
        elif isinstance(response, asyncio.Future):
            # An answer someone else completes (acks=all Produce: the partitions' group commit): no task.
            response.add_done_callback(functools.partial(self._answer_done, api, ctx, slot))
        else:
            # The handler did what it could at once and left the rest to await (Produce with acks=all
            # waits for the fsync); a request that needs no wait costs no task.
            self.broker.track_request(asyncio.get_running_loop().create_task(
                self._run_async(api, ctx, response, slot)))

    def _reject(self, rejected: Rejected) -> None:
        log.warning(rejected.reason, **rejected.log_fields, client=self.client_host)
        if rejected.metric_label is not None:
            self.broker.metrics.request_errors.labels(api=rejected.metric_label).inc()
        self.close()

    def _sasl_allows(self, sasl: SaslSession, api_key: int) -> bool:
        if not sasl.authenticated:
            if api_key in PRE_AUTH_APIS:
                return True
            log.warning("request before SASL authentication completed, closing connection",
                        api_key=api_key, client=self.client_host, listener=self.listener.name)
            return False
        if sasl.expired(time.monotonic()) and api_key not in REAUTH_APIS:
            log.info("SASL session expired without re-authentication, closing connection",
                     principal=str(self.principal), client=self.client_host, listener=self.listener.name)
            return False
        return True

    async def _run_async(self, api: Api, ctx: RequestContext, pending: Awaitable[MessageBase | None],
                         slot: _Slot) -> None:
        try:
            response = await pending
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler failed", api=api.name, api_version=ctx.api_version)
            self.broker.metrics.request_errors.labels(api=api.name).inc()
            self.close()
            return
        self._complete(slot, api, ctx, response)

    def _answer_done(self, api: Api, ctx: RequestContext, slot: _Slot, answer: asyncio.Future[MessageBase | None]
                     ) -> None:
        if answer.cancelled():
            return  # as a cancelled handler task: no response (the broker is stopping)
        error = answer.exception()
        if error is not None:
            log.error("handler failed", api=api.name, api_version=ctx.api_version, exc_info=error)
            self.broker.metrics.request_errors.labels(api=api.name).inc()
            self.close()
            return
        self._complete(slot, api, ctx, answer.result())

    def _complete(self, slot: _Slot, api: Api, ctx: RequestContext, response: MessageBase | None) -> None:
        self.broker.metrics.observe_request(api.name, time.monotonic() - ctx.received_at)
        if response is not None:
            try:
                slot.payload = messages.encode_response_parts(
                    response, ctx.header.api_key, ctx.header.api_version, ctx.header.correlation_id
                )
            except Exception:
                # A response this version cannot carry is a bug in its handler; the client gets a close, not a hang.
                log.exception("response encoding failed, closing connection", api=api.name,
                              api_version=ctx.api_version)
                self.broker.metrics.request_errors.labels(api=api.name).inc()
                self.close()
                return
        slot.close_after = ctx.close_after
        slot.ready = True
        if self._pending and self._pending[0].ready and not self._flush_scheduled:
            # Responses completed in this pass of the loop (pipelined requests of one read, handlers woken
            # together) leave in one write: one send instead of one per response.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_ready)

    def _respond_now(self, body: MessageBase, header: messages.RequestHeader, version: int) -> None:
        slot = _Slot()
        slot.payload = messages.encode_response_parts(body, header.api_key, version, header.correlation_id)
        slot.ready = True
        self._pending.append(slot)
        self._flush_ready()

    def _flush_ready(self) -> None:
        """Write every response at the head of the queue that is ready, in order, in one write."""
        self._flush_scheduled = False
        pending = self._pending
        out: list[Buffer] = []
        close = False
        while pending and pending[0].ready:
            slot = pending.popleft()
            if slot.payload is not None:
                out.extend(slot.payload)
            if slot.close_after:
                close = True
                break
        if out and self.transport is not None and not self._closed:
            self._write(out)
            self.broker.metrics.bytes_out.inc(sum(len(part) for part in out))
        if close:
            # Transport close flushes what was written first, so the client still reads the reason.
            self.close()
            return
        self._maybe_resume_reading()

    def throttle(self, throttle_ms: int) -> None:
        """Stop reading this client's requests for `throttle_ms` (or longer, if already throttled longer)."""
        if self._closed or self.transport is None or throttle_ms <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + throttle_ms / 1000
        if until <= self._throttled_until:
            return
        self._throttled_until = until
        if self._throttle_handle is not None:
            self._throttle_handle.cancel()
        self._throttle_handle = loop.call_at(until, self._end_throttle)
        if not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True

    def _end_throttle(self) -> None:
        self._throttle_handle = None
        self._maybe_resume_reading()

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
            and self._throttle_handle is None
            and self.transport is not None
            and not self._closed
            and len(self._pending) < self._max_in_flight // 2 + 1
            and self.transport.get_write_buffer_size() < 4 * 1024 * 1024
        ):
            self._reading_paused = False
            self.transport.resume_reading()

    # ---- lifecycle ---------------------------------------------------------------------------

    def _arm_idle_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle_handle = loop.call_later(self._idle_ms / 1000, self._check_idle)

    def _check_idle(self) -> None:
        if self._closed:
            return
        idle_for = time.monotonic() - self._last_activity
        if idle_for * 1000 >= self._idle_ms and not self._pending:
            log.info("closing idle connection", client=self.client_host, idle_ms=int(idle_for * 1000))
            self.close()
            return
        loop = asyncio.get_running_loop()
        remaining = max(0.05, self._idle_ms / 1000 - idle_for)
        self._idle_handle = loop.call_later(remaining, self._check_idle)

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    @property
    def closed(self) -> bool:
        return self._closed


