"""Sidecar mode over librdkafka's mock cluster: three upstream brokers with the partition leaders spread
over them (partition i on broker i + 1), and a leader moved in the middle of a stream. The client knows
only the sidecar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .names import unique_name
from .rdkafka_mock import MockCluster

PARTITIONS = 3


@pytest.fixture
def mock() -> Iterator[MockCluster]:
    cluster = MockCluster(3)
    yield cluster
    cluster.close()


@pytest.fixture
def sidecar(tmp_path: Path, mock: MockCluster) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", overrides=[f"upstream.bootstrap.servers={mock.bootstrap}"]).start()
    yield proc
    proc.stop()


def test_a_leader_moved_mid_stream_costs_the_client_nothing_but_retries(mock: MockCluster,
                                                                        sidecar: BrokerProcess) -> None:
    topic = unique_name("moving")
    mock.create_topic(topic, PARTITIONS)
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": sidecar.bootstrap, "enable.idempotence": True, "linger.ms": 2,
                         "message.timeout.ms": 60_000})
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    moved = []
    for i in range(3000):
        partition = i % PARTITIONS
        value = f"record-{i}".encode()
        producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
        sent[partition].append(value)
        if i % 500 == 499:
            producer.flush(30)
            # Each partition's leader moves to the next broker (mock broker ids start at 1).
            for p in range(PARTITIONS):
                target = (i // 500 + p) % 3 + 1
                mock.set_leader(topic, p, target)
                moved.append((p, target))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    assert moved

    # The sidecar names itself as every partition's leader, whichever upstream broker leads it now.
    with WireClient.connect(sidecar.bootstrap) as client:
        md = client.request(ApiKey.METADATA, 9, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
    assert [b.port for b in md.brokers] == [sidecar.port]

    consumer = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": unique_name("unused"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    count = idle = 0
    moved_again = False
    while count < 3000 and idle < 60:
        msg = consumer.poll(0.5)
        if msg is None:
            idle += 1
            continue
        assert msg.error() is None, msg.error()
        got[msg.partition()].append(msg.value())
        count += 1
        if count == 1500 and not moved_again:
            for p in range(PARTITIONS):
                mock.set_leader(topic, p, (p + 2) % 3 + 1)
            moved_again = True
    consumer.close()
    # Nothing lost, nothing twice, each partition in order, across the moves on both paths.
    assert got == sent


def test_a_fetch_over_several_leaders_answers_with_the_first_leader_that_has_records(
        mock: MockCluster, sidecar: BrokerProcess) -> None:
    topic = unique_name("spread")
    mock.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": sidecar.bootstrap})
    for i in range(5):
        producer.produce(topic, value=f"only-p0-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    fetch = messages.FetchRequest
    # Partitions 1 and 2 are empty and their leaders would hold the request for the whole (ten-minute) wait:
    # the answer comes with partition 0's records instead, long before the client's own timeout.
    with WireClient.connect(sidecar.bootstrap, timeout=60) as client:
        response = client.request(ApiKey.FETCH, 11, fetch(
            replica_id=-1, max_wait_ms=600_000, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[fetch.FetchTopic(topic=topic, partitions=[fetch.FetchPartition(
                partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=1 << 20) for p in range(PARTITIONS)])], forgotten_topics_data=[], rack_id=""))
    parts = {p.partition_index: p for p in response.responses[0].partitions}
    assert sorted(parts) == [0, 1, 2]
    assert all(p.error_code == 0 for p in parts.values())
    assert parts[0].high_watermark == 5 and len(parts[0].records or b"") > 0
    assert not parts[1].records and not parts[2].records


def test_topic_id_requests_reach_an_upstream_that_only_knows_names(mock: MockCluster, sidecar: BrokerProcess) -> None:
    """Produce v13 names topics by id only; the mock serves Produce up to v10, so the sidecar sends the name."""
    topic = unique_name("by-id")
    mock.create_topic(topic, 1)
    produce = messages.ProduceRequest
    fetch = messages.FetchRequest
    with WireClient.connect(sidecar.bootstrap) as client:
        md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
        topic_id = md.topics[0].topic_id
        assert topic_id != bytes(16)
        produced = client.request(ApiKey.PRODUCE, 13, produce(acks=-1, timeout_ms=10_000, topic_data=[
            produce.TopicProduceData(topic_id=topic_id, partition_data=[produce.PartitionProduceData(
                index=0, records=encode_batch([RecordInput(b"k", b"found by id")]))])]))
        fetched = client.request(ApiKey.FETCH, 13, fetch(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[fetch.FetchTopic(topic_id=topic_id, partitions=[fetch.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""))
    (pt,) = produced.responses
    assert pt.topic_id == topic_id
    assert [(p.index, p.error_code, p.base_offset) for p in pt.partition_responses] == [(0, 0, 0)]
    (ft,) = fetched.responses
    (part,) = ft.partitions
    assert ft.topic_id == topic_id and part.error_code == 0 and part.high_watermark == 1
    assert b"found by id" in bytes(part.records or b"")
