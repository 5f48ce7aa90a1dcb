"""Prometheus metrics for the broker, on a registry of its own so several brokers can share a process in tests.

The families every request or append touches (requests and their latency, network bytes, records and bytes
appended, log flushes) are counted by the event loop into plain Python numbers: a prometheus_client
Counter or Histogram takes a lock per update, about 0.5 µs each and seven per small Produce. Only the
event loop writes them, so no lock is needed; `LoopMetricsCollector` turns them into the same families,
samples, labels and values at scrape time. The rarer families stay prometheus_client objects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from .share_metrics import ShareGroupMetrics

# The `le` label as prometheus_client writes it (the function has no annotations of its own).
_float_to_go_string: Callable[[float], str] = floatToGoString

# How long a scrape waits for the event loop to copy the values before it reads them from its own thread.
SNAPSHOT_TIMEOUT_S = 2.0

REQUEST_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

Snapshot = list[tuple[tuple[str, ...], Any]]  # (label values, copied values) per series of one family


def _use_created() -> bool:
    # prometheus_client's switch (PROMETHEUS_DISABLE_CREATED_SERIES, disable_created_metrics()).
    return bool(getattr(prometheus_metrics, "_use_created", True))


def _label_values(labelnames: tuple[str, ...], values: Sequence[object], kwargs: dict[str, object]
                  ) -> tuple[str, ...]:
    """Label values in `labelnames` order, as prometheus_client's `labels()` takes and checks them."""
    if values and kwargs:
        raise ValueError("Can't pass both *args and **kwargs")
    if kwargs:
        if sorted(kwargs) != sorted(labelnames):
            raise ValueError("Incorrect label names")
        return tuple(str(kwargs[name]) for name in labelnames)
    if len(values) != len(labelnames):
        raise ValueError("Incorrect label count")
    return tuple(str(v) for v in values)


class CounterChild:
    """One counter series; `inc` is the hot path."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value: float = 0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class HistogramChild:
    """One histogram series: a count per bucket (not cumulative; the scrape adds them up) and the sum."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount, as prometheus_client's linear search finds it.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Family:
    """A family written by the event loop only, with prometheus_client's labelling rules."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], Any] = {}
        # An unlabelled family is one series, there from the start as in prometheus_client.
        self.default: Any = None if self.labelnames else self.children.setdefault((), self._new_child())

    def _new_child(self) -> Any:
        raise NotImplementedError

    def _child(self, values: Sequence[object], kwargs: dict[str, object]) -> Any:
        if not self.labelnames:
            raise ValueError(f"No label names were set when constructing {self.name}")
        key = _label_values(self.labelnames, values, kwargs)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = self._new_child()
        return child

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def expose(self, snapshot: Snapshot) -> Metric:
        raise NotImplementedError


class LoopCounter(_Family):
    """A counter family. Callers keep the child of their labels: the lookup costs more than the count."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        # prometheus_client names the family without `_total` and its sample with it.
        super().__init__(name.removesuffix("_total"), documentation, labelnames)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def labels(self, *values: object, **kwargs: object) -> CounterChild:
        child: CounterChild = self._child(values, kwargs)
        return child

    def inc(self, amount: float = 1) -> None:
        """Count into the unlabelled series."""
        (self.default or self._child((), {})).inc(amount)

    def snapshot(self) -> Snapshot:
        return [(key, (child.value, child.created)) for key, child in list(self.children.items())]

    def expose(self, snapshot: Snapshot) -> Metric:
        family = Metric(self.name, self.documentation, "counter")
        created = _use_created()
        for key, (value, created_at) in snapshot:
            labels = dict(zip(self.labelnames, key, strict=True))
            family.add_sample(self.name + "_total", labels, float(value))
            if created:
                family.add_sample(self.name + "_created", labels, created_at)
        return family


