"""The bundled client against a second, independent share-group broker: librdkafka's mock cluster.

The mock speaks ShareGroupHeartbeat/ShareFetch/ShareAcknowledge v1 only and ApiVersions up to v2; its share
auto-offset-reset is `latest` and it assigns partitions only when membership changes, so the topic is made
before the consumer joins and the records are produced once the consumer holds its assignment.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Producer as RdProducer

from shoal.client import AcknowledgeType, Producer, RecordMetadata, ShareConsumer
from shoal.client.connection import BrokerConnection
from shoal.client.security import ClientConfig
from shoal.protocol.api_keys import ApiKey


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# The mock's debug log, read to learn when it has seen a consumer's ShareFetch (one mock per module).
_MOCK_LOG = _Capture()


@pytest.fixture(scope="module")
def mock_cluster() -> Iterator[tuple[str, RdProducer]]:
    capture = _MOCK_LOG
    logger = logging.getLogger("rdkafka-mock-client-tests")
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    owner = RdProducer({"test.mock.num.brokers": 1, "debug": "mock", "logger": logger})
    bootstrap = None
    deadline = time.monotonic() + 10
    while bootstrap is None and time.monotonic() < deadline:
        owner.poll(0.1)
        for line in capture.lines:
            match = re.search(r"bootstrap\.servers=(\S+)", line)
            if match:
                bootstrap = match.group(1)
    assert bootstrap is not None, "the mock cluster did not report its address"
    yield bootstrap, owner
    owner.flush(5)


def _assign_then_produce(
    bootstrap: str,
    owner: RdProducer,
    consumer: ShareConsumer,
    topic: str,
    group: str,
    prefix: bytes,
    poll: Callable[[float], object],
) -> list[RecordMetadata]:
    """Create `topic`, wait (polling with `poll`) until `consumer` holds its 4 partitions and the mock has
    served it a ShareFetch for them, then produce 12 records across them. The mock starts a share partition at
    the log end when the first ShareFetch names it, so a record produced before that fetch is never offered."""
    owner.produce(topic, b"__create__")  # the mock creates the topic (4 partitions) on first produce
    assert owner.flush(10) == 0
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < 4 and time.monotonic() < deadline:
        poll(0.2)
    assert consumer.assignment() == {(topic, p) for p in range(4)}
    owner.poll(0)  # deliver the log lines the mock wrote so far
    mark = len(_MOCK_LOG.lines)
    while time.monotonic() < deadline and not _fetched_after(mark, group):
        poll(0.2)
        owner.poll(0)
    assert _fetched_after(mark, group), "the mock never served the assigned consumer a ShareFetch"
    with Producer(bootstrap) as producer:
        return [producer.send(topic, prefix + str(i).encode(), partition=i % 4).result(30) for i in range(12)]


def _fetched_after(mark: int, group: str) -> bool:
    """Whether the mock finished a ShareFetch from `group` that it parsed after log line `mark`: the mock
    serves requests on one thread, so the request's "acquired" line follows its "parsed" line."""
    parsed = False
    for line in _MOCK_LOG.lines[mark:]:
        if f"ShareFetch parsed: group {group} " in line:
            parsed = True
        elif parsed and "ShareFetch acquired:" in line:
            return True
    return False


async def test_api_versions_fall_back_to_v0_against_the_mock(mock_cluster: tuple[str, RdProducer]) -> None:
    bootstrap, _ = mock_cluster
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    conn = await BrokerConnection(host, int(port), ClientConfig()).connect()
    try:
        assert conn.max_version(ApiKey.API_VERSIONS) == 2
        assert conn.pick_version(ApiKey.SHARE_FETCH, 1, 2) == 1
        assert conn.pick_version(ApiKey.FIND_COORDINATOR, 1, 6) <= 3
    finally:
        await conn.close()


def test_produce_and_share_consume_with_explicit_acks(mock_cluster: tuple[str, RdProducer]) -> None:
    bootstrap, owner = mock_cluster
    topic, group = "cl-mock", "cl-mock-g"
    with ShareConsumer(bootstrap, group, acknowledgement_mode="explicit") as consumer:
        sent = _assign_then_produce(bootstrap, owner, consumer, topic, group, b"m", consumer.poll)
        assert {md.partition for md in sent} == {0, 1, 2, 3}

        got: dict[bytes, int] = {}
        released = None
        deadline = time.monotonic() + 30
        while len(got) < 12 and time.monotonic() < deadline:
            for record in consumer.poll(0.5):
                if released is None:
                    released = record.value
                    consumer.acknowledge(record, AcknowledgeType.RELEASE)
                    continue
                assert record.value is not None
                got[record.value] = record.delivery_count
                consumer.acknowledge(record, AcknowledgeType.ACCEPT)
            results = consumer.commit_sync(30)
            assert all(err is None for err in results.values()), results
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(12))
        assert released is not None and got[released] == 2
        assert all(count == 1 for value, count in got.items() if value != released)


def test_a_header_only_consumer_reads_ranges_from_the_records_a_broker_without_the_extension_sends(
    mock_cluster: tuple[str, RdProducer],
) -> None:
    # The mock knows nothing of ShoalHeadersOnly: it skips the tag and answers with records, whose batch
    # headers the consumer then reads itself.
    bootstrap, owner = mock_cluster
    topic, group = "cl-mock-headers", "cl-mock-headers-g"
    with ShareConsumer(bootstrap, group, acknowledgement_mode="explicit", header_only=True) as consumer:
        sent = _assign_then_produce(bootstrap, owner, consumer, topic, group, b"h", consumer.poll_ranges)
        want = {(md.partition, md.offset) for md in sent}
        got: set[tuple[int, int]] = set()
        sized = 0
        deadline = time.monotonic() + 30
        while len(got) < 12 and time.monotonic() < deadline:
            for rng in consumer.poll_ranges(0.5):
                assert rng.delivery_count == 1 and rng.size > 0
                sized += rng.size
                got.update((rng.partition, o) for o in range(rng.first_offset, rng.last_offset + 1))
                consumer.acknowledge_range(rng, AcknowledgeType.ACCEPT)
            results = consumer.commit_sync(30)
            assert all(err is None for err in results.values()), results
        assert got == want
        # Whole batches crossed the wire and were acquired whole, so the ranges' sizes add up to the bytes
        # fetched; had only headers come (61 bytes a batch), the sizes would exceed them.
        assert consumer.metrics()["bytes-fetched-total"] == sized
