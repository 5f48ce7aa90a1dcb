"""What sidecar mode counts about the upstream: request latency and failures by API and upstream broker,
leadership and coordinator errors the upstream answered, and the batch cache's hits and misses."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class UpstreamMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.request_latency = Histogram(
            "shoal_upstream_request_latency_seconds",
            "Time from sending a request to the upstream to its answer, by API and upstream broker.",
            ["api", "broker"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.request_failures = Counter(
            "shoal_upstream_request_failures_total",
            "Requests to the upstream that got no answer (unreachable, closed, timed out), by API and broker.",
            ["api", "broker"], registry=r,
        )
        self.leadership_errors = Counter(
            "shoal_upstream_leadership_errors_total",
            "Partitions the upstream answered with a leadership error (the sidecar re-read its metadata).",
            registry=r,
        )
        self.metadata_refreshes = Counter(
            "shoal_upstream_metadata_refreshes_total", "Reads of the upstream's metadata by the sidecar itself.",
            registry=r,
        )
        self.forwarded_fetch_bytes = Counter(
            "shoal_upstream_forwarded_fetch_bytes_total",
            "Record bytes of upstream Fetch answers the sidecar passed on to its clients, by topic.",
            ["topic"], registry=r,
        )
        self.cache_hits = Counter(
            "shoal_upstream_batch_cache_hits_total", "Upstream partition reads answered from the batch cache.",
            registry=r,
        )
        self.cache_misses = Counter(
            "shoal_upstream_batch_cache_misses_total", "Upstream partition reads the batch cache could not answer.",
            registry=r,
        )
