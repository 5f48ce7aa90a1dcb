"""Prometheus metrics for the broker, on a registry of its own so several brokers can share a process in tests."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .share_metrics import ShareGroupMetrics


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("shoal_requests_total", "Requests handled, by API.", ["api"], registry=r)
        self.request_errors = Counter(
            "shoal_request_errors_total", "Requests that closed the connection or failed, by API.", ["api"], registry=r
        )
        self.request_latency = Histogram(
            "shoal_request_latency_seconds",
            "Time from a request's arrival to its response, by API.",
            ["api"],
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.bytes_in = Counter("shoal_network_bytes_in_total", "Bytes of requests received.", registry=r)
        self.bytes_out = Counter("shoal_network_bytes_out_total", "Bytes of responses sent.", registry=r)
        self.connections = Gauge("shoal_connections", "Open client connections.", registry=r)
        self.messages_in = Counter("shoal_messages_in_total", "Records appended to logs.", ["topic"], registry=r)
        self.log_bytes_in = Counter("shoal_log_bytes_in_total", "Record batch bytes appended.", ["topic"], registry=r)
        self.log_fsyncs = Counter("shoal_log_flushes_total", "Fsyncs of partition logs.", registry=r)
        self.quota_throttle_time = Histogram(
            "shoal_client_quota_throttle_time_seconds",
            "Throttle times given to clients over a byte-rate quota, by quota type (Produce, Fetch).",
            ["quota"], buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, float("inf")), registry=r,
        )
        # KIP-932 share-group metrics; the scrape-time part is registered by the broker once wired.
        self.share = ShareGroupMetrics(r)
        self.http_server: Any = None
        # Each request counts into its API's children; looking them up by label costs more than the count.
        self._per_api: dict[str, tuple[Any, Any]] = {}

    def observe_request(self, api: str, seconds: float) -> None:
        children = self._per_api.get(api)
        if children is None:
            children = self._per_api[api] = (self.requests.labels(api=api), self.request_latency.labels(api=api))
        children[0].inc()
        children[1].observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint (in its own thread, off the event loop); returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.http_server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server = None
