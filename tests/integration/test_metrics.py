"""The Prometheus endpoint of a running broker reflects the traffic it served."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from .broker_process import BrokerProcess
from .share_clients import Consumed, poll_until, set_group_config, share_consumer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "shoal-dashboard.json"
# The millisecond families of the previous release, kept one more release as aliases of these.
DEPRECATED_MS = {
    "shoal_group_coordinator_partition_load_time_ms": "shoal_group_coordinator_partition_load_time_seconds",
    "shoal_group_coordinator_partition_load_time_max_ms": "shoal_group_coordinator_partition_load_time_max_seconds",
    "shoal_share_coordinator_partition_load_time_ms": "shoal_share_coordinator_partition_load_time_seconds",
    "shoal_share_coordinator_partition_load_time_max_ms": "shoal_share_coordinator_partition_load_time_max_seconds",
    "shoal_share_coordinator_write_latency_ms": "shoal_share_coordinator_write_latency_seconds",
    "shoal_share_coordinator_write_latency_max_ms": "shoal_share_coordinator_write_latency_max_seconds",
    "shoal_share_partition_oldest_acquired_age_ms": "shoal_share_partition_oldest_acquired_age_seconds",
}


def scrape_text(broker: BrokerProcess) -> str:
    assert broker.metrics_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def scrape(broker: BrokerProcess) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, sorted labels), and each family's type."""
    text = scrape_text(broker)
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def produce_and_fetch(broker: BrokerProcess, topic: str, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=10)[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v" * 100)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"unused-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < count and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
        assert got == count
        # While this consumer is connected, the gauge counts at least its connection.
        samples, _ = scrape(broker)
        assert samples[("shoal_connections", ())] >= 1
    finally:
        consumer.close()


def test_metrics_reflect_traffic(broker: BrokerProcess) -> None:
    before, _ = scrape(broker)
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    produce_and_fetch(broker, topic, 500)
    samples, types = scrape(broker)

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def grew(name: str, **labels: str) -> bool:
        key = (name, tuple(sorted(labels.items())))
        return samples.get(key, 0.0) > before.get(key, 0.0)

    assert types["shoal_requests"] == "counter"
    assert grew("shoal_requests_total", api="Produce")
    assert grew("shoal_requests_total", api="Fetch")
    assert grew("shoal_requests_total", api="Metadata")
    assert grew("shoal_requests_total", api="CreateTopics")

    assert types["shoal_request_latency_seconds"] == "histogram"
    produce_count = value("shoal_request_latency_seconds_count", api="Produce")
    assert produce_count == value("shoal_requests_total", api="Produce")
    assert value("shoal_request_latency_seconds_sum", api="Produce") > 0
    # Cumulative buckets: non-decreasing, ending at +Inf with every observation.
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in samples.items()
        if name == "shoal_request_latency_seconds_bucket" and dict(labels).get("api") == "Produce"
    )
    assert len(buckets) > 2
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert buckets[-1] == (float("inf"), produce_count)

    assert grew("shoal_network_bytes_in_total")
    assert grew("shoal_network_bytes_out_total")
    # 500 records of 100-byte values went in and came back out.
    assert value("shoal_network_bytes_in_total") - before.get(("shoal_network_bytes_in_total", ()), 0.0) > 50_000
    assert value("shoal_network_bytes_out_total") - before.get(("shoal_network_bytes_out_total", ()), 0.0) > 50_000
    assert value("shoal_messages_in_total", topic=topic) == 500
    assert value("shoal_log_bytes_in_total", topic=topic) > 50_000
    assert types["shoal_connections"] == "gauge"
    assert ("shoal_connections", ()) in samples


def scrape_with_a_share_partition(broker: BrokerProcess) -> str:
    """The endpoint's text after some traffic, with a share partition in memory (its gauges are read at
    scrape time, so they exist only then)."""
    topic, group = f"names-{uuid.uuid4().hex[:8]}", f"names-{uuid.uuid4().hex[:8]}"
    produce_and_fetch(broker, topic, 10)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    consumer = share_consumer(broker.bootstrap, group, [topic])
    got = Consumed()
    try:
        poll_until(consumer, lambda: len(got) > 0, got, timeout=60)
    finally:
        consumer.close()
    assert len(got) > 0
    return scrape_text(broker)


