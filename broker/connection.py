"""One client connection: Kafka framing, many requests in flight, responses strictly in request order."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from shoal.protocol import messages
from shoal.protocol.codec import DecodeError

from .authorizer import ANONYMOUS, Operation, Principal, ResourceType

if TYPE_CHECKING:
    from .config import Listener
    from .server import Broker

log = structlog.get_logger("shoal.connection")


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request beyond its body."""

    header: messages.RequestHeader
    connection: KafkaConnection
    received_at: float = field(default_factory=time.monotonic)

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


class _Slot:
    """A place in the response queue; filled when the handler finishes."""

    __slots__ = ("ready", "payload")

    def __init__(self) -> None:
        self.ready = False
        self.payload: bytes | bytearray | None = None


class KafkaConnection(asyncio.Protocol):
    """Frames are `int32 size` + request; handlers may finish out of order, responses never leave out of order."""

    def __init__(self, broker: Broker, listener: Listener):
        self.broker = broker
        self.listener = listener
        self.principal: Principal = ANONYMOUS
        self.client_host = ""
        self.client_port = 0
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: collections.deque[_Slot] = collections.deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reading_paused = False
        self._closed = False
        self._last_activity = time.monotonic()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._max_request = int(broker.config["socket.request.max.bytes"])
        self._max_in_flight = int(broker.config["queued.max.requests"])
        self._idle_ms = int(broker.config["connections.max.idle.ms"])
        # Per-connection state other layers attach (share sessions bound to this socket, SASL state, ...).
        self.attachments: dict[str, Any] = {}

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        if peer:
            self.client_host, self.client_port = peer[0], peer[1]
        self.broker.on_connection_opened(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        self._last_activity = time.monotonic()
        buf = self._buffer
        buf += data
        while len(buf) >= 4 and not self._closed:
            size = int.from_bytes(buf[0:4], "big", signed=True)
            if size < 0 or size > self._max_request:
                log.warning(
                    "request frame size rejected, closing connection",
                    size=size,
                    limit=self._max_request,
                    client=self.client_host,
                )
                self.close()
                return
            if len(buf) < 4 + size:
                break
            frame = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            self._on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        for task in list(self._tasks):
            task.cancel()
        self._pending.clear()
        self.broker.on_connection_closed(self)

    def pause_writing(self) -> None:
        # The client reads slower than we answer: stop reading its requests until the buffer drains.
        if self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True

    def resume_writing(self) -> None:
        self._maybe_resume_reading()

    # ---- requests ----------------------------------------------------------------------------

    def _on_frame(self, frame: bytes) -> None:
        try:
            header, pos = messages.decode_request_header(frame)
        except messages.UnknownApi as exc:
            log.warning("unknown api key, closing connection", error=str(exc), client=self.client_host)
            self.close()
            return
        except DecodeError as exc:
            log.warning("malformed request header, closing connection", error=str(exc), client=self.client_host)
            self.close()
            return
        api = self.broker.apis.get(header.api_key)
        if api is None or not (api.min_version <= header.api_version <= api.max_version):
            if header.api_key == messages.API_VERSIONS_KEY:
                # KIP-511: answer an unknown ApiVersions version in v0 form so the client can downgrade.
                self._respond_now(self.broker.api_versions_fallback(header), header, 0)
                return
            log.warning(
                "unsupported api or version, closing connection",
                api_key=header.api_key,
                api_version=header.api_version,
                client=self.client_host,
            )
            self.broker.metrics.request_errors.labels(api=str(header.api_key)).inc()
            self.close()
            return
        try:
            body, _ = messages.REQUESTS[header.api_key].decode(frame, header.api_version, pos)
        except DecodeError as exc:
            log.warning(
                "malformed request body, closing connection",
                api=api.name,
                api_version=header.api_version,
                error=str(exc),
                client=self.client_host,
            )
            self.broker.metrics.request_errors.labels(api=api.name).inc()
            self.close()
            return
        self.broker.metrics.bytes_in.inc(len(frame) + 4)
        ctx = RequestContext(header, self)
        slot = _Slot()
        self._pending.append(slot)
        if len(self._pending) >= self._max_in_flight and self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        if api.is_async:
            task = asyncio.get_running_loop().create_task(self._run_async(api, ctx, body, slot))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            try:
                response = api.handler(ctx, body)
            except Exception:
                log.exception("handler failed", api=api.name, api_version=header.api_version)
                self.broker.metrics.request_errors.labels(api=api.name).inc()
                self.close()
                return
            self._complete(slot, api, ctx, response)

    async def _run_async(self, api: Any, ctx: RequestContext, body: Any, slot: _Slot) -> None:
        try:
            response = await api.handler(ctx, body)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler failed", api=api.name, api_version=ctx.api_version)
            self.broker.metrics.request_errors.labels(api=api.name).inc()
            self.close()
            return
        self._complete(slot, api, ctx, response)

    def _complete(self, slot: _Slot, api: Any, ctx: RequestContext, response: Any) -> None:
        self.broker.metrics.observe_request(api.name, time.monotonic() - ctx.received_at)
        if response is not None:
            slot.payload = messages.encode_response(
                response, ctx.header.api_key, ctx.header.api_version, ctx.header.correlation_id
            )
        slot.ready = True
        self._flush_ready()

    def _respond_now(self, body: Any, header: messages.RequestHeader, version: int) -> None:
        slot = _Slot()
        slot.payload = messages.encode_response(body, header.api_key, version, header.correlation_id)
        slot.ready = True
        self._pending.append(slot)
        self._flush_ready()

    def _flush_ready(self) -> None:
        pending = self._pending
        transport = self.transport
        while pending and pending[0].ready:
            slot = pending.popleft()
            if slot.payload is not None and transport is not None and not self._closed:
                transport.write(slot.payload)
                self.broker.metrics.bytes_out.inc(len(slot.payload))
        self._maybe_resume_reading()

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
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


