"""The loop-written broker metrics expose what prometheus_client's own Counter and Histogram did for the same
events: the same families, types, help, sample names, labels and values (only the `_created` timestamps
differ, being taken a moment apart)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from shoal.broker.common.metrics import REQUEST_LATENCY_BUCKETS, BrokerMetrics, LoopCounter, LoopHistogram


@dataclass
class Reference:
    """The families as the broker defined them with prometheus_client's locked Counter and Histogram."""

    registry: CollectorRegistry
    requests: Counter
    request_latency: Histogram
    bytes_in: Counter
    bytes_out: Counter
    messages_in: Counter
    log_bytes_in: Counter
    log_fsyncs: Counter


def reference() -> Reference:
    r = CollectorRegistry()
    return Reference(
        r,
        Counter("shoal_requests_total", "Requests handled, by API.", ["api"], registry=r),
        Histogram("shoal_request_latency_seconds", "Time from a request's arrival to its response, by API.",
                  ["api"], registry=r, buckets=REQUEST_LATENCY_BUCKETS),
        Counter("shoal_network_bytes_in_total", "Bytes of requests received.", registry=r),
        Counter("shoal_network_bytes_out_total", "Bytes of responses sent.", registry=r),
        Counter("shoal_messages_in_total", "Records appended to logs.", ["topic"], registry=r),
        Counter("shoal_log_bytes_in_total", "Record batch bytes appended.", ["topic"], registry=r),
        Counter("shoal_log_flushes_total", "Fsyncs of partition logs.", registry=r),
    )


APIS = ("Produce", "Fetch", "Metadata", "ShareFetch")
TOPICS = st.text("abcXYZ019._-", min_size=1, max_size=8)
SECONDS = st.one_of(st.floats(min_value=0, max_value=100, allow_nan=False), st.sampled_from(REQUEST_LATENCY_BUCKETS))
AMOUNT = st.integers(min_value=0, max_value=10**9)
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from(APIS), SECONDS),
    st.tuples(st.just("bytes_in"), AMOUNT),
    st.tuples(st.just("bytes_out"), AMOUNT),
    st.tuples(st.just("append"), TOPICS, AMOUNT, AMOUNT),
    st.tuples(st.just("fsync"), st.integers(min_value=1, max_value=8)),
), max_size=60)


def apply(events: list[tuple], new: BrokerMetrics, old: Reference) -> None:
    """Each event as the broker's callers report it (connection, partition log, produce) to both."""
    for event in events:
        match event:
            case ("request", api, seconds):
                new.observe_request(api, seconds)
                old.requests.labels(api=api).inc()
                old.request_latency.labels(api=api).observe(seconds)
            case ("bytes_in", n):
                new.bytes_in.inc(n)
                old.bytes_in.inc(n)
            case ("bytes_out", n):
                new.bytes_out.inc(n)
                old.bytes_out.inc(n)
            case ("append", topic, records, size):
                new.messages_in.labels(topic=topic).inc(records)
                new.log_bytes_in.labels(topic=topic).inc(size)
                old.messages_in.labels(topic=topic).inc(records)
                old.log_bytes_in.labels(topic=topic).inc(size)
            case ("fsync", n):
                new.log_fsyncs.inc(n)
                old.log_fsyncs.inc(n)


CREATED = re.compile(rb"^(\S+_created(?:\{.*\})?) \S+$", re.MULTILINE)


def exposition(registry: CollectorRegistry) -> dict[str, bytes]:
    """The text exposition per family (families in any order), `_created` values masked."""
    text = CREATED.sub(rb"\1 <created>", generate_latest(registry))
    families = re.split(rb"(?m)^(?=# HELP )", text)
    return {f.split(b" ", 3)[2].decode(): f for f in families if f}


def loop_families(metrics: BrokerMetrics) -> CollectorRegistry:
    only = CollectorRegistry()
    only.register(metrics.loop_collector)
    return only


@settings(max_examples=150, deadline=None)
@given(EVENTS)
def test_exposition_equals_prometheus_client_counters(events: list[tuple]) -> None:
    new, old = BrokerMetrics(), reference()
    apply(events, new, old)
    assert exposition(loop_families(new)) == exposition(old.registry)
    # Through the broker's own registry too, as `get_sample_value` and the HTTP endpoint read it.
    for metric in old.registry.collect():
        for sample in metric.samples:
            if not sample.name.endswith("_created"):
                assert new.registry.get_sample_value(sample.name, sample.labels) == sample.value, sample


def test_created_series_follow_prometheus_client() -> None:
    new, old = BrokerMetrics(), reference()
    apply([("request", "Produce", 0.001), ("append", "t", 3, 100)], new, old)
    names = {(s.name, tuple(s.labels.items())) for m in loop_families(new).collect() for s in m.samples}
    assert names == {(s.name, tuple(s.labels.items())) for m in old.registry.collect() for s in m.samples}
    assert ("shoal_request_latency_seconds_created", (("api", "Produce"),)) in names


def test_labels_checked_as_prometheus_client() -> None:
    counter = LoopCounter("x_total", "x", ["topic"])
    assert counter.labels(topic="t") is counter.labels("t")
    for bad in ({"api": "t"}, {"topic": "t", "api": "u"}):
        with pytest.raises(ValueError):
            counter.labels(**bad)
    with pytest.raises(ValueError):
        counter.inc()  # a labelled family has no series of its own
    with pytest.raises(ValueError):
        counter.labels(topic="t").inc(-1)
    with pytest.raises(ValueError):
        LoopHistogram("h", "h", buckets=(2, 1))
    # The broker's registry refuses a second family of the same name, as for any collector.
    metrics = BrokerMetrics()
    with pytest.raises(ValueError):
        Counter("shoal_requests_total", "again", registry=metrics.registry)


async def test_scrape_from_another_thread_reads_on_the_loop() -> None:
    metrics = BrokerMetrics()
    metrics.loop_collector.bind(asyncio.get_running_loop())
    metrics.observe_request("Produce", 0.002)
    metrics.bytes_in.inc(10)

    def scrape() -> tuple[float | None, float | None]:
        r = metrics.registry
        return (r.get_sample_value("shoal_requests_total", {"api": "Produce"}),
                r.get_sample_value("shoal_network_bytes_in_total"))

    # The scrape thread waits for the loop to copy the values; the loop is free (awaiting the thread).
    assert await asyncio.to_thread(scrape) == (1.0, 10.0)
    # On the loop's own thread the values are read directly (waiting for itself would never end).
    assert scrape() == (1.0, 10.0)
