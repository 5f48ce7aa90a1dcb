"""Topic configs as Kafka 4's LogConfig has them, applied per topic, through real clients: Quix Streams,
kafka-python, aiokafka and confluent-kafka; retention that empties a quiet topic; MAX_TIMESTAMP."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpConfigResourceType
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KpNewTopic

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.compression import NONE, ZSTD
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, decode_batches, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient

REPO = Path(__file__).resolve().parents[2]
QUIX_PYTHON = REPO / ".venv-quix" / "bin" / "python"
QUIX_APP = Path(__file__).parent / "quix_topic_app.py"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Retention runs often, so a topic with a short retention.ms is seen to empty within the test.
    proc = BrokerProcess(tmp_path_factory.mktemp("topic-configs") / "data",
                         overrides=["log.retention.check.interval.ms=200"]).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(admin: AdminClient, name: str, configs: dict[str, str] | None = None) -> None:
    admin.create_topics([NewTopic(name, 1, 1, config=configs or {})])[name].result(30)


def describe(admin: AdminClient, name: str) -> dict[str, Any]:
    return dict(admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])[
        ConfigResource(ResourceType.TOPIC, name)].result(30))


def fetch_batches(bootstrap: str, topic: str) -> bytes:
    """The partition's stored batches as Fetch returns them (the broker sends them as stored)."""
    with WireClient.connect(bootstrap) as wire:
        md = messages.MetadataRequest
        meta = wire.request(ApiKey.METADATA, 12, md(topics=[md.MetadataRequestTopic(name=topic)],  # type: ignore[attr-defined]
                                                    allow_auto_topic_creation=False))
        topic_id = meta.topics[0].topic_id
        fr = messages.FetchRequest
        req = fr(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=10 << 20, isolation_level=0, session_id=0,
                 session_epoch=-1, topics=[fr.FetchTopic(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
                     fr.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,  # type: ignore[attr-defined]
                                       log_start_offset=-1, partition_max_bytes=10 << 20)])],
                 forgotten_topics_data=[], rack_id="")
        resp = wire.request(ApiKey.FETCH, 13, req)
        [part] = resp.responses[0].partitions
        assert part.error_code == ErrorCode.NONE
        return bytes(part.records or b"")


def produce_one(bootstrap: str, topic: str, value: bytes, **conf: Any) -> KafkaError | None:
    """Produce one record and flush; the delivery error, or None when it was written."""
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **conf})
    producer.produce(topic, value=value, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 1
    return errors[0]


def consume_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg)
    consumer.close()
    return got


# ---- every LogConfig key is accepted -----------------------------------------------------------------------


KAFKA4_TOPIC_KEYS = {
    "segment.ms": "3600000", "segment.jitter.ms": "1000", "segment.index.bytes": "4096", "preallocate": "true",
    "file.delete.delay.ms": "1000", "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.after.max.ms": "60000", "compression.gzip.level": "5", "compression.lz4.level": "10",
    "compression.zstd.level": "7", "unclean.leader.election.enable": "true", "local.retention.ms": "1000",
    "local.retention.bytes": "1000", "remote.storage.enable": "false", "remote.log.copy.disable": "true",
    "remote.log.delete.on.disable": "true", "leader.replication.throttled.replicas": "0:1",
    "follower.replication.throttled.replicas": "*", "message.downconversion.enable": "false",
}


