"""A read by offset (the Spark source's executors read their ranges so) rides out a leader it cannot reach
for a while: as Kafka's consumer, it asks the metadata again and retries until default.api.timeout.ms, instead
of failing its task after one request timeout. The broker is SIGKILLed and started again on the same port
after longer than the reader's request timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.client.consumer.offset_reader import OffsetReader
from shoal.client.errors import KafkaConnectionError

from .broker_process import BrokerProcess

TOPIC = "reader-leader-loss"


def _read_offsets(reader: OffsetReader, last: int) -> list[int]:
    offsets = []
    for _index, step in reader.read_ranges(TOPIC, 0, [(0, last)]):
        offsets += [o for header, _at in step.batches for o in range(header.base_offset, header.last_offset + 1)]
    return offsets


def _broker_with_records(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data").start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(TOPIC, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    return broker


def test_a_read_retries_a_leader_that_comes_back_within_the_api_timeout(tmp_path: Path) -> None:
    broker = _broker_with_records(tmp_path)
    config = {"request.timeout.ms": "1000", "reconnect.backoff.max.ms": "200", "default.api.timeout.ms": "30000"}
    try:
        with OffsetReader(broker.bootstrap, config=config) as reader:
            assert _read_offsets(reader, 9) == list(range(10))  # metadata and a connection to the leader
            broker.kill()
            # Back after three request timeouts: one timeout's retries alone would have failed the read.
            restart = threading.Timer(3.0, broker.start)
            restart.start()
            try:
                started = time.monotonic()
                assert _read_offsets(reader, 9) == list(range(10))
                assert time.monotonic() - started >= 2.0  # it did wait for the broker
            finally:
                restart.join()
    finally:
        broker.stop()


def test_a_read_gives_up_once_the_api_timeout_has_gone_by(tmp_path: Path) -> None:
    broker = _broker_with_records(tmp_path)
    config = {"request.timeout.ms": "500", "reconnect.backoff.max.ms": "200", "default.api.timeout.ms": "2000"}
    try:
        with OffsetReader(broker.bootstrap, config=config) as reader:
            assert _read_offsets(reader, 9) == list(range(10))
            broker.kill()
            with pytest.raises(KafkaConnectionError):
                _read_offsets(reader, 9)
    finally:
        broker.stop()
