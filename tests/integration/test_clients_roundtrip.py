"""Round trips through the real broker with the three Python Kafka clients users actually run.

For each client and compression codec: create a 3-partition topic with that client's admin API, produce
10,000 keyed records with headers and explicit timestamps, read every one back with an assigned consumer
(no group), and list offsets (earliest / latest / by timestamp) through the client's own API.
Then the admin and produce paths of confluent-kafka: idempotence, auto-create, CreateTopics errors,
DeleteTopics, DescribeConfigs, DeleteRecords and the Fetch long poll.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import NewTopic as KpNewTopic

from .broker_process import BrokerProcess

N_RECORDS = 10_000
PARTITIONS = 3
BASE_TS = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CLIENTS = ["confluent", "kafka-python", "aiokafka"]
# An offset well inside each partition's data, so a by-timestamp lookup must land mid-batch.
PROBE_OFFSET = 1234


@dataclass(frozen=True, slots=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def expected_records(codec: str) -> list[Rec]:
    """Record i goes to partition i % 3 at offset i // 3, with timestamp BASE_TS + i (rising per partition)."""
    out = []
    for i in range(N_RECORDS):
        out.append(
            Rec(
                partition=i % PARTITIONS,
                offset=i // PARTITIONS,
                key=b"key-%06d" % i,
                # Repetitive enough to compress, distinct per record.
                value=(b"value-%06d-%s-" % (i, codec.encode())) * (1 + i % 7),
                headers=(("idx", str(i).encode()), ("codec", codec.encode()), ("empty", b"")),
                timestamp=BASE_TS + i,
            )
        )
    return out


def probe_timestamp(partition: int, offset: int = PROBE_OFFSET) -> int:
    return BASE_TS + offset * PARTITIONS + partition


def assert_same_records(got: Sequence[Rec], want: Sequence[Rec]) -> None:
    assert len(got) == len(want)
    by_partition: dict[int, list[Rec]] = {}
    for rec in got:
        by_partition.setdefault(rec.partition, []).append(rec)
    for partition, recs in by_partition.items():
        offsets = [r.offset for r in recs]
        assert offsets == list(range(len(recs))), f"partition {partition} offsets are not contiguous from 0"
    assert sorted(got, key=lambda r: (r.partition, r.offset)) == sorted(want, key=lambda r: (r.partition, r.offset))


def per_partition_counts(records: Sequence[Rec]) -> dict[int, int]:
    counts = dict.fromkeys(range(PARTITIONS), 0)
    for rec in records:
        counts[rec.partition] += 1
    return counts


@dataclass(slots=True)
class OffsetsSeen:
    earliest: dict[int, int]
    latest: dict[int, int]
    # partition -> (offset, timestamp) for a timestamp equal to a record's, one just below it, one past the end
    exact: dict[int, tuple[int, int]]
    between: dict[int, int]
    beyond: dict[int, int | None]


def assert_offsets(seen: OffsetsSeen, counts: dict[int, int]) -> None:
    assert seen.earliest == dict.fromkeys(range(PARTITIONS), 0)
    assert seen.latest == counts
    for p in range(PARTITIONS):
        assert seen.exact[p] == (PROBE_OFFSET, probe_timestamp(p))
        assert seen.between[p] == PROBE_OFFSET
        assert seen.beyond[p] is None


# ---- confluent-kafka -------------------------------------------------------------------------------


def confluent_create(bootstrap: str, name: str, partitions: int = PARTITIONS, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})], operation_timeout=10)
    futures[name].result(timeout=30)


