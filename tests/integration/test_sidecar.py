"""Sidecar mode against a real upstream: a standalone Shoal broker process is the upstream, a second Shoal
process started with `upstream.bootstrap.servers` is the sidecar. Clients are pointed only at the sidecar;
what they did is checked by reading the upstream directly."""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import NO_JOIN_DELAY
from .kafka_wire import WireClient
from .names import unique_name
from .test_metrics import scrape
from .test_security import make_pki, sasl_plain

SIDECAR_NODE_ID = 7  # not the upstream's node id, so a leaked upstream id would show
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_shoal="shoal-secret";'


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("upstream") / "data", overrides=NO_JOIN_DELAY).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, upstream: BrokerProcess) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("sidecar") / "data", overrides=[
        f"node.id={SIDECAR_NODE_ID}", f"upstream.bootstrap.servers={upstream.bootstrap}"]).start()
    yield proc
    proc.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def read_upstream(upstream: BrokerProcess, topic: str, partitions: int, expected: int, *,
                  isolation: str = "read_uncommitted") -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Everything in `topic`, read straight from the upstream, per partition in offset order."""
    consumer = Consumer({"bootstrap.servers": upstream.bootstrap, "group.id": unique_name("check"),
                         "enable.auto.commit": False, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(partitions)}
    got = idle = 0
    try:
        while got < expected or idle < 3:
            msg = consumer.poll(1.0)
            if msg is None:
                idle += 1
                if idle > 30:
                    break
                continue
            assert msg.error() is None, msg.error()
            out[msg.partition()].append((msg.key(), msg.value()))
            got += 1
            idle = 0 if got < expected else idle
    finally:
        consumer.close()
    return out


def produce_direct(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


# ---- discovery ----------------------------------------------------------------------------------


def test_metadata_names_only_the_sidecar_and_the_upstream_topics(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("md")
    create_topic(upstream.bootstrap, topic, 3)
    with WireClient.connect(sidecar.bootstrap) as client:
        md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
        found = client.request(ApiKey.FIND_COORDINATOR, 4, messages.FindCoordinatorRequest(
            key_type=0, coordinator_keys=["some-group"]))
    assert [(b.node_id, b.host, b.port) for b in md.brokers] == [(SIDECAR_NODE_ID, "127.0.0.1", sidecar.port)]
    assert md.controller_id == SIDECAR_NODE_ID
    (t,) = md.topics
    assert t.error_code == ErrorCode.NONE and t.name == topic
    assert sorted(p.partition_index for p in t.partitions) == [0, 1, 2]
    assert {p.leader_id for p in t.partitions} == {SIDECAR_NODE_ID}
    # The topic id is the upstream's, so topic-id requests (Fetch v13+) mean the same topic on both.
    with WireClient.connect(upstream.bootstrap) as client:
        up = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
    assert t.topic_id == up.topics[0].topic_id
    (c,) = found.coordinators
    assert (c.error_code, c.node_id, c.port) == (ErrorCode.NONE, SIDECAR_NODE_ID, sidecar.port)
    # KIP-966's DescribeTopicPartitions (newer admin clients' describeTopics) tells the same story.
    with WireClient.connect(sidecar.bootstrap) as client:
        described = client.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, messages.DescribeTopicPartitionsRequest(
            topics=[messages.DescribeTopicPartitionsRequest.TopicRequest(name=topic)], response_partition_limit=100))
    (dt,) = described.topics
    assert (dt.error_code, dt.topic_id) == (ErrorCode.NONE, t.topic_id)
    assert [(p.partition_index, p.leader_id, p.replica_nodes) for p in dt.partitions] == \
        [(i, SIDECAR_NODE_ID, [SIDECAR_NODE_ID]) for i in range(3)]


# ---- produce ------------------------------------------------------------------------------------


def test_idempotent_producer_through_the_sidecar_lands_in_the_upstream(upstream: BrokerProcess,
                                                                        sidecar: BrokerProcess) -> None:
    topic = unique_name("idem")
    create_topic(sidecar.bootstrap, topic, 4)
    producer = Producer({"bootstrap.servers": sidecar.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(4)}
    for i in range(2000):
        key, value = f"k{i}".encode(), f"value-{i}".encode() * 3
        producer.produce(topic, key=key, value=value, partition=i % 4)
        sent[i % 4].append((key, value))
    assert producer.flush(30) == 0
    assert read_upstream(upstream, topic, 4, 2000) == sent


def test_transactional_producer_commits_and_aborts_through_the_sidecar(upstream: BrokerProcess,
                                                                       sidecar: BrokerProcess) -> None:
    topic = unique_name("txn")
    group = unique_name("txn-group")
    create_topic(sidecar.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": sidecar.bootstrap, "transactional.id": unique_name("tid")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=b"committed", value=str(i).encode(), partition=i % 2)
    # Offsets sent in the transaction go to the upstream's group coordinator (AddOffsetsToTxn, TxnOffsetCommit).
    consumer = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group})
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 42)], consumer.consumer_group_metadata(), 30)
    consumer.close()
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"aborted", value=str(i).encode(), partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)

    committed = read_upstream(upstream, topic, 2, 10, isolation="read_committed")
    assert sorted(v for recs in committed.values() for k, v in recs if k == b"committed") == \
        sorted(str(i).encode() for i in range(10))
    assert all(k == b"committed" for recs in committed.values() for k, _ in recs)
    check = Consumer({"bootstrap.servers": upstream.bootstrap, "group.id": group})
    try:
        (tp,) = check.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        check.close()
    assert tp.offset == 42


def test_upstream_errors_reach_the_client(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("errors")
    create_topic(upstream.bootstrap, topic, 1)
    produce_direct(upstream.bootstrap, topic, [(0, b"k", b"v")])
    fetch = messages.FetchRequest
    with WireClient.connect(sidecar.bootstrap) as client:
        far = client.request(ApiKey.FETCH, 12, fetch(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[fetch.FetchTopic(topic=topic, partitions=[fetch.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=1_000_000, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""))
        missing = client.request(ApiKey.LIST_OFFSETS, 7, messages.ListOffsetsRequest(
            replica_id=-1, isolation_level=0, topics=[messages.ListOffsetsRequest.ListOffsetsTopic(
                name=topic, partitions=[messages.ListOffsetsRequest.ListOffsetsPartition(
                    partition_index=5, current_leader_epoch=-1, timestamp=-1)])]))
        duplicate = client.request(ApiKey.CREATE_TOPICS, 5, messages.CreateTopicsRequest(
            topics=[messages.CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=1, replication_factor=1,
                                                                assignments=[], configs=[])], timeout_ms=10_000))
    (part,) = far.responses[0].partitions
    assert part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert part.high_watermark == 1
    assert missing.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert duplicate.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS


def test_upstream_requests_show_in_the_sidecars_metrics(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("metrics")
    create_topic(sidecar.bootstrap, topic, 1)
    before, _ = scrape(sidecar)
    produce_direct(sidecar.bootstrap, topic, [(0, b"k", b"v")])
    after, types = scrape(sidecar)
    key = ("shoal_upstream_request_latency_seconds_count", (("api", "Produce"), ("broker", "1")))
    assert after[key] > before.get(key, 0)
    assert types["shoal_upstream_request_failures"] == "counter"


# ---- consume ------------------------------------------------------------------------------------


def test_consumer_by_assign_and_in_a_classic_group_through_the_sidecar(upstream: BrokerProcess,
                                                                      sidecar: BrokerProcess) -> None:
    topic = unique_name("consume")
    create_topic(upstream.bootstrap, topic, 3)
    records = [(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(300)]
    produce_direct(upstream.bootstrap, topic, records)

    by_assign = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": unique_name("unused"),
                          "enable.auto.commit": False})
    by_assign.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got = _poll(by_assign, 300)
    by_assign.close()
    assert sorted(got) == sorted((p, k, v) for p, k, v in records)

    group = unique_name("classic")
    member = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                       "enable.auto.commit": False})
    member.subscribe([topic])
    got = _poll(member, 300)
    member.commit(asynchronous=False)
    member.close()
    assert sorted(got) == sorted(records)
    # The group and its offsets live in the upstream.
    admin = AdminClient({"bootstrap.servers": upstream.bootstrap})
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions if tp.topic == topic} == {0: 100, 1: 100, 2: 100}

    # The group administration through the sidecar acts on the upstream's group.
    side_admin = AdminClient({"bootstrap.servers": sidecar.bootstrap})
    listed = side_admin.list_consumer_groups().result(30)
    assert group in {g.group_id for g in listed.valid}
    described = side_admin.describe_consumer_groups([group])[group].result(30)
    assert (described.group_id, described.members) == (group, [])
    side_admin.delete_consumer_groups([group])[group].result(30)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}


def test_consumer_group_protocol_through_the_sidecar(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    """KIP-848: ConsumerGroupHeartbeat goes to the upstream's group coordinator; its assignment names the
    upstream's topic ids, which the sidecar's Metadata also gives."""
    topic = unique_name("kip848")
    create_topic(upstream.bootstrap, topic, 2)
    records = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(100)]
    produce_direct(upstream.bootstrap, topic, records)
    group = unique_name("kip848-group")
    member = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group, "group.protocol": "consumer",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    member.subscribe([topic])
    got = _poll(member, 100)
    member.commit(asynchronous=False)
    with WireClient.connect(sidecar.bootstrap) as client:
        described = client.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
            group_ids=[group], include_authorized_operations=False))
    member.close()
    assert sorted(got) == sorted(records)
    (dg,) = described.groups
    assert (dg.error_code, dg.group_id, len(dg.members)) == (ErrorCode.NONE, group, 1)
    admin = AdminClient({"bootstrap.servers": upstream.bootstrap})
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions if tp.topic == topic} == {0: 50, 1: 50}


def _poll(consumer: Consumer, expected: int) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    idle = 0
    while len(out) < expected and idle < 60:
        msg = consumer.poll(0.5)
        if msg is None:
            idle += 1
            continue
        assert msg.error() is None, msg.error()
        out.append((msg.partition(), msg.key(), msg.value()))
    return out


# ---- administration -----------------------------------------------------------------------------


def test_admin_client_through_the_sidecar_changes_the_upstream(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("admin")
    admin = AdminClient({"bootstrap.servers": sidecar.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    up = AdminClient({"bootstrap.servers": upstream.bootstrap})
    assert len(up.list_topics(topic, timeout=30).topics[topic].partitions) == 2

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    change = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(30)
    assert up.describe_configs([resource])[resource].result(30)["retention.ms"].value == "123456"
    assert admin.describe_configs([resource])[resource].result(30)["retention.ms"].value == "123456"

    produce_direct(upstream.bootstrap, topic, [(0, b"k", str(i).encode()) for i in range(10)])
    tp0 = TopicPartition(topic, 0)
    admin.delete_records([TopicPartition(topic, 0, 4)])[TopicPartition(topic, 0, 4)].result(30)
    earliest = up.list_offsets({tp0: OffsetSpec.earliest()})[tp0].result(30)
    latest = admin.list_offsets({tp0: OffsetSpec.latest()})[tp0].result(30)
    assert (earliest.offset, latest.offset) == (4, 10)

    admin.delete_topics([topic])[topic].result(30)
    for _ in range(50):
        if topic not in up.list_topics(timeout=30).topics:
            break
        time.sleep(0.1)
    assert topic not in up.list_topics(timeout=30).topics


# ---- other clients ------------------------------------------------------------------------------


def test_kafka_python_through_the_sidecar(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("kp")
    create_topic(upstream.bootstrap, topic, 2)
    producer = KafkaProducer(bootstrap_servers=sidecar.bootstrap)
    for i in range(50):
        producer.send(topic, key=b"kp", value=str(i).encode(), partition=i % 2)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=sidecar.bootstrap, group_id=None, enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    consumer.assign([KpTopicPartition(topic, 0), KpTopicPartition(topic, 1)])
    consumer.seek_to_beginning()
    values = sorted(int(m.value) for m in consumer)
    consumer.close()
    assert values == list(range(50))
    assert sum(len(v) for v in read_upstream(upstream, topic, 2, 50).values()) == 50
    # acks=0: no answer is owed, and none comes; the records still reach the upstream leader.
    fire_and_forget = KafkaProducer(bootstrap_servers=sidecar.bootstrap, acks=0)
    for i in range(50, 60):
        fire_and_forget.send(topic, key=b"kp", value=str(i).encode(), partition=0)
    fire_and_forget.flush(30)
    fire_and_forget.close()
    assert sum(len(v) for v in read_upstream(upstream, topic, 2, 60).values()) == 60


def test_aiokafka_through_the_sidecar(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic = unique_name("aio")
    create_topic(upstream.bootstrap, topic, 2)

    async def run() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=sidecar.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(50):
                await producer.send_and_wait(topic, str(i).encode(), partition=i % 2)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=sidecar.bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(topic, 0), AioTopicPartition(topic, 1)])
            await consumer.seek_to_beginning()
            out: list[int] = []
            while len(out) < 50:
                batches = await consumer.getmany(timeout_ms=10_000)
                if not batches:
                    break
                out += [int(m.value) for msgs in batches.values() for m in msgs]
            return sorted(out)
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == list(range(50))
    assert sum(len(v) for v in read_upstream(upstream, topic, 2, 50).values()) == 50


# ---- start-up -----------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_upstream_stops_start_up_with_the_reason(tmp_path: Path) -> None:
    port = _closed_port()
    proc = BrokerProcess(tmp_path / "data", overrides=[f"upstream.bootstrap.servers=127.0.0.1:{port}",
                                                       "upstream.request.timeout.ms=2000"])
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    proc.stop()
    assert f"upstream 127.0.0.1:{port} is unreachable" in proc.log_text()


def test_an_unknown_upstream_setting_is_refused_at_start_up(tmp_path: Path, upstream: BrokerProcess) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides=[f"upstream.bootstrap.servers={upstream.bootstrap}",
                                                       "upstream.no.such.setting=1"])
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    proc.stop()
    assert "upstream.no.such.setting is not a client setting" in proc.log_text()


@pytest.fixture(scope="module")
def sasl_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("sasl-upstream") / "data", overrides=[
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={PLAIN_JAAS}",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
    ], extra_listeners=["SASL_PLAINTEXT://127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def _sasl_sidecar(tmp_path: Path, upstream: BrokerProcess, password: str) -> BrokerProcess:
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="shoal" password="{password}";'
    return BrokerProcess(tmp_path / "data", overrides=[
        f"upstream.bootstrap.servers={upstream.address('SASL_PLAINTEXT')}",
        "upstream.security.protocol=SASL_PLAINTEXT", "upstream.sasl.mechanism=PLAIN",
        f"upstream.sasl.jaas.config={jaas}"])


def test_wrong_upstream_credentials_stop_start_up(tmp_path: Path, sasl_upstream: BrokerProcess) -> None:
    proc = _sasl_sidecar(tmp_path, sasl_upstream, "wrong")
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    proc.stop()
    assert f"authentication with upstream {sasl_upstream.address('SASL_PLAINTEXT')} failed" in proc.log_text()


def test_sasl_to_the_upstream(tmp_path: Path, sasl_upstream: BrokerProcess) -> None:
    proc = _sasl_sidecar(tmp_path, sasl_upstream, "shoal-secret").start()
    try:
        topic = unique_name("sasl")
        create_topic(proc.bootstrap, topic, 1)
        produce_direct(proc.bootstrap, topic, [(0, b"k", b"through SASL")])
        assert read_upstream(sasl_upstream, topic, 1, 1) == {0: [(b"k", b"through SASL")]}
    finally:
        proc.stop()


# ---- Shoal's own ACLs ---------------------------------------------------------------------------

ACL_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'


@pytest.fixture(scope="module")
def acl_sidecar(tmp_path_factory: pytest.TempPathFactory, upstream: BrokerProcess) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("acl-sidecar") / "data", overrides=[
        f"upstream.bootstrap.servers={upstream.bootstrap}",
        # A sidecar of its own beside the module's other one, not a second member of its sidecar group.
        f"upstream.membership.group.id={unique_name('acl-sidecars')}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:ANONYMOUS",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={ACL_JAAS}",
    ], extra_listeners=["SASL_PLAINTEXT://127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def test_the_sidecars_acls_guard_the_upstream_topics(upstream: BrokerProcess, acl_sidecar: BrokerProcess) -> None:
    readable, described = unique_name("acl-read"), unique_name("acl-describe")
    for topic in (readable, described):
        create_topic(upstream.bootstrap, topic, 1)
        produce_direct(upstream.bootstrap, topic, [(0, b"k", b"secret")])
    admin = AdminClient({"bootstrap.servers": acl_sidecar.bootstrap})  # ANONYMOUS is a super user
    bindings = [AclBinding(ResourceType.TOPIC, readable, ResourcePatternType.LITERAL, "User:alice", "*", op,
                           AclPermissionType.ALLOW) for op in (AclOperation.READ, AclOperation.DESCRIBE)]
    bindings.append(AclBinding(ResourceType.TOPIC, described, ResourcePatternType.LITERAL, "User:alice", "*",
                               AclOperation.DESCRIBE, AclPermissionType.ALLOW))
    # The consumers' group ids (their coordinator lookups are authorized by group, not topic).
    bindings.append(AclBinding(ResourceType.GROUP, "*", ResourcePatternType.LITERAL, "User:alice", "*",
                               AclOperation.READ, AclPermissionType.ALLOW))
    for future in admin.create_acls(bindings).values():
        future.result(30)
    alice = {"bootstrap.servers": acl_sidecar.address("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}

    reader = Consumer({**alice, "group.id": unique_name("unused"), "enable.auto.commit": False})
    reader.assign([TopicPartition(readable, 0, 0)])
    assert [(p, v) for p, _, v in _poll(reader, 1)] == [(0, b"secret")]
    reader.close()

    # DESCRIBE but not READ: the topic is visible, its records are not, whether named or given by id.
    fetch = messages.FetchRequest
    with WireClient.connect(acl_sidecar.address("SASL_PLAINTEXT")) as client:
        assert sasl_plain(client, "alice", "alice-secret").error_code == ErrorCode.NONE
        md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=described)], allow_auto_topic_creation=False))
        assert md.topics[0].error_code == ErrorCode.NONE
        for version, by_name in ((12, True), (13, False)):
            topic = fetch.FetchTopic(topic=described if by_name else "", topic_id=md.topics[0].topic_id,
                                     partitions=[fetch.FetchPartition(
                                         partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                         log_start_offset=-1, partition_max_bytes=1 << 20)])
            response = client.request(ApiKey.FETCH, version, fetch(
                replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[topic], forgotten_topics_data=[], rack_id=""))
            (part,) = response.responses[0].partitions
            assert (part.error_code, part.records) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)

    # READ but not WRITE: the produce is refused and nothing reaches the upstream.
    failures: list[KafkaError] = []
    producer = Producer({**alice, "message.send.max.retries": 0})
    producer.produce(readable, value=b"not allowed", partition=0,
                     on_delivery=lambda err, _msg: failures.append(err) if err is not None else None)
    producer.flush(30)
    assert [f.code() for f in failures] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert read_upstream(upstream, readable, 1, 1) == {0: [(b"k", b"secret")]}


def test_the_sidecars_acls_guard_upstream_administration_and_transactions(upstream: BrokerProcess,
                                                                          acl_sidecar: BrokerProcess) -> None:
    existing, wanted = unique_name("acl-admin"), unique_name("acl-new")
    create_topic(upstream.bootstrap, existing, 1)
    alice = {"bootstrap.servers": acl_sidecar.address("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}
    admin = AdminClient(alice)
    with pytest.raises(KafkaException) as created:
        admin.create_topics([NewTopic(wanted, 1, 1)])[wanted].result(30)
    assert created.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as deleted:
        admin.delete_topics([existing])[existing].result(30)
    assert deleted.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    resource = ConfigResource(ConfigResource.Type.TOPIC, existing)
    with pytest.raises(KafkaException) as described:
        admin.describe_configs([resource])[resource].result(30)
    assert described.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    up = AdminClient({"bootstrap.servers": upstream.bootstrap})
    topics = up.list_topics(timeout=30).topics
    assert existing in topics and wanted not in topics

    producer = Producer({**alice, "transactional.id": unique_name("acl-tid")})
    with pytest.raises(KafkaException) as init:
        producer.init_transactions(30)
    assert init.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_the_sidecar_lists_only_the_upstream_groups_a_principal_may_describe(upstream: BrokerProcess,
                                                                            acl_sidecar: BrokerProcess) -> None:
    """As Kafka's ListGroups: without DESCRIBE on the cluster, a group is listed only if the principal may
    describe it (a DENY wins over the READ on every group another test of this module grants)."""
    topic, seen, hidden = unique_name("acl-groups"), unique_name("acl-seen"), unique_name("acl-hidden")
    create_topic(upstream.bootstrap, topic, 1)
    for group in (seen, hidden):  # empty classic groups with an offset, on the upstream
        committer = Consumer({"bootstrap.servers": upstream.bootstrap, "group.id": group,
                              "enable.auto.commit": False})
        committer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        committer.close()
    admin = AdminClient({"bootstrap.servers": acl_sidecar.bootstrap})
    bindings = [AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.DESCRIBE, permission)
                for group, permission in ((seen, AclPermissionType.ALLOW), (hidden, AclPermissionType.DENY))]
    for future in admin.create_acls(bindings).values():
        future.result(30)

    def listed(address: str, user: str | None) -> set[str]:
        with WireClient.connect(address) as client:
            if user is not None:
                assert sasl_plain(client, user, f"{user}-secret").error_code == ErrorCode.NONE
            response = client.request(ApiKey.LIST_GROUPS, 5, messages.ListGroupsRequest(states_filter=[],
                                                                                       types_filter=[]))
        assert response.error_code == ErrorCode.NONE
        return {g.group_id for g in response.groups}

    assert {seen, hidden} <= listed(acl_sidecar.bootstrap, None)  # ANONYMOUS is a super user
    alice = listed(acl_sidecar.address("SASL_PLAINTEXT"), "alice")
    assert seen in alice and hidden not in alice


# ---- TLS to the upstream ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, dict[str, Path]]]:
    pki = make_pki(tmp_path_factory.mktemp("sidecar-pki"))
    # Kafka's PEM keystore: the client's certificate and key in one file.
    pki["alice.pem"] = pki["alice.crt"].with_name("alice.pem")
    pki["alice.pem"].write_text(pki["alice.crt"].read_text() + pki["alice.key"].read_text())
    pki["other-ca.pem"] = pki["ca.pem"].with_name("other-ca.pem")
    proc = BrokerProcess(tmp_path_factory.mktemp("tls-upstream") / "data", overrides=[
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL",
        f"ssl.keystore.location={pki['server.pem']}", f"ssl.truststore.location={pki['ca.pem']}",
        "listener.name.ssl.ssl.client.auth=required",
    ], extra_listeners=["SSL://127.0.0.1:0"]).start()
    yield proc, pki
    proc.stop()


def _tls_sidecar(tmp_path: Path, upstream: BrokerProcess, pki: dict[str, Path], ca: str) -> BrokerProcess:
    return BrokerProcess(tmp_path / "data", overrides=[
        f"upstream.bootstrap.servers={upstream.address('SSL')}", "upstream.security.protocol=SSL",
        f"upstream.ssl.truststore.location={pki[ca]}", "upstream.ssl.truststore.type=PEM",
        f"upstream.ssl.keystore.location={pki['alice.pem']}", "upstream.ssl.keystore.type=PEM"])


def test_tls_with_a_client_certificate_to_the_upstream(tmp_path: Path,
                                                       tls_upstream: tuple[BrokerProcess, dict[str, Path]]) -> None:
    upstream_, pki = tls_upstream
    proc = _tls_sidecar(tmp_path, upstream_, pki, "ca.pem").start()
    try:
        topic = unique_name("tls")
        create_topic(proc.bootstrap, topic, 1)
        produce_direct(proc.bootstrap, topic, [(0, b"k", b"through TLS")])
        assert read_upstream(upstream_, topic, 1, 1) == {0: [(b"k", b"through TLS")]}
    finally:
        proc.stop()


def test_an_untrusted_upstream_certificate_stops_start_up(tmp_path: Path,
                                                           tls_upstream: tuple[BrokerProcess, dict[str, Path]]) -> None:
    upstream_, pki = tls_upstream
    proc = _tls_sidecar(tmp_path, upstream_, pki, "other-ca.pem")
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    proc.stop()
    assert f"authentication with upstream {upstream_.address('SSL')} failed" in proc.log_text()


def test_a_join_group_waiting_upstream_holds_up_no_other_request(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    """A broker answers one request of a connection at a time, and a JoinGroup waits there until the
    group's other members rejoin. Sent on the sidecar's shared upstream connection, it held up everything
    behind it (Metadata, produce, other groups' heartbeats) for up to the rebalance timeout."""
    group = unique_name("join")
    join = messages.JoinGroupRequest

    def join_body(member_id: str) -> messages.JoinGroupRequest:
        return join(group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=30_000, member_id=member_id,
                    protocol_type="consumer", protocols=[join.JoinGroupRequestProtocol(name="range", metadata=b"")])

    def group_state() -> str:
        with WireClient.connect(upstream.bootstrap) as direct:
            described = direct.request(ApiKey.DESCRIBE_GROUPS, 3, messages.DescribeGroupsRequest(groups=[group]))
        return str(described.groups[0].group_state)

    def member_id(client: WireClient) -> str:
        """The member id the coordinator hands out on a first join (KIP-394's MEMBER_ID_REQUIRED round)."""
        answer = client.request(ApiKey.JOIN_GROUP, 5, join_body(""))
        assert answer.error_code == ErrorCode.MEMBER_ID_REQUIRED and answer.member_id
        return str(answer.member_id)

    with WireClient.connect(sidecar.bootstrap) as first, WireClient.connect(sidecar.bootstrap) as second, \
            WireClient.connect(sidecar.bootstrap) as other:
        first_id = member_id(first)
        joined = first.request(ApiKey.JOIN_GROUP, 5, join_body(first_id))
        assert joined.error_code == ErrorCode.NONE
        # The second member's join waits upstream until the first rejoins.
        second.send(ApiKey.JOIN_GROUP, 5, join_body(member_id(second)))
        deadline = time.monotonic() + 30
        while group_state() != "PreparingRebalance":
            assert time.monotonic() < deadline, group_state()
            time.sleep(0.05)
        metadata = other.request(ApiKey.METADATA, 9, messages.MetadataRequest(topics=None,
                                                                             allow_auto_topic_creation=False))
        assert metadata.brokers
        assert select.select([second.sock], [], [], 0)[0] == []  # still waiting for the rebalance
        # The first member rejoins: the rebalance completes and both are answered.
        rejoined = first.request(ApiKey.JOIN_GROUP, 5, join_body(first_id))
        _, second_joined = second.receive(ApiKey.JOIN_GROUP, 5)
        assert rejoined.error_code == second_joined.error_code == ErrorCode.NONE
        assert rejoined.generation_id == second_joined.generation_id > joined.generation_id