def test_every_kafka4_topic_key_is_accepted_and_described(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("allkeys")
    create(admin, name, KAFKA4_TOPIC_KEYS)
    described = describe(admin, name)
    for key, value in KAFKA4_TOPIC_KEYS.items():
        assert described[key].value == value, key
        assert described[key].source == 1, key  # DYNAMIC_TOPIC_CONFIG
    # A replication key is kept but changes nothing here: the broker says so, once.
    deadline = time.monotonic() + 10
    while "key=unclean.leader.election.enable" not in broker.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.log_text().count("topic config has no effect on this broker") >= 1
    create(admin, unique("allkeys2"), {"unclean.leader.election.enable": "true"})
    assert broker.log_text().count("key=unclean.leader.election.enable") == 1


def test_bad_values_and_small_segments_are_refused(admin: AdminClient) -> None:
    for key, value in (("segment.bytes", str(1024 * 1024 - 1)), ("segment.ms", "0"), ("compression.zstd.level", "23"),
                       ("compression.gzip.level", "0"), ("follower.replication.throttled.replicas", "x"),
                       ("message.timestamp.type", "Now"), ("no.such.key", "1")):
        with pytest.raises(KafkaException) as info:
            create(admin, unique("bad"), {key: value})
        assert info.value.args[0].code() == KafkaError.INVALID_CONFIG, (key, info.value)
    create(admin, unique("mib"), {"segment.bytes": str(1024 * 1024)})


def test_describe_configs_gives_types_documentation_and_synonyms(broker: BrokerProcess) -> None:
    name = unique("synonyms")
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        client.create_topics([KpNewTopic(name, 1, 1, topic_configs={"retention.ms": "60000"})])
        [result] = client._manager.run(client._async_describe_configs,  # the raw entries, docs included
                                       [KpConfigResource(KpConfigResourceType.TOPIC, name)], True, "all", True)
        assert result["retention.ms"]["config_type"] == "LONG"
        assert result["cleanup.policy"]["config_type"] == "LIST"
        assert result["preallocate"]["config_type"] == "BOOLEAN"
        assert [s["name"] for s in result["retention.ms"]["synonyms"]] == ["retention.ms", "log.retention.hours"]
        assert result["segment.ms"]["synonyms"] == [{"name": "log.roll.hours", "value": "168", "source": "DEFAULT_CONFIG"}]
        assert result["segment.ms"]["value"] == str(168 * 3600 * 1000)
    finally:
        client.close()


# ---- the clients that failed ------------------------------------------------------------------------------


def test_quix_streams_topic_with_segment_ms(broker: BrokerProcess, admin: AdminClient, tmp_path: Path) -> None:
    """Quix Streams creates its topics with extra_config; segment.ms used to kill the app at creation."""
    if not QUIX_PYTHON.exists():
        pytest.skip("Quix Streams' venv is missing: `make install-test` builds .venv-quix")
    name = unique("quix")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([str(QUIX_PYTHON), str(QUIX_APP), broker.bootstrap, name, str(tmp_path / "state"),
                          "segment.ms=600000", "segment.jitter.ms=1000"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "produced" in run.stdout
    described = describe(admin, name)
    assert described["segment.ms"].value == "600000"
    assert described["segment.jitter.ms"].value == "1000"
    assert len(consume_all(broker.bootstrap, name, 1)) == 1


def test_kafka_python_alter_configs_segment_ms(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("kpalter")
    create(admin, name)
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # kafka-python checks the key against DescribeConfigs before it sends anything.
        result = client.alter_configs([KpConfigResource(KpConfigResourceType.TOPIC, name, configs={"segment.ms": "60000"})])
        assert result == {"topic": {name: "OK"}}
    finally:
        client.close()
    assert describe(admin, name)["segment.ms"].value == "60000"


async def test_aiokafka_alter_configs(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("aioalter")
    create(admin, name, {"retention.ms": "3600000", "segment.ms": "7200000"})
    client = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await client.start()
    try:
        [resp] = await client.alter_configs([AioConfigResource(AioConfigResourceType.TOPIC, name,
                                                               configs={"retention.ms": "120000"})])
        [(code, _message, _type, resource)] = [tuple(r) for r in resp.resources]
        assert (code, resource) == (0, name)
    finally:
        await client.close()
    described = describe(admin, name)
    assert described["retention.ms"].value == "120000"
    # AlterConfigs replaces the topic's whole set: what was not given returns to its default.
    assert described["segment.ms"].source != 1 and described["segment.ms"].value == str(7 * 24 * 3600 * 1000)


# ---- applied per topic --------------------------------------------------------------------------------------


def test_max_message_bytes_is_per_topic_both_ways(broker: BrokerProcess, admin: AdminClient) -> None:
    big, small = unique("big"), unique("small")
    create(admin, big, {"max.message.bytes": "3000000"})
    create(admin, small, {"max.message.bytes": "2000"})
    conf = {"message.max.bytes": 4_000_000, "compression.type": "none"}
    assert produce_one(broker.bootstrap, big, os.urandom(1_500_000), **conf) is None
    err = produce_one(broker.bootstrap, small, os.urandom(5_000), **conf)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert [len(m.value()) for m in consume_all(broker.bootstrap, big, 1)] == [1_500_000]


def test_log_append_time_topic_stamps_batches(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("lat")
    create(admin, name, {"message.timestamp.type": "LogAppendTime"})
    long_ago = int(time.time() * 1000) - 3_600_000
    before = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(3):
        producer.produce(name, value=b"v%d" % i, timestamp=long_ago)
    producer.flush(30)
    got = consume_all(broker.bootstrap, name, 3)
    assert len(got) == 3
    for msg in got:
        kind, stamp = msg.timestamp()
        assert kind == 2  # TIMESTAMP_LOG_APPEND_TIME
        assert stamp >= before
    for _pos, header in iter_batches(fetch_batches(broker.bootstrap, name)):
        assert header.timestamp_type == 1 and header.max_timestamp >= before


@pytest.mark.parametrize("producer_codec", ["none", "lz4"])
def test_zstd_topic_stores_zstd_batches(broker: BrokerProcess, admin: AdminClient, producer_codec: str) -> None:
    name = unique("zstd")
    create(admin, name, {"compression.type": "zstd", "compression.zstd.level": "9"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": producer_codec,
                         "enable.idempotence": True})
    values = [b"value-%04d " % i * 20 for i in range(200)]
    for value in values:
        producer.produce(name, key=b"k", value=value)
    producer.flush(30)
    stored = fetch_batches(broker.bootstrap, name)
    headers = [h for _p, h in iter_batches(stored)]
    assert headers and all(h.compression == ZSTD for h in headers)
    assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)  # idempotence fields kept
    assert [r.value for r in decode_batches(stored)] == values
    assert [m.value() for m in consume_all(broker.bootstrap, name, len(values))] == values


def test_uncompressed_topic_decompresses(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("plain")
    create(admin, name, {"compression.type": "uncompressed"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "gzip"})
    for i in range(20):
        producer.produce(name, value=b"gz-%d" % i)
    producer.flush(30)
    headers = [h for _p, h in iter_batches(fetch_batches(broker.bootstrap, name))]
    assert headers and all(h.compression == NONE for h in headers)


def test_topic_timestamp_bounds_apply(broker: BrokerProcess, admin: AdminClient) -> None:
    name = unique("bounds")
    create(admin, name, {"message.timestamp.before.max.ms": "60000"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    errors: list[KafkaError | None] = []
    producer.produce(name, value=b"old", timestamp=int(time.time() * 1000) - 3_600_000,
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)  # its own batch: a refusal takes the whole batch
    producer.produce(name, value=b"new", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_TIMESTAMP
    assert errors[1] is None


def test_low_traffic_topic_ages_out(broker: BrokerProcess, admin: AdminClient) -> None:
    """Smaller than one segment, it still empties once past retention.ms: the active segment is rolled first."""
    name = unique("quiet")
    create(admin, name, {"retention.ms": "5000"})
    for i in range(3):
        assert produce_one(broker.bootstrap, name, b"q%d" % i) is None
    tp = TopicPartition(name, 0)
    deadline = time.monotonic() + 60
    earliest = -1
    while time.monotonic() < deadline:
        earliest = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset
        if earliest == 3:
            break
        time.sleep(0.5)
    assert earliest == 3
    assert admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(30).offset == 3
    assert produce_one(broker.bootstrap, name, b"after") is None  # the log goes on from offset 3
    assert [m.offset() for m in consume_all(broker.bootstrap, name, 1)] == [3]


def test_list_offsets_max_timestamp_is_the_first_record_carrying_it(broker: BrokerProcess, admin: AdminClient) -> None:
    """KAFKA-16310: timestamps [-5 s, -1 s, -4 s, -3 s] in one batch answer offset 1."""
    name = unique("maxts")
    create(admin, name)
    now = int(time.time() * 1000)
    stamps = [now - 5000, now - 1000, now - 4000, now - 3000]
    batch = encode_batch([RecordInput(b"k", b"v%d" % i, timestamp=ts) for i, ts in enumerate(stamps)])
    with WireClient.connect(broker.bootstrap) as wire:
        req = messages.ProduceRequest
        part = req.PartitionProduceData(index=0, records=batch)  # type: ignore[attr-defined]
        resp = wire.request(ApiKey.PRODUCE, 9, req(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
            req.TopicProduceData(name=name, partition_data=[part])]))  # type: ignore[attr-defined]
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.NONE
    tp = TopicPartition(name, 0)
    found = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(30)
    assert (found.offset, found.timestamp) == (1, now - 1000)


def test_append_and_subtract_on_cleanup_policy(admin: AdminClient) -> None:
    name = unique("listops")
    create(admin, name)

    def change(op: AlterConfigOpType, value: str) -> None:
        target = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
            ConfigEntry("cleanup.policy", value, incremental_operation=op)])
        admin.incremental_alter_configs([target])[target].result(30)

    change(AlterConfigOpType.APPEND, "compact")
    assert describe(admin, name)["cleanup.policy"].value == "delete,compact"
    change(AlterConfigOpType.SUBTRACT, "delete")
    assert describe(admin, name)["cleanup.policy"].value == "compact"
    bad = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(KafkaException) as info:
        admin.incremental_alter_configs([bad])[bad].result(30)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_compacted_topic_names_each_keyless_record(broker: BrokerProcess, admin: AdminClient) -> None:
    """Kafka refuses the whole batch but lists each keyless record in RecordErrors, so librdkafka fails only
    those with INVALID_RECORD and the others with _INVALID_DIFFERENT_RECORD (librdkafka's test 0011)."""
    name = unique("keyless")
    create(admin, name, {"cleanup.policy": "compact"})
    outcome: dict[int, int] = {}
    # One batch of all ten, whatever the machine's load: the partition is known before the first record (a
    # record waiting for metadata would start its linger early), and linger.ms outlasts the loop, since
    # flush() sends at once whatever linger is left.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 60_000, "retries": 0})
    producer.list_topics(name, timeout=30)
    for i in range(10):
        key = None if i % 5 == 0 else b"k%d" % i

        def delivered(err: KafkaError | None, _msg: Any, i: int = i) -> None:
            outcome[i] = err.code() if err is not None else 0

        producer.produce(name, key=key, value=b"v%d" % i, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert outcome == {i: KafkaError.INVALID_RECORD if i % 5 == 0 else KafkaError._INVALID_DIFFERENT_RECORD
                       for i in range(10)}
    assert fetch_batches(broker.bootstrap, name) == b""


def test_dynamic_broker_defaults_reach_topics(tmp_path: Path) -> None:
    """A broker's log default changed at runtime applies to every topic that does not set the key, as in
    Kafka's DynamicLogConfig; keys Kafka treats as dynamic that mean nothing here are accepted."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        plain, own = unique("dyn"), unique("own")
        create(admin, plain)
        create(admin, own, {"max.message.bytes": "1000000"})

        def set_broker(key: str, value: str) -> None:
            resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
            admin.incremental_alter_configs([resource])[resource].result(30)

        set_broker("message.max.bytes", "2000")
        entry = describe(admin, plain)["max.message.bytes"]
        assert (entry.value, entry.source) == ("2000", 2)  # DYNAMIC_BROKER_CONFIG
        err = produce_one(broker.bootstrap, plain, os.urandom(5000), **{"compression.type": "none"})
        assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert produce_one(broker.bootstrap, own, os.urandom(5000), **{"compression.type": "none"}) is None
        set_broker("sasl.kerberos.min.time.before.relogin", "60000")
        assert "key=sasl.kerberos.min.time.before.relogin" in broker.log_text()
        with pytest.raises(KafkaException):
            set_broker("compression.type", "brotli")
    finally:
        broker.stop()


def test_kip848_group_configs_are_accepted_and_applied(broker: BrokerProcess, admin: AdminClient) -> None:
    """consumer.session.timeout.ms / consumer.heartbeat.interval.ms per group, within the broker's bounds."""
    topic, group = unique("cg"), unique("cgroup")
    create(admin, topic)

    def set_group(key: str, value: str) -> None:
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)

    set_group("consumer.heartbeat.interval.ms", "7000")
    set_group("consumer.session.timeout.ms", "50000")
    with pytest.raises(KafkaException) as info:
        set_group("consumer.session.timeout.ms", "70000")  # above group.consumer.max.session.timeout.ms
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    described = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])[
        ConfigResource(ResourceType.GROUP, group)].result(30)
    assert described["consumer.session.timeout.ms"].value == "50000"
    with WireClient.connect(broker.bootstrap) as wire:
        hb = messages.ConsumerGroupHeartbeatRequest
        resp = wire.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, hb(
            group_id=group, member_id=uuid.uuid4().hex, member_epoch=0, instance_id=None, rack_id=None,
            rebalance_timeout_ms=30000, subscribed_topic_names=[topic], server_assignor=None, topic_partitions=[]))
        assert resp.error_code == ErrorCode.NONE
        assert resp.heartbeat_interval_ms == 7000  # the group's own, not the broker's 5000
