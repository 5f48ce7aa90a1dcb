"""The Prometheus endpoint of a running broker reflects the traffic it served."""

from __future__ import annotations

import time
import urllib.request
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from .broker_process import BrokerProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(broker: BrokerProcess) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, sorted labels), and each family's type."""
    assert broker.metrics_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
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
