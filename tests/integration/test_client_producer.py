"""The bundled producer against the real broker; read back with librdkafka's consumer and raw Fetches."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka import Producer as RdProducer

from shoal.client import Admin, AsyncProducer, NewTopic, Producer
from shoal.client.cluster import Cluster
from shoal.client.errors import UnknownTopicError
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.compression import codec_from_name
from shoal.protocol.record_batch import BatchHeader
from shoal.protocol.records import iter_decoded_batches

from .broker_process import BrokerProcess
from .names import unique_name

pytestmark = pytest.mark.external


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        assert admin.create_topics([NewTopic(topic, partitions)])[topic].error is None


def _read_back(
    bootstrap: str, topic: str, count: int, partitions: int
) -> list[tuple[Any, Any, Any, Any, Any]]:
    # Assigned, not subscribed: the broker serves share groups, not classic consumer groups.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rb-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    try:
        for _ in range(120):
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers() or []))
            if len(out) >= count:
                break
    finally:
        consumer.close()
    return out


async def _raw_batches(bootstrap: str, topic: str, partition: int) -> list[BatchHeader]:
    """Batch headers of a partition as stored, via a plain Fetch."""
    cluster = Cluster(bootstrap, ClientConfig())
    await cluster.start()
    try:
        await cluster.refresh_metadata([topic])
        req = messages.FetchRequest
        body = req(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=10_000_000,
            isolation_level=0,
            topics=[
                req.FetchTopic(  # type: ignore[attr-defined]
                    topic=topic,
                    topic_id=cluster.topics[topic].topic_id,
                    partitions=[req.FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=10_000_000)],  # type: ignore[attr-defined]
                )
            ],
        )
        response = await cluster.request(cluster.leader(topic, partition), ApiKey.FETCH, body, (4, 12))
        data = response.responses[0].partitions[0].records or b""
        return [header for header, _ in iter_decoded_batches(data)]
    finally:
        await cluster.close()


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_each_compression_reads_back_with_librdkafka(broker: BrokerProcess, compression: str) -> None:
    topic = unique_name(f"cl-prod-{compression}")
    await asyncio.to_thread(_create, broker.bootstrap, topic, 3)
    sent = {}
    async with AsyncProducer(broker.bootstrap, compression=compression, linger_ms=20) as producer:
        futures = []
        for i in range(60):
            headers = [("h", f"x{i}".encode()), ("none", None)]
            futures.append(await producer.send(topic, f"value-{i}".encode() * 5, key=f"k{i}".encode(), headers=headers))
        for i, md in enumerate(await asyncio.gather(*futures)):
            assert md.topic == topic and md.offset >= 0 and md.timestamp > 0
            sent[(md.partition, md.offset)] = (f"k{i}".encode(), f"value-{i}".encode() * 5, [("h", f"x{i}".encode()), ("none", None)])
    assert len(sent) == 60
    got = await asyncio.to_thread(_read_back, broker.bootstrap, topic, 60, 3)
    assert {(p, o): (k, v, h) for p, o, k, v, h in got} == sent
    # Stored batches carry the codec and, with idempotence, a producer id and gap-free sequences.
    for partition in range(3):
        stored = await _raw_batches(broker.bootstrap, topic, partition)
        assert stored, f"partition {partition} is empty"
        assert {h.compression for h in stored} == {codec_from_name(compression)}
        assert len({h.producer_id for h in stored}) == 1 and stored[0].producer_id >= 0
        expected = 0
        for h in stored:
            assert h.base_sequence == expected
            expected += h.records_count


def test_keyed_records_land_where_librdkafka_murmur2_puts_them(broker: BrokerProcess) -> None:
    topic = unique_name("cl-prod-murmur")
    _create(broker.bootstrap, topic, 7)
    keys = [f"key-{i}".encode() for i in range(40)] + [b"", b"a", b"ab", b"abc"]
    theirs: dict[Any, Any] = {}
    rd = RdProducer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        rd.produce(topic, b"x", key=key, on_delivery=lambda err, msg: theirs.__setitem__(msg.key(), msg.partition()))
    assert rd.flush(30) == 0
    with Producer(broker.bootstrap) as producer:
        ours = {key: producer.send(topic, b"y", key=key).result(30).partition for key in keys}
    assert ours == theirs
    assert len(set(ours.values())) > 1


def test_sync_producer_acks_variants_and_unknown_partition(broker: BrokerProcess) -> None:
    topic = unique_name("cl-prod-acks")
    _create(broker.bootstrap, topic, 2)
    with Producer(broker.bootstrap, acks=1) as producer:
        md = producer.send(topic, b"one", partition=1).result(30)
        assert (md.partition, md.offset) == (1, 0)
        with pytest.raises(UnknownTopicError):
            producer.send(topic, b"nope", partition=5).result(30)
    with Producer(broker.bootstrap, acks=0) as producer:
        future = producer.send(topic, b"fire-and-forget", partition=0)
        producer.flush(30)
        assert future.result(0).offset == -1  # acks=0: the broker says nothing
    values = sorted(bytes(v) for _, _, _, v, _ in _read_back(broker.bootstrap, topic, 2, 2))
    assert values == [b"fire-and-forget", b"one"]
    with pytest.raises(ValueError):
        Producer(broker.bootstrap, acks=1, enable_idempotence=True)


def test_send_many_delivers_every_record_once_through_the_waiting_and_the_direct_paths(broker: BrokerProcess) -> None:
    """send_many queues records without a future each; with a buffer of a few records most of them must
    wait for space, so both ways of queueing run. Each record lands once, in order per partition, and
    flush() returns only once everything queued before it is delivered."""
    topic = unique_name("cl-prod-many")
    _create(broker.bootstrap, topic, 3)
    rows = [(topic, f"v{i}".encode(), f"k{i % 17}".encode(), [("n", str(i).encode())], None) for i in range(3000)]
    with Producer(broker.bootstrap, buffer_memory=2_000, batch_size=500, linger_ms=1) as producer:
        futures = [producer.send_many(rows[i : i + 1000]) for i in range(0, 3000, 1000)]
        producer.flush(60)
        assert all(f.done() for f in futures)
        assert [f.result(0) for f in futures] == [1000, 1000, 1000]
    got = _read_back(broker.bootstrap, topic, 3000, 3)
    assert len(got) == 3000
    sent_in_order: dict[int, list[int]] = {}
    for partition, _offset, key, value, headers in sorted(got, key=lambda r: (r[0], r[1])):
        i = int(value[1:])
        assert key == f"k{i % 17}".encode() and headers == [("n", str(i).encode())]
        sent_in_order.setdefault(partition, []).append(i)
    assert sorted(i for ids in sent_in_order.values() for i in ids) == list(range(3000))
    assert all(ids == sorted(ids) for ids in sent_in_order.values())


def test_send_many_raises_the_first_failure_and_keeps_what_it_queued(broker: BrokerProcess) -> None:
    topic = unique_name("cl-prod-many-fail")
    _create(broker.bootstrap, topic, 2)
    with Producer(broker.bootstrap) as producer:
        ok = [(topic, b"ok", None, None, 0), (topic, b"ok", None, None, 1)]
        with pytest.raises(UnknownTopicError):
            producer.send_many([*ok, (topic, b"bad", None, None, 9)]).result(30)
        with pytest.raises(Exception, match="max_request_size"):
            producer.send_many([*ok, (topic, b"x" * 2_000_000, None, None, 0)]).result(30)
        producer.flush(30)
    assert sorted(bytes(v) for _, _, _, v, _ in _read_back(broker.bootstrap, topic, 4, 2)) == [b"ok"] * 4


async def test_a_bulk_send_fills_batches_up_to_batch_size(broker: BrokerProcess) -> None:
    # One request in flight per partition: the producer's throughput rests on its batches being full.
    topic = unique_name("cl-prod-fill")
    await asyncio.to_thread(_create, broker.bootstrap, topic, 1)
    value = b"v" * 100
    async with AsyncProducer(broker.bootstrap) as producer:
        assert await producer.send_many((topic, value, b"k%06d" % i, None, None) for i in range(20_000)) == 20_000
        batch_size = producer.batch_size
    stored = await _raw_batches(broker.bootstrap, topic, 0)
    assert sum(h.records_count for h in stored) == 20_000
    assert all(h.size <= batch_size for h in stored)
    # Every batch but the last is full: the producer's size estimate runs a little over the encoded size.
    assert all(h.size > 0.9 * batch_size for h in stored[:-1]), [h.size for h in stored]