def test_metric_names_follow_prometheus_conventions_and_docs_map_each_to_kafka(broker: BrokerProcess) -> None:
    """Base units (seconds, bytes), `_total` on counters; the ms names of the previous release only as
    deprecated aliases; and docs/metrics.md has a row for every family, naming Kafka's JMX bean (or saying
    Kafka has none)."""
    text = scrape_with_a_share_partition(broker)
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    # (prometheus_client also writes each counter's and histogram's creation time as a `_created` gauge.)
    shoal = {name: kind for name, kind in families.items() if name.startswith("shoal_") and not name.endswith("_created")}
    assert len(shoal) > 20
    for name, kind in shoal.items():
        if kind == "counter":
            # Whether or not the TYPE line carries `_total`, the samples do (a labelled counter that has
            # counted nothing yet has none).
            base = name.removesuffix("_total")
            assert {s.name for s in parsed[base].samples} <= {f"{base}_total", f"{base}_created"}, name
        if name in DEPRECATED_MS:
            assert helps[name].startswith("Deprecated alias of "), (name, helps[name])
            assert DEPRECATED_MS[name] in shoal and shoal[DEPRECATED_MS[name]] == kind
            continue
        # Time is in seconds, sizes in bytes: no other unit suffix.
        assert not re.search(r"_(ms|millis|milliseconds|us|kb|mb)(_|$)", name), name
        if re.search(r"latency|_time|duration|_age", name):
            assert name.endswith(("_seconds", "_max_seconds")), name
    documented = METRICS_DOC.read_text()
    rows = [line for line in documented.splitlines() if line.startswith("| ")]
    for name in shoal:
        exported = f"{name.removesuffix('_total')}_total" if shoal[name] == "counter" else name
        mentions = [row for row in rows if re.search(rf"(?<![a-z_]){exported}(?:_sum|_count|_bucket)?(?![a-z_])", row)]
        assert mentions, f"docs/metrics.md has no row for {exported}"
        if name in DEPRECATED_MS:
            continue
        assert any("kafka." in row or "…" in row or "no JMX bean" in row for row in mentions), (
            f"docs/metrics.md does not map {exported} to a Kafka JMX name")


def test_dashboard_queries_exported_families_with_request_panels_per_api(broker: BrokerProcess) -> None:
    """The Grafana dashboard reads only families the broker exports under their current names, and has
    request rate, latency percentiles, errors and connections per API next to the share-group panels."""
    text = scrape_with_a_share_partition(broker)
    exported = {name.removesuffix("_total") for name in re.findall(r"^# TYPE (\S+) ", text, re.M)}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {panel["title"]: [target["expr"] for target in panel.get("targets", [])] for panel in dashboard["panels"]}
    names = {m for e in sum(exprs.values(), []) for m in re.findall(r"shoal_\w+", e)}
    # A sample name is its family's, or the family's plus _total, _bucket, _sum or _count.
    used = {n if n in exported else re.sub(r"_(total|bucket|sum|count)$", "", n) for n in names}
    assert used and used <= exported, sorted(used - exported)
    assert not used & set(DEPRECATED_MS), sorted(used & set(DEPRECATED_MS))

    def panel(*words: str) -> list[str]:
        [found] = [e for title, e in exprs.items() if all(w.lower() in title.lower() for w in words)]
        return found

    assert any(re.search(r"sum by \(api\) \(rate\(shoal_requests_total", e) for e in panel("request rate"))
    latency = panel("request latency")
    assert {q for e in latency for q in re.findall(r"histogram_quantile\((0\.\d+), sum by \(le, api\) "
                                                   r"\(rate\(shoal_request_latency_seconds_bucket", e)} >= {"0.5", "0.99"}
    assert any("sum by (api) (rate(shoal_request_errors_total" in e for e in panel("request errors"))
    assert any(e.startswith("shoal_connections") for e in panel("connections"))
    titles = [p["title"] for p in dashboard["panels"]]
    assert titles.index("Requests (by API)") < titles.index("Group coordinator (share groups)")
