"""An earlier owner of a state partition stays fenced even after the upstream forgot what the partition
alone would need to refuse it.

A Kafka partition refuses a batch whose producer epoch is below the last one it saw for that producer id
(ProducerAppendInfo's epoch check), but it forgets an idle producer after `producer.id.expiration.ms`, and the
producer id itself changes when the transactional id expired (`transactional.id.expiration.ms` without a
request to its coordinator) or its epochs ran out. Either way a stale batch then passes the partition's
check. The state writers' transactions keep the transaction coordinator in every write, so the earlier
owner's write is still refused and the later owners never see it. A state writer that fenced with the
partition's producer state alone (one epoch-bumping take, then plain idempotent writes) fails these tests.
The standalone Shoal upstream expires producers and transactional ids as Kafka does; the tests shorten both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from shoal.broker.storage.internal_topic_log import CoordinatorLogError
from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS
from shoal.broker.upstream.cluster import UpstreamCluster
from shoal.broker.upstream.settings import parse_upstream
from shoal.broker.upstream.state_log import UpstreamStateLog, transactional_id
from shoal.broker.upstream.state_topics import ensure_state_topics
from shoal.coordinator.offset_metadata_manager import CommittedOffset, offset_commit_record
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.coordinator_records import CoordinatorRecord
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .names import unique_name

WAIT_S = 30.0


def _record(offset: int) -> CoordinatorRecord:
    return offset_commit_record("g", "t", 0, CommittedOffset(offset, -1, "", 0))


def _replayed(state_log: UpstreamStateLog) -> list[int]:
    return [r.value.offset for _o, r in state_log.replay(0) if r.value is not None]  # type: ignore[attr-defined]


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _producers(upstream: BrokerProcess, topic: str) -> set[int]:
    """The producer ids the upstream's partition 0 of `topic` still remembers (DescribeProducers)."""
    req = messages.DescribeProducersRequest
    with WireClient.connect(upstream.bootstrap) as client:
        response = client.request(ApiKey.DESCRIBE_PRODUCERS, 0, req(topics=[req.TopicRequest(name=topic,
                                                                                              partition_indexes=[0])]))
    [partition] = [p for t in response.topics for p in t.partitions]
    assert partition.error_code == ErrorCode.NONE, partition
    return {int(p.producer_id) for p in partition.active_producers}


def _transactional_ids(upstream: BrokerProcess) -> set[str]:
    with WireClient.connect(upstream.bootstrap) as client:
        response = client.request(ApiKey.LIST_TRANSACTIONS, 0, messages.ListTransactionsRequest(
            state_filters=[], producer_id_filters=[]))
    return {t.transactional_id for t in response.transaction_states}


def _run(upstream: BrokerProcess, scenario: Callable[[list[UpstreamCluster], str, str], Awaitable[None]]) -> None:
    """`scenario(clusters, topic, membership)` with three upstream clients (earlier owner, later owner,
    a last reader) and a one-partition state topic of its own."""
    topic, membership = unique_name("__shoal_fencing"), unique_name("fencing")

    async def run() -> None:
        clusters = [UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap})) for _ in range(3)]
        try:
            for cluster in clusters:
                await cluster.start()
            await ensure_state_topics(clusters[0], {topic: 1}, None)
            await scenario(clusters, topic, membership)
        finally:
            for cluster in clusters:
                await cluster.close()

    asyncio.run(run())


def _upstream(tmp_path: Path, *overrides: str) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "upstream", overrides=list(overrides)).start()
    yield proc
    proc.stop()


@pytest.fixture
def forgets_producers(tmp_path: Path) -> Iterator[BrokerProcess]:
    yield from _upstream(tmp_path, "producer.id.expiration.ms=300", "producer.id.expiration.check.interval.ms=50")


@pytest.fixture
def forgets_transactional_ids(tmp_path: Path) -> Iterator[BrokerProcess]:
    yield from _upstream(tmp_path, "transactional.id.expiration.ms=300",
                         "transaction.remove.expired.transaction.cleanup.interval.ms=50")


def test_the_earlier_owner_stays_fenced_after_the_partition_forgot_its_producer(
        forgets_producers: BrokerProcess) -> None:
    """Same producer id, later epoch: once the partition has expired the producer, only the transaction
    coordinator still knows the earlier owner's epoch is stale."""
    async def scenario(clusters: list[UpstreamCluster], topic: str, membership: str) -> None:
        earlier, later, reader = (UpstreamStateLog(c, topic, CONSUMER_OFFSETS, 1, membership) for c in clusters)
        await earlier.take(0)
        await earlier.append(0, [_record(1)])
        await later.take(0)
        assert _replayed(later) == [1]
        await later.append(0, [_record(2)])
        assert later._writers[0].producer_id == earlier._writers[0].producer_id
        await _until(lambda: asyncio.to_thread(lambda: not _producers(forgets_producers, topic)),
                     "the upstream to expire the producer on the state partition")
        with pytest.raises(CoordinatorLogError) as refused:
            await earlier.append(0, [_record(3)])
        assert refused.value.error_code == ErrorCode.NOT_COORDINATOR
        assert not earlier.owns(0)
        await reader.take(0)
        assert _replayed(reader) == [1, 2]

    _run(forgets_producers, scenario)


def test_the_earlier_owner_stays_fenced_after_its_transactional_id_expired(
        forgets_transactional_ids: BrokerProcess) -> None:
    """The later owner's take finds the transactional id expired and gets a new producer id, so nothing on
    the partition fences the earlier owner's producer id: its coordinator does."""
    async def scenario(clusters: list[UpstreamCluster], topic: str, membership: str) -> None:
        earlier, later, reader = (UpstreamStateLog(c, topic, CONSUMER_OFFSETS, 1, membership) for c in clusters)
        await earlier.take(0)
        await earlier.append(0, [_record(1)])
        txn_id = transactional_id(membership, topic, 0)
        await _until(lambda: asyncio.to_thread(lambda: txn_id not in _transactional_ids(forgets_transactional_ids)),
                     "the upstream to expire the state partition's transactional id")
        await later.take(0)
        assert later._writers[0].producer_id != earlier._writers[0].producer_id
        assert _replayed(later) == [1]
        with pytest.raises(CoordinatorLogError) as refused:
            await earlier.append(0, [_record(2)])
        assert refused.value.error_code == ErrorCode.NOT_COORDINATOR
        assert not earlier.owns(0)
        await reader.take(0)
        assert _replayed(reader) == [1]

    _run(forgets_transactional_ids, scenario)
