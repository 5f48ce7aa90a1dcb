"""The log seam's upstream side: `UpstreamPartitionSource` reads a partition of a real upstream (a
standalone Shoal process) with Fetch, through the batch cache, and answers as the local log would."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry

from shoal.broker.storage.partition_source import OffsetOutOfRange, SourceRead, undeliverable
from shoal.broker.upstream.cluster import UpstreamCluster
from shoal.broker.upstream.metrics import UpstreamMetrics
from shoal.broker.upstream.partition_reader import BatchCache, UpstreamPartitionSource
from shoal.broker.upstream.settings import parse_upstream
from shoal.protocol.records import decode_batches

from .broker_process import BrokerProcess
from .names import unique_name


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("seam-upstream") / "data").start()
    yield proc
    proc.stop()


def _topic(upstream: BrokerProcess) -> str:
    name = unique_name("seam")
    admin = AdminClient({"bootstrap.servers": upstream.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def _produce(upstream: BrokerProcess, topic: str, values: list[bytes], **conf: object) -> None:
    producer = Producer({"bootstrap.servers": upstream.bootstrap, "linger.ms": 0, **conf})
    for value in values:
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
        producer.flush(30)  # one batch per record, so reads cut across batches
    assert producer.flush(30) == 0


def _values(read: SourceRead) -> list[bytes]:
    data = b"".join(bytes(view) for _, view in read.batches)
    return [r.value for r in decode_batches(data) if r.value is not None]


async def _source(upstream: BrokerProcess, topic: str, cache_bytes: int = 1 << 20
                  ) -> tuple[UpstreamCluster, UpstreamPartitionSource]:
    metrics = UpstreamMetrics(CollectorRegistry())
    cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}), metrics)
    await cluster.start()
    return cluster, UpstreamPartitionSource(cluster, BatchCache(cache_bytes, metrics), topic, 0)


def test_reads_come_from_the_upstream_once_and_then_from_the_cache(upstream: BrokerProcess) -> None:
    topic = _topic(upstream)
    _produce(upstream, topic, [f"r{i}".encode() for i in range(10)])

    async def run() -> None:
        cluster, source = await _source(upstream, topic)
        try:
            first = await source.read(3, 1 << 20)
            assert _values(first) == [f"r{i}".encode() for i in range(3, 10)]
            assert (first.high_watermark, first.log_start_offset) == (10, 0)
            assert source.upstream_reads == 1
            # Four share consumers reading the same stretch: the cache answers, with the very same bytes.
            again = await asyncio.gather(*(source.read(o, 1 << 20) for o in (3, 5, 5, 9)))
            assert source.upstream_reads == 1 and source.cache.hits == 4
            # What the sidecar's /metrics shows.
            assert cluster.metrics.registry.get_sample_value("shoal_upstream_batch_cache_hits_total") == 4
            assert [bytes(v) for _, v in again[0].batches] == [bytes(v) for _, v in first.batches]
            assert _values(again[1]) == [f"r{i}".encode() for i in range(5, 10)]
            # A budget smaller than the run still gets at least one batch, then stops.
            assert len((await source.read(3, 1)).batches) == 1
            # Past the cached run: new records are read from the upstream, once for concurrent readers.
            _produce(upstream, topic, [b"r10", b"r11"])
            newer = await asyncio.gather(*(source.read(10, 1 << 20) for _ in range(3)))
            assert all(_values(n) == [b"r10", b"r11"] for n in newer)
            assert source.upstream_reads == 2
            assert newer[0].high_watermark == 12
            with pytest.raises(OffsetOutOfRange):
                await source.read(100, 1 << 20)
        finally:
            await cluster.close()

    asyncio.run(run())


def test_reads_keep_about_one_upstream_read_cached_ahead_of_what_they_hand_out(upstream: BrokerProcess) -> None:
    topic = _topic(upstream)
    _produce(upstream, topic, [f"a{i}".encode() for i in range(10)])

    async def run() -> None:
        cluster, plain = await _source(upstream, topic)
        # Upstream reads of a few batches each, so the partition takes several.
        source = UpstreamPartitionSource(cluster, plain.cache, topic, 0, min_read_bytes=200)
        loop = asyncio.get_running_loop()

        async def until(cached_to: int) -> None:
            deadline = loop.time() + 10
            while source.cache.run_after(source.key, 0, 1 << 20)[1] < cached_to:
                assert loop.time() < deadline
                await asyncio.sleep(0.01)

        try:
            first = await source.read(0, 1)
            assert source.upstream_reads == 1 and len(first.batches) == 1
            first_run_end = source.cache.run_after(source.key, 0, 1 << 20)[1]
            assert 1 < first_run_end < 10
            # Less than one upstream read is cached past what was handed out: the next range comes ahead of
            # any reader, and joins the cached run.
            await until(first_run_end + 1)
            assert source.upstream_reads >= 2
            hits = source.cache.hits
            through = await source.read(0, 1 << 20)
            assert source.cache.hits == hits + 1
            assert _values(through)[:first_run_end + 1] == [f"a{i}".encode() for i in range(first_run_end + 1)]
            # Reading on keeps reads ahead until the high watermark, and none past it.
            offset = first_run_end
            while offset < 10:
                offset = (await source.read(offset, 1 << 20)).batches[-1][0].last_offset + 1
                await until(min(10, offset + 1))
            reads = source.upstream_reads
            assert _values(await source.read(9, 1 << 20)) == [b"a9"]
            assert source.upstream_reads == reads
        finally:
            await cluster.close()

    asyncio.run(run())


def test_a_small_cache_keeps_the_newest_batches_and_still_answers_everything(upstream: BrokerProcess) -> None:
    topic = _topic(upstream)
    _produce(upstream, topic, [f"s{i}".encode() * 20 for i in range(8)])

    async def run() -> None:
        cluster, source = await _source(upstream, topic, cache_bytes=300)
        try:
            assert len(_values(await source.read(0, 1 << 20))) == 8
            assert source.cache.size <= 300
            assert _values(await source.read(0, 1 << 20))[0] == b"s0" * 20  # evicted: read again upstream
            assert source.upstream_reads == 2
        finally:
            await cluster.close()

    asyncio.run(run())


def test_read_committed_stops_at_the_last_stable_offset_and_names_aborted_transactions(upstream: BrokerProcess) -> None:
    topic = _topic(upstream)
    _produce(upstream, topic, [b"before"])
    aborter = Producer({"bootstrap.servers": upstream.bootstrap, "transactional.id": unique_name("seam-abort")})
    aborter.init_transactions(30)
    aborter.begin_transaction()
    aborter.produce(topic, value=b"aborted", partition=0)
    aborter.flush(30)
    aborter.abort_transaction(30)
    _produce(upstream, topic, [b"after"])
    holder = Producer({"bootstrap.servers": upstream.bootstrap, "transactional.id": unique_name("seam-open")})
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(topic, value=b"open", partition=0)
    holder.flush(30)

    async def run() -> None:
        cluster, source = await _source(upstream, topic)
        try:
            committed = await source.read(0, 1 << 20, read_committed=True)
            # before (0), aborted (1), its ABORT marker (2), after (3); the open transaction starts at 4.
            assert committed.last_stable_offset == 4
            assert [h.base_offset for h, _ in committed.batches] == [0, 1, 2, 3]
            assert len(committed.aborted) == 1
            assert undeliverable(committed) == {(1, 1), (2, 2)}
            # The batches read_committed brought in serve read_uncommitted readers too; past them, the
            # open transaction's records come from the upstream.
            reads = source.upstream_reads
            assert _values(await source.read(0, 1 << 20)) == [b"before", b"aborted", b"after"]
            assert source.upstream_reads == reads
            assert _values(await source.read(4, 1 << 20)) == [b"open"]
        finally:
            await cluster.close()

    asyncio.run(run())
    holder.abort_transaction(30)


def test_a_topic_named_before_the_metadata_knows_it_is_learnt_at_once_and_a_missing_one_backs_off(
        upstream: BrokerProcess) -> None:
    async def run() -> None:
        cluster, _source_ = await _source(upstream, _topic(upstream))
        changes: list[None] = []
        cluster.topic_listeners.append(lambda: changes.append(None))
        refreshes = "shoal_upstream_metadata_refreshes_total"
        try:
            created = _topic(upstream)  # after the cluster's last metadata read
            assert created not in cluster.topic_ids
            await cluster.learn_topics([created])
            assert created in cluster.topic_ids and cluster.partition_counts[created] == 1
            assert changes  # the share groups hear of it
            # Known names cost nothing; a missing one re-reads once, then backs off.
            count = cluster.metrics.registry.get_sample_value(refreshes)
            await cluster.learn_topics([created])
            assert cluster.metrics.registry.get_sample_value(refreshes) == count
            missing = unique_name("seam-missing")
            await cluster.learn_topics([missing])
            after_first = cluster.metrics.registry.get_sample_value(refreshes)
            assert after_first is not None and count is not None and after_first == count + 1
            for _ in range(5):
                await cluster.learn_topics([missing])
            assert cluster.metrics.registry.get_sample_value(refreshes) == after_first
            # A ShareFetch naming an unknown topic id re-reads in the background, once per backoff too.
            for _ in range(5):
                cluster.request_refresh_for(b"\x07" * 16)
                await asyncio.sleep(0)
            assert cluster.metrics.registry.get_sample_value(refreshes) == after_first + 1
        finally:
            await cluster.close()

    asyncio.run(run())
