"""Client quotas enforced: producer_byte_rate and consumer_byte_rate set through AlterClientQuotas throttle the
clients they apply to (ThrottleTimeMs in Produce and Fetch, the connection muted meanwhile), matched by user
and client id with Kafka's precedence, and leave other clients alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient, alter_client_quota, produce
from .names import unique_name
from .share_clients import Consumed, poll_until, set_group_config
from .test_metrics import scrape_text

PAYLOAD = b"x" * 2000


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Two one-second samples: a quota's window is short, so a throttled client is soon let through again.
    proc = BrokerProcess(tmp_path_factory.mktemp("quotas") / "data",
                         overrides=["quota.window.num=2", "quota.window.size.seconds=1"]).start()
    yield proc
    proc.stop()


def _topic(bootstrap: str) -> str:
    topic = unique_name("quota")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def _set_quota(bootstrap: str, key: str, value: float | None, **entity: str | None) -> None:
    with WireClient.connect(bootstrap) as wire:
        ops = [(key, 0.0, True)] if value is None else [(key, value, False)]
        assert alter_client_quota(wire, ops, **entity).error_code == ErrorCode.NONE


def _produce_all(bootstrap: str, client_id: str, topic: str, count: int) -> list[Any]:
    """Produce `count` records one request at a time; the throttle events the client reported."""
    events: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 0,
                         "throttle_cb": events.append})
    for _ in range(count):
        producer.produce(topic, PAYLOAD)
        producer.flush(60)
    producer.poll(0)
    return events


def _raw_produce(wire: WireClient, topic: str, size: int) -> Any:
    return produce(wire, topic, encode_batch([RecordInput(value=b"y" * size)]), acks=1)


def test_producer_over_its_client_id_quota_is_throttled(quota_broker: BrokerProcess) -> None:
    bootstrap = quota_broker.bootstrap
    topic = _topic(bootstrap)
    slow, other = unique_name("slow"), unique_name("other")
    _set_quota(bootstrap, "producer_byte_rate", 1000.0, client_id=slow)
    throttled = _produce_all(bootstrap, slow, topic, 2)
    # librdkafka reports each throttle time the broker sends, and a 0 when throttling ends.
    assert any(e.throttle_time > 0 for e in throttled)
    # A client id the quota does not name is not throttled, on the same broker at the same time.
    assert _produce_all(bootstrap, other, topic, 2) == []
    # Every record was still accepted: a quota delays a client, it never refuses its data.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("g")})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got = 0
        deadline = time.monotonic() + 30
        while got < 4 and time.monotonic() < deadline:
            got += len(consumer.consume(4, 1.0))
        assert got == 4
    finally:
        consumer.close()


def test_throttle_time_is_reported_and_the_connection_muted(quota_broker: BrokerProcess) -> None:
    bootstrap = quota_broker.bootstrap
    topic = _topic(bootstrap)
    client = unique_name("raw")
    _set_quota(bootstrap, "producer_byte_rate", 1000.0, client_id=client)
    with WireClient.connect(bootstrap, client_id=client) as wire:
        sent_at = time.monotonic()
        first = _raw_produce(wire, topic, 2000)
        assert first.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        throttle_ms = first.throttle_time_ms
        assert throttle_ms > 0
        # The next request is not read before the throttle time has passed since the first was answered.
        second = _raw_produce(wire, topic, 10)
        assert time.monotonic() - sent_at >= throttle_ms / 1000
        assert second.responses[0].partition_responses[0].error_code == ErrorCode.NONE
    families = {f.name: f for f in text_string_to_metric_families(scrape_text(quota_broker))}
    counts = {s.labels["quota"]: s.value for s in families["shoal_client_quota_throttle_time_seconds"].samples
              if s.name.endswith("_count")}
    assert counts["Produce"] >= 1
    # Once the quota is removed the same client is not throttled any more.
    _set_quota(bootstrap, "producer_byte_rate", None, client_id=client)
    with WireClient.connect(bootstrap, client_id=client) as wire:
        assert _raw_produce(wire, topic, 5000).throttle_time_ms == 0


def test_consumer_quota_by_default_user_and_a_more_specific_override(quota_broker: BrokerProcess) -> None:
    bootstrap = quota_broker.bootstrap
    topic = _topic(bootstrap)
    assert _produce_all(bootstrap, unique_name("seed"), topic, 4) == []
    fast = unique_name("fast")
    # Every user (here ANONYMOUS, on a PLAINTEXT listener) gets 5000 B/s, except this user with client id `fast`.
    # (A fetch is capped at what one window allows, 5000 bytes here: two of the 2000-byte records.)
    _set_quota(bootstrap, "consumer_byte_rate", 5000.0, user=None)
    _set_quota(bootstrap, "consumer_byte_rate", 1e9, user="ANONYMOUS", client_id=fast)
    try:
        def consume(client_id: str) -> tuple[int, list[Any]]:
            events: list[Any] = []
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("g"), "client.id": client_id,
                                 "auto.offset.reset": "earliest", "throttle_cb": events.append})
            try:
                consumer.subscribe([topic])
                got = 0
                deadline = time.monotonic() + 60
                while got < 4 and time.monotonic() < deadline:
                    got += len(consumer.consume(4, 0.5))
                consumer.poll(0)
                return got, events
            finally:
                consumer.close()

        got, events = consume(unique_name("slow"))
        assert got == 4
        assert any(e.throttle_time > 0 for e in events)
        got, events = consume(fast)
        assert got == 4 and events == []
    finally:
        _set_quota(bootstrap, "consumer_byte_rate", None, user=None)
        _set_quota(bootstrap, "consumer_byte_rate", None, user="ANONYMOUS", client_id=fast)


def test_share_consumer_over_its_quota_is_throttled_and_still_gets_every_record(quota_broker: BrokerProcess) -> None:
    """consumer_byte_rate applies to ShareFetch as to Fetch (Kafka's KafkaApis.handleShareFetchRequest): a
    share consumer over it is told ThrottleTimeMs, and the records of a throttled answer are not lost."""
    bootstrap = quota_broker.bootstrap
    topic = _topic(bootstrap)
    group, client_id = unique_name("share-quota"), unique_name("share-slow")
    set_group_config(bootstrap, group, share_auto_offset_reset="earliest")
    # Each 2000-byte record in a batch of its own; one quota window (3000 bytes) holds one of them.
    assert _produce_all(bootstrap, unique_name("seed"), topic, 4) == []
    _set_quota(bootstrap, "consumer_byte_rate", 3000.0, client_id=client_id)
    events: list[Any] = []
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                              "throttle_cb": events.append})
    consumer.subscribe([topic])
    try:
        sink = Consumed()
        poll_until(consumer, lambda: len({r[1] for r in sink.records}) >= 4, sink, 60)
        consumer.poll(0)
    finally:
        consumer.close()
        _set_quota(bootstrap, "consumer_byte_rate", None, client_id=client_id)
    assert sorted({r[1] for r in sink.records}) == list(range(4))
    assert all(r[2] == PAYLOAD for r in sink.records)
    assert any(e.throttle_time > 0 for e in events)
    # Only an answer with records can go over the quota here, so some record was withheld from a throttled
    # answer: it came again, one delivery later.
    assert any(r[3] > 1 for r in sink.records)