def confluent_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], extra: dict[str, Any] | None = None
) -> list[tuple[int, int]]:
    """Produce and wait for every delivery report; returns (partition, offset) per record in send order."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 50,
        "batch.num.messages": 100_000,
        "batch.size": 1_000_000,
    }
    conf.update(extra or {})
    producer = Producer(conf)
    delivered: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[Any] = []

    def report(index: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered[index] = (msg.partition(), msg.offset())

        return cb

    for i, rec in enumerate(records):
        while True:
            try:
                producer.produce(
                    topic,
                    key=rec.key,
                    value=rec.value,
                    headers=list(rec.headers),
                    timestamp=rec.timestamp,
                    partition=rec.partition,
                    on_delivery=report(i),
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    assert errors == []
    assert all(d is not None for d in delivered)
    return [d for d in delivered if d is not None]


def confluent_consumer(bootstrap: str, **extra: Any) -> Consumer:
    # librdkafka insists on a group.id; with assign() and no commits it never joins a group.
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"unused-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
    }
    conf.update(extra)
    return Consumer(conf)


def confluent_read(bootstrap: str, topic: str, counts: dict[int, int], start: int = 0) -> list[Rec]:
    consumer = confluent_consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, start) for p in counts])
        total = sum(counts.values()) - start * len(counts)
        out: list[Rec] = []
        deadline = time.monotonic() + 60
        while len(out) < total and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                assert msg.error() is None, msg.error()
                _ts_type, ts = msg.timestamp()
                out.append(
                    Rec(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), ts)
                )
        return out
    finally:
        consumer.close()


def confluent_offsets(bootstrap: str, topic: str) -> OffsetsSeen:
    consumer = confluent_consumer(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        earliest, latest = {}, {}
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            earliest[p], latest[p] = low, high
        # The admin API's earliest/latest must agree with the consumer's watermarks.
        specs = {TopicPartition(topic, p): OffsetSpec.earliest() for p in range(PARTITIONS)}
        for tp, fut in admin.list_offsets(specs).items():
            assert fut.result(timeout=30).offset == earliest[tp.partition]
        specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
        for tp, fut in admin.list_offsets(specs).items():
            assert fut.result(timeout=30).offset == latest[tp.partition]

        exact: dict[int, tuple[int, int]] = {}
        specs = {TopicPartition(topic, p): OffsetSpec.for_timestamp(probe_timestamp(p)) for p in range(PARTITIONS)}
        for tp, fut in admin.list_offsets(specs).items():
            info = fut.result(timeout=30)
            exact[tp.partition] = (info.offset, info.timestamp)

        query = [TopicPartition(topic, p, probe_timestamp(p) - 1) for p in range(PARTITIONS)]
        between = {tp.partition: tp.offset for tp in consumer.offsets_for_times(query, timeout=10)}
        query = [TopicPartition(topic, p, BASE_TS + 10 * N_RECORDS) for p in range(PARTITIONS)]
        # No record that late: Kafka answers offset -1, which librdkafka reports as OFFSET_END (-1).
        beyond: dict[int, int | None] = {
            tp.partition: None if tp.offset == -1 else tp.offset for tp in consumer.offsets_for_times(query, timeout=10)
        }
        return OffsetsSeen(earliest, latest, exact, between, beyond)
    finally:
        consumer.close()


def confluent_roundtrip(bootstrap: str, codec: str) -> None:
    topic = topic_name(f"rt-confluent-{codec}")
    confluent_create(bootstrap, topic)
    want = expected_records(codec)
    delivered = confluent_produce(bootstrap, topic, want, {"compression.type": codec})
    assert delivered == [(r.partition, r.offset) for r in want]
    counts = per_partition_counts(want)
    assert_same_records(confluent_read(bootstrap, topic, counts), want)
    assert_offsets(confluent_offsets(bootstrap, topic), counts)


# ---- kafka-python ----------------------------------------------------------------------------------


def kafka_python_roundtrip(bootstrap: str, codec: str) -> None:
    topic = topic_name(f"rt-kafkapython-{codec}")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.create_topics([KpNewTopic(topic, PARTITIONS, 1)])
        assert [t["error_code"] for t in result["topics"]] == [0]
    finally:
        admin.close()
    want = expected_records(codec)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=50,
        batch_size=1_000_000,
        max_request_size=4_000_000,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in want
        ]
        producer.flush(60)
        delivered = [(md.partition, md.offset) for md in (f.get(timeout=30) for f in futures)]
    finally:
        producer.close()
    assert delivered == [(r.partition, r.offset) for r in want]
    counts = per_partition_counts(want)

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [KpTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        got: list[Rec] = []
        deadline = time.monotonic() + 60
        while len(got) < N_RECORDS and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=1000, max_records=100_000).items():
                for m in msgs:
                    got.append(Rec(tp.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp))
        assert_same_records(got, want)

        begin = consumer.beginning_offsets(tps)
        end = consumer.end_offsets(tps)
        exact_q = consumer.offsets_for_times({tp: probe_timestamp(tp.partition) for tp in tps})
        between_q = consumer.offsets_for_times({tp: probe_timestamp(tp.partition) - 1 for tp in tps})
        beyond_q = consumer.offsets_for_times({tp: BASE_TS + 10 * N_RECORDS for tp in tps})
        seen = OffsetsSeen(
            earliest={tp.partition: o for tp, o in begin.items()},
            latest={tp.partition: o for tp, o in end.items()},
            exact={tp.partition: (ot.offset, ot.timestamp) for tp, ot in exact_q.items()},
            between={tp.partition: ot.offset for tp, ot in between_q.items()},
            beyond={tp.partition: None if ot is None else ot.offset for tp, ot in beyond_q.items()},
        )
    finally:
        consumer.close()
    assert_offsets(seen, counts)


# ---- aiokafka --------------------------------------------------------------------------------------


async def aiokafka_roundtrip(bootstrap: str, codec: str) -> None:
    topic = topic_name(f"rt-aiokafka-{codec}")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([AioNewTopic(topic, PARTITIONS, 1)])
        assert [err[1] for err in response.topic_errors] == [0]
    finally:
        await admin.close()
    want = expected_records(codec)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=50,
        max_batch_size=1_000_000,
        max_request_size=4_000_000,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in want
        ]
        await producer.flush()
        delivered = [(md.partition, md.offset) for md in await asyncio.gather(*futures)]
    finally:
        await producer.stop()
    assert delivered == [(r.partition, r.offset) for r in want]
    counts = per_partition_counts(want)

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [AioTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        got: list[Rec] = []
        deadline = time.monotonic() + 60
        while len(got) < N_RECORDS and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000, max_records=100_000)
            for tp, msgs in batch.items():
                for m in msgs:
                    got.append(Rec(tp.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp))
        assert_same_records(got, want)

        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        exact_q = await consumer.offsets_for_times({tp: probe_timestamp(tp.partition) for tp in tps})
        between_q = await consumer.offsets_for_times({tp: probe_timestamp(tp.partition) - 1 for tp in tps})
        beyond_q = await consumer.offsets_for_times({tp: BASE_TS + 10 * N_RECORDS for tp in tps})
        seen = OffsetsSeen(
            earliest={tp.partition: o for tp, o in begin.items()},
            latest={tp.partition: o for tp, o in end.items()},
            exact={tp.partition: (ot.offset, ot.timestamp) for tp, ot in exact_q.items()},
            between={tp.partition: ot.offset for tp, ot in between_q.items()},
            beyond={tp.partition: None if ot is None else ot.offset for tp, ot in beyond_q.items()},
        )
    finally:
        await consumer.stop()
    assert_offsets(seen, counts)


# ---- the matrix ------------------------------------------------------------------------------------


@pytest.mark.external
@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_roundtrip(broker: BrokerProcess, client: str, codec: str) -> None:
    if client == "confluent":
        confluent_roundtrip(broker.bootstrap, codec)
    elif client == "kafka-python":
        kafka_python_roundtrip(broker.bootstrap, codec)
    else:
        asyncio.run(aiokafka_roundtrip(broker.bootstrap, codec))


# ---- produce paths ---------------------------------------------------------------------------------


@pytest.mark.external
def test_idempotent_producer_writes_each_record_once(broker: BrokerProcess) -> None:
    topic = topic_name("idempotent")
    confluent_create(broker.bootstrap, topic)
    want = expected_records("idem")[:6000]
    delivered = confluent_produce(
        broker.bootstrap,
        topic,
        want,
        {"enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5, "linger.ms": 5,
         "batch.num.messages": 500},
    )
    assert delivered == [(r.partition, r.offset) for r in want]
    counts = per_partition_counts(want)
    consumer = confluent_consumer(broker.bootstrap)
    try:
        for p, n in counts.items():
            assert consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, n)
    finally:
        consumer.close()
    assert_same_records(confluent_read(broker.bootstrap, topic, counts), want)


@pytest.mark.external
def test_produce_to_unknown_topic_auto_creates_it(broker: BrokerProcess) -> None:
    topic = topic_name("autocreate")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    reports: list[tuple[Any, Any]] = []
    producer.produce(topic, key=b"k", value=b"first", on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(30) == 0
    assert len(reports) == 1 and reports[0][0] is None
    assert reports[0][1].offset() == 0
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert md.error is None
    assert len(md.partitions) == 1  # num.partitions default
    got = confluent_read(broker.bootstrap, topic, {0: 1})
    assert [(r.key, r.value) for r in got] == [(b"k", b"first")]


# ---- topic administration --------------------------------------------------------------------------


def _create_error(admin: AdminClient, topic: NewTopic) -> Any:
    fut = admin.create_topics([topic], operation_timeout=10)[topic.topic]
    with pytest.raises(KafkaException) as info:
        fut.result(timeout=30)
    return info.value.args[0].code()


@pytest.mark.external
def test_create_topics_errors(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = topic_name("exists")
    confluent_create(broker.bootstrap, topic)
    assert _create_error(admin, NewTopic(topic, 1, 1)) == KafkaError.TOPIC_ALREADY_EXISTS
    assert _create_error(admin, NewTopic("bad name!", 1, 1)) == KafkaError.TOPIC_EXCEPTION
    other = topic_name("rf3")
    assert _create_error(admin, NewTopic(other, 1, 3)) == KafkaError.INVALID_REPLICATION_FACTOR
    assert other not in admin.list_topics(timeout=10).topics
    # The existing topic kept its partition count.
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == PARTITIONS


@pytest.mark.external
def test_delete_topic_then_it_is_gone(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = topic_name("delete")
    confluent_create(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, expected_records("d")[:30])
    assert topic in admin.list_topics(timeout=10).topics
    admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)
    assert topic not in admin.list_topics(timeout=10).topics
    fut = admin.describe_topics(TopicCollection([topic]))[topic]
    with pytest.raises(KafkaException) as info:
        fut.result(timeout=30)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # Deleting it again is an error, not a silent success.
    with pytest.raises(KafkaException) as info:
        admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_configs_topic_and_broker(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = topic_name("configs")
    confluent_create(broker.bootstrap, topic, config={"retention.ms": "123456"})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["retention.ms"].value == "123456"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value

    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["log.dirs"].value == str(broker.data_dir)
    assert configs["num.partitions"].value == "1"

    missing = ConfigResource(ResourceType.TOPIC, topic_name("no-such-topic"))
    with pytest.raises(KafkaException) as info:
        admin.describe_configs([missing])[missing].result(timeout=30)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


@pytest.mark.external
def test_delete_records_moves_low_watermark(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = topic_name("delrec")
    confluent_create(broker.bootstrap, topic, partitions=1)
    want = [Rec(0, i, b"k%d" % i, b"v%d" % i, (), BASE_TS + i) for i in range(200)]
    # Small batches so the deletion point falls between and inside batches alike.
    confluent_produce(broker.bootstrap, topic, want, {"linger.ms": 0, "batch.num.messages": 7})
    result = admin.delete_records([TopicPartition(topic, 0, 123)])
    deleted = result[TopicPartition(topic, 0, 123)].result(timeout=30)
    assert deleted.low_watermark == 123
    consumer = confluent_consumer(broker.bootstrap, **{"auto.offset.reset": "earliest"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (123, 200)
    finally:
        consumer.close()
    specs = {TopicPartition(topic, 0): OffsetSpec.earliest()}
    assert admin.list_offsets(specs)[TopicPartition(topic, 0)].result(timeout=30).offset == 123
    # Reading from the beginning now starts at the new low watermark.
    consumer = confluent_consumer(broker.bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 77 and time.monotonic() < deadline:
            got += [m.offset() for m in consumer.consume(1000, 1.0) if m.error() is None]
        assert got == list(range(123, 200))
    finally:
        consumer.close()


@pytest.mark.external
def test_fetch_long_poll_delivers_record_produced_later(broker: BrokerProcess) -> None:
    topic = topic_name("longpoll")
    confluent_create(broker.bootstrap, topic, partitions=1)
    consumer = confluent_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 10_000, "fetch.min.bytes": 1})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        # Nothing there yet: the consumer sits in a long-polling Fetch.
        assert consumer.consume(10, 1.0) == []

        def produce_later() -> None:
            time.sleep(1.0)
            producer.produce(topic, key=b"late", value=b"arrived")
            producer.flush(30)

        thread = threading.Thread(target=produce_later)
        thread.start()
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [m for m in consumer.consume(10, 1.0) if m.error() is None]
        thread.join()
        assert [(m.offset(), m.key(), m.value()) for m in got] == [(0, b"late", b"arrived")]
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_batches_larger_than_the_fetch_limits_reach_every_partition(broker: BrokerProcess, client: str) -> None:
    """Each log batch is larger than the consumer's per-partition and overall fetch limits: a Fetch returns one
    whole batch for the first partition that has one and nothing for the others (as Kafka does), and the
    clients' turn-taking over partitions still reads every record of every partition, in order."""
    topic = topic_name("fetchlimit")
    confluent_create(broker.bootstrap, topic)
    records = [Rec(i % PARTITIONS, -1, None, bytes([i]) * 3000, (), BASE_TS + i) for i in range(60)]
    # Each partition's records go in a handful of batches of several records (linger 50 ms, one flush).
    confluent_produce(broker.bootstrap, topic, records)
    want = {p: [r.value for r in records if r.partition == p] for p in range(PARTITIONS)}
    got: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 30
    if client == "confluent":
        # librdkafka wants fetch.max.bytes >= message.max.bytes, whose least value is 1000.
        consumer = confluent_consumer(broker.bootstrap, **{"max.partition.fetch.bytes": 1000,
                                                           "fetch.max.bytes": 1000, "message.max.bytes": 1000})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            while sum(map(len, got.values())) < len(records) and time.monotonic() < deadline:
                for msg in consumer.consume(100, 0.5):
                    assert msg.error() is None, msg.error()
                    got[msg.partition()].append(msg.value())
        finally:
            consumer.close()
    else:
        kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                           max_partition_fetch_bytes=1000, fetch_max_bytes=1000)
        try:
            kp.assign([KpTopicPartition(topic, p) for p in range(PARTITIONS)])
            kp.seek_to_beginning()
            while sum(map(len, got.values())) < len(records) and time.monotonic() < deadline:
                for tp, msgs in kp.poll(timeout_ms=500).items():
                    got[tp.partition].extend(m.value for m in msgs)
        finally:
            kp.close()
    assert got == want
