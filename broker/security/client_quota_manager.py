"""Client quota enforcement, as Kafka's ClientQuotaManager does it for producer_byte_rate and consumer_byte_rate.

Each (user, client-id) pair that a quota applies to has a sensor: a rate over `quota.window.num` samples of
`quota.window.size.seconds` each (Kafka's Rate over a WindowedSum). A request records its bytes; when the
rate then exceeds the quota, the throttle time is the time that brings the rate back to the quota if nothing
more is recorded. The response carries it as ThrottleTimeMs and the connection stops reading for that long
(KIP-219: answer at once, then mute the channel).

Which quota applies is Kafka's DefaultQuotaCallback precedence, most specific first:
user+client-id, user+default client-id, user, default user+client-id, default user+default client-id,
default user, client-id, default client-id. The level that matches also decides who shares the sensor:
a client-id quota is shared by every user of that client id, a user quota by every client of that user.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from shoal.broker.storage.client_quotas import CLIENT_ID, USER, ClientQuotaStore
from shoal.protocol import messages
from shoal.protocol.codec import MessageBase

if TYPE_CHECKING:
    from shoal.broker.common.metrics import BrokerMetrics

log = structlog.get_logger("shoal.quotas")

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
# Kafka expires a client's sensors after an hour without a record.
INACTIVE_SENSOR_EXPIRATION_MS = 3600 * 1000

# The eight levels in Kafka's order: (user part, client-id part) where "name" is the request's own name,
# "default" the type's default entity and None an entity without that type.
_LEVELS: tuple[tuple[str | None, str | None], ...] = (
    ("name", "name"), ("name", "default"), ("name", None), ("default", "name"),
    ("default", "default"), ("default", None), (None, "name"), (None, "default"),
)


class _Sample:
    __slots__ = ("start_ms", "last_event_ms", "value", "event_count")

    def __init__(self, now_ms: int) -> None:
        self.reset(now_ms)

    def reset(self, now_ms: int) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0.0
        self.event_count = 0


class SampledRate:
    """Kafka's `Rate` over a `WindowedSum`: values per second over a ring of `samples` + 1 time windows.

    A sample ends `window_ms` after it started; samples whose last event is older than `samples * window_ms`
    are reset. The rate divides the retained sum by the time since the oldest sample started, counted as at
    least `samples - 1` whole windows, so a fresh burst is spread over the full quota window.
    """

    def __init__(self, samples: int, window_ms: int) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError("a rate needs at least one sample of at least 1 ms")
        self.samples = samples
        self.window_ms = window_ms
        self._ring: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.event_count += 1
        sample.last_event_ms = now_ms

    def measure(self, now_ms: int) -> float:
        """Values per second at `now_ms`."""
        window = self.window_size_ms(now_ms)
        return sum(s.value for s in self._ring) / (window / 1000.0)

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        oldest = min((s.start_ms for s in self._ring), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = elapsed // self.window_ms
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_ms
        return max(elapsed, 1)

    def last_event_ms(self) -> int | None:
        return max((s.last_event_ms for s in self._ring), default=None)

    def _current_sample(self, now_ms: int) -> _Sample:
        if not self._ring:
            self._ring.append(_Sample(now_ms))
        return self._ring[self._current]

    def _advance(self, now_ms: int) -> _Sample:
        # One sample more than configured: the oldest may overlap the start of the monitored window.
        self._current = (self._current + 1) % (self.samples + 1)
        if self._current >= len(self._ring):
            sample = _Sample(now_ms)
            self._ring.append(sample)
            return sample
        sample = self._ring[self._current]
        sample.reset(now_ms)
        return sample

    def _purge(self, now_ms: int) -> None:
        expire_age = self.samples * self.window_ms
        for sample in self._ring:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)


def throttle_time_ms(rate: float, bound: float, window_ms: int) -> int:
    """Kafka's QuotaUtils.throttleTime: how long until `rate` over `window_ms` falls back to `bound`."""
    if rate <= bound:
        return 0
    return round((rate - bound) / bound * window_ms)