class LoopHistogram(_Family):
    """A histogram family with prometheus_client's buckets (+Inf appended) and sample layout."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        self.bounds = bounds
        self._le = [_float_to_go_string(b) for b in bounds]
        super().__init__(name, documentation, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def labels(self, *values: object, **kwargs: object) -> HistogramChild:
        child: HistogramChild = self._child(values, kwargs)
        return child

    def observe(self, amount: float) -> None:
        (self.default or self._child((), {})).observe(amount)

    def snapshot(self) -> Snapshot:
        return [(key, (list(child.counts), child.sum, child.created)) for key, child in list(self.children.items())]

    def expose(self, snapshot: Snapshot) -> Metric:
        family = Metric(self.name, self.documentation, "histogram")
        created = _use_created()
        for key, (counts, total, created_at) in snapshot:
            labels = dict(zip(self.labelnames, key, strict=True))
            acc = 0.0
            for le, count in zip(self._le, counts, strict=True):
                acc += count
                family.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
            family.add_sample(self.name + "_count", labels, acc)
            if self.bounds[0] >= 0:
                family.add_sample(self.name + "_sum", labels, total)
            if created:
                family.add_sample(self.name + "_created", labels, created_at)
        return family


class LoopMetricsCollector(Collector):
    """Exposes the loop-written families. A scrape runs on prometheus_client's HTTP thread: it asks the
    event loop for a copy of every value, so one scrape sees them all at the same instant (a request's
    count and its latency observation together); off any loop, or when the loop does not answer in
    time, it copies them itself."""

    def __init__(self, families: Sequence[_Family]) -> None:
        self.families = list(families)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Name the loop that writes the families (call on that loop's thread)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def describe(self) -> list[Metric]:
        return [f.expose([]) for f in self.families]

    def collect(self) -> Iterator[Metric]:
        for family, snapshot in zip(self.families, self._snapshot(), strict=True):
            yield family.expose(snapshot)

    def _read(self) -> list[Snapshot]:
        return [f.snapshot() for f in self.families]

    def _snapshot(self) -> list[Snapshot]:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread or loop.is_closed() or not loop.is_running():
            return self._read()
        result: concurrent.futures.Future[list[Snapshot]] = concurrent.futures.Future()

        def on_loop() -> None:
            if result.set_running_or_notify_cancel():
                result.set_result(self._read())

        try:
            loop.call_soon_threadsafe(on_loop)
            return result.result(timeout=SNAPSHOT_TIMEOUT_S)
        except (RuntimeError, TimeoutError):  # the loop closed meanwhile, or is stuck
            result.cancel()
            return self._read()


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Written by the event loop on every request or append (see the module's docstring).
        self.requests = LoopCounter("shoal_requests_total", "Requests handled, by API.", ["api"])
        self.request_latency = LoopHistogram(
            "shoal_request_latency_seconds",
            "Time from a request's arrival to its response, by API.",
            ["api"],
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.bytes_in = LoopCounter("shoal_network_bytes_in_total", "Bytes of requests received.")
        self.bytes_out = LoopCounter("shoal_network_bytes_out_total", "Bytes of responses sent.")
        self.messages_in = LoopCounter("shoal_messages_in_total", "Records appended to logs.", ["topic"])
        self.log_bytes_in = LoopCounter("shoal_log_bytes_in_total", "Record batch bytes appended.", ["topic"])
        self.log_fsyncs = LoopCounter("shoal_log_flushes_total", "Fsyncs of partition logs.")
        self.loop_collector = LoopMetricsCollector([
            self.requests, self.request_latency, self.bytes_in, self.bytes_out, self.messages_in,
            self.log_bytes_in, self.log_fsyncs,
        ])
        r.register(self.loop_collector)
        self.request_errors = Counter(
            "shoal_request_errors_total", "Requests that closed the connection or failed, by API.", ["api"], registry=r
        )
        self.connections = Gauge("shoal_connections", "Open client connections.", registry=r)
        self.quota_throttle_time = Histogram(
            "shoal_client_quota_throttle_time_seconds",
            "Throttle times given to clients over a byte-rate quota, by quota type (Produce, Fetch).",
            ["quota"], buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, float("inf")), registry=r,
        )
        # KIP-932 share-group metrics; the scrape-time part is registered by the broker once wired.
        self.share = ShareGroupMetrics(r)
        self.http_server: Any = None
        # Each request counts into its API's children; looking them up by label costs more than the count.
        self._per_api: dict[str, tuple[CounterChild, HistogramChild]] = {}

    def observe_request(self, api: str, seconds: float) -> None:
        children = self._per_api.get(api)
        if children is None:
            children = self._per_api[api] = (self.requests.labels(api=api), self.request_latency.labels(api=api))
        children[0].value += 1
        children[1].observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint (in its own thread, off the event loop); returns the bound port.
        Called on the event loop, which the scrapes then ask for their snapshot."""
        try:
            self.loop_collector.bind(asyncio.get_running_loop())
        except RuntimeError:
            pass  # no loop: scrapes read the values from their own thread
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.http_server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server = None
