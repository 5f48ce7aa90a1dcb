"""What sidecar mode counts about the upstream: request latency and failures by API and upstream broker,
the error codes the upstream answered by API, leadership errors, and the batch cache's hits and misses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from shoal.protocol.codec import MessageBase
from shoal.protocol.errors import ErrorCode


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
        self.response_errors = Counter(
            "shoal_upstream_response_errors_total",
            "Error codes in the upstream's answers, by API and error (each partition, topic or group answered "
            "with an error counts once).",
            ["api", "error"], registry=r,
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

    def observe_response(self, api: str, response: Any) -> None:
        """Count the error codes anywhere in an upstream answer."""
        if not isinstance(response, MessageBase):
            return
        for code in error_codes(response):
            self.response_errors.labels(api=api, error=_error_name(code)).inc()


# Per message class: its error-code fields, and the fields that may hold nested structs (lists or optional
# structs). Worked out once per class, since every upstream answer is walked.
_LAYOUT: dict[type[MessageBase], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _layout(cls: type[MessageBase]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found = _LAYOUT.get(cls)
    if found is None:
        codes = tuple(f for f in cls._fields if f == "error_code" or f.endswith("_error_code"))
        nested = tuple(f for f, default in zip(cls._fields, cls._defaults, strict=True)
                       if f in cls._factories or default is None)
        found = _LAYOUT[cls] = (codes, nested)
    return found


def error_codes(message: MessageBase) -> Iterator[int]:
    """Every error code other than NONE in a message and the structs inside it."""
    codes, nested = _layout(type(message))
    for name in codes:
        code = getattr(message, name)
        if code:
            yield int(code)
    for name in nested:
        value = getattr(message, name)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, MessageBase):
                    yield from error_codes(item)
        elif isinstance(value, MessageBase):
            yield from error_codes(value)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