class ThrottledRequest(Protocol):
    """What quota enforcement needs of a request: who sent it and a way to mute its connection."""

    @property
    def quota_user(self) -> str: ...

    @property
    def quota_client_id(self) -> str: ...

    def throttle_connection(self, throttle_ms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Binding:
    """The sensor a (user, client-id) pair records into and the quota that bounds it, at one store generation."""

    tags: tuple[str, str]
    bound: float | None
    generation: int


class ClientQuotaManager:
    """One quota type (one quota key): the sensors of the clients it applies to and their throttle times."""

    def __init__(self, store: ClientQuotaStore, quota_key: str, samples: int, window_seconds: int,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.store = store
        self.quota_key = quota_key
        self.samples = samples
        self.window_ms = window_seconds * 1000
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self._sensors: dict[tuple[str, str], SampledRate] = {}
        self._bindings: dict[tuple[str, str], _Binding] = {}
        self._last_expiry_ms = self._clock_ms()

    def now_ms(self) -> int:
        return self._clock_ms()

    def quotas_enabled(self) -> bool:
        return self.store.has_quota_key(self.quota_key)

    def quota(self, user: str, client_id: str) -> float | None:
        """The bound that applies to this user and client id, None when none does."""
        return self._binding(user, client_id).bound

    def record_and_get_throttle_ms(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Record `value` for the pair's sensor; the throttle time its quota now asks for (0 within quota)."""
        if not self.quotas_enabled():
            return 0
        binding = self._binding(user, client_id)
        sensor = self._sensor(binding.tags)
        sensor.record(value, now_ms)
        self._expire_sensors(now_ms)
        if binding.bound is None:
            return 0
        window = sensor.window_size_ms(now_ms)
        rate = sensor.measure(now_ms)
        throttle = throttle_time_ms(rate, binding.bound, window)
        if throttle > 0:
            log.debug("quota violated", quota=self.quota_key, user=binding.tags[0], client_id=binding.tags[1],
                      rate=round(rate), bound=binding.bound, throttle_ms=throttle)
        return throttle

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take back a recorded value (a throttled fetch sends no records, so its bytes do not count)."""
        if not self.quotas_enabled():
            return
        self._sensor(self._binding(user, client_id).tags).record(-value, now_ms)

    def max_value_in_quota_window(self, user: str, client_id: str) -> float:
        """The most one request may record without being throttled for it alone (caps a fetch's size)."""
        if not self.quotas_enabled():
            return float("inf")
        bound = self._binding(user, client_id).bound
        if bound is None:
            return float("inf")
        return bound * (self.samples - 1) * self.window_ms / 1000

    def _binding(self, user: str, client_id: str) -> _Binding:
        generation = self.store.generation
        cached = self._bindings.get((user, client_id))
        if cached is not None and cached.generation == generation:
            return cached
        if len(self._bindings) > 10_000:
            self._bindings.clear()
        binding = self._resolve(user, client_id, generation)
        self._bindings[(user, client_id)] = binding
        return binding

    def _resolve(self, user: str, client_id: str, generation: int) -> _Binding:
        for user_part, client_part in _LEVELS:
            entity: list[tuple[str, str | None]] = []
            if user_part is not None:
                entity.append((USER, user if user_part == "name" else None))
            if client_part is not None:
                entity.append((CLIENT_ID, client_id if client_part == "name" else None))
            bound = self.store.value(tuple(entity), self.quota_key)
            if bound is not None:
                tags = (user if user_part is not None else "", client_id if client_part is not None else "")
                return _Binding(tags, bound, generation)
        return _Binding(("", client_id), None, generation)

    def _sensor(self, tags: tuple[str, str]) -> SampledRate:
        sensor = self._sensors.get(tags)
        if sensor is None:
            sensor = self._sensors[tags] = SampledRate(self.samples, self.window_ms)
        return sensor

    def _expire_sensors(self, now_ms: int) -> None:
        if now_ms - self._last_expiry_ms < 60_000:
            return
        self._last_expiry_ms = now_ms
        for tags, sensor in list(self._sensors.items()):
            last = sensor.last_event_ms()
            if last is None or now_ms - last >= INACTIVE_SENSOR_EXPIRATION_MS:
                del self._sensors[tags]


class ClientQuotas:
    """The produce and fetch quota managers, and the one call each handler makes per request."""

    def __init__(self, store: ClientQuotaStore, samples: int, window_seconds: int,
                 clock_ms: Callable[[], int] | None = None, metrics: BrokerMetrics | None = None) -> None:
        self.produce = ClientQuotaManager(store, PRODUCER_BYTE_RATE, samples, window_seconds, clock_ms)
        self.fetch = ClientQuotaManager(store, CONSUMER_BYTE_RATE, samples, window_seconds, clock_ms)
        self.metrics = metrics

    def _throttled(self, request: ThrottledRequest, quota_type: str, throttle_ms: int) -> None:
        request.throttle_connection(throttle_ms)
        if self.metrics is not None:
            self.metrics.quota_throttle_time.labels(quota=quota_type).observe(throttle_ms / 1000)

    def throttle_produce(self, request: ThrottledRequest, request_size: int) -> int:
        """Record a Produce request's size; mute the connection when over quota. The throttle time in ms."""
        manager = self.produce
        if not manager.quotas_enabled():
            return 0  # no quota anywhere: nothing is recorded (Kafka's quotasEnabled), at the cost of one lookup
        throttle = manager.record_and_get_throttle_ms(request.quota_user, request.quota_client_id, request_size,
                                                      manager.now_ms())
        if throttle > 0:
            self._throttled(request, "Produce", throttle)
        return throttle

    def fetch_max_bytes(self, request: ThrottledRequest) -> float:
        """The most bytes a Fetch or ShareFetch may answer with before its own size alone would throttle it."""
        return self.fetch.max_value_in_quota_window(request.quota_user, request.quota_client_id)

    def throttle_fetch(self, request: ThrottledRequest, response: MessageBase, api_key: int, version: int) -> int:
        """Record a Fetch or ShareFetch response's encoded size (as Kafka, the whole response, not only its
        records). Over quota the connection is muted and the size taken back, because the caller then
        answers with no records (Kafka's throttled fetch response). The throttle time in ms."""
        manager = self.fetch
        if not manager.quotas_enabled():
            return 0  # no quota anywhere: the response is not measured at all
        size = messages.response_size(response, api_key, version)
        user, client_id = request.quota_user, request.quota_client_id
        now = manager.now_ms()
        throttle = manager.record_and_get_throttle_ms(user, client_id, size, now)
        if throttle > 0:
            manager.unrecord(user, client_id, size, now)
            # Kafka's quota type: ShareFetch records into the same Fetch sensor.
            self._throttled(request, "Fetch", throttle)
        return throttle
