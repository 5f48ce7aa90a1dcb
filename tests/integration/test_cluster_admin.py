"""The cluster admin APIs Kafka serves and a single node answers: offered in ApiVersions, and answered as
Kafka answers them on one broker, through kafka-python and confluent-kafka (client quotas through the wire,
as neither Python client has them)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient, alter_client_quota
from .test_security import sasl_plain

NEW_APIS = (ApiKey.ALTER_CONFIGS, ApiKey.DESCRIBE_LOG_DIRS, ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            ApiKey.LIST_PARTITION_REASSIGNMENTS, ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS,
            ApiKey.DESCRIBE_QUORUM, ApiKey.UPDATE_FEATURES)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("cluster-admin") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def kp_admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topic_with_data(broker: BrokerProcess, admin: AdminClient, partitions: int = 1) -> str:
    from confluent_kafka import Producer

    name = unique("ca")
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(name, value=b"x" * 100, partition=0, key=b"%d" % i)
    producer.flush(30)
    return name


def test_api_versions_offer_the_admin_apis(broker: BrokerProcess) -> None:
    with WireClient.connect(broker.bootstrap) as wire:
        resp = wire.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
            client_software_name="t", client_software_version="1"))
    offered = {k.api_key for k in resp.api_keys}
    assert set(NEW_APIS) <= offered


def test_describe_log_dirs(broker: BrokerProcess, admin: AdminClient, kp_admin: KafkaAdminClient) -> None:
    name = topic_with_data(broker, admin, partitions=2)
    [entry] = kp_admin.describe_log_dirs({name: [0, 1, 7]})
    [log_dir] = entry["log_dirs"]
    assert log_dir["error_code"] == 0 and Path(log_dir["log_dir"]) == broker.data_dir.resolve()
    assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
    [topic] = log_dir["topics"]
    sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
    # Partition 7 does not exist and is left out; partition 0 holds the ten records, partition 1 none.
    on_disk = sum(f.stat().st_size for f in (broker.data_dir / f"{name}-0").glob("*.log"))
    assert sizes == {0: on_disk, 1: 0} and on_disk > 1000


def test_elect_leaders_is_never_needed(broker: BrokerProcess, admin: AdminClient) -> None:
    name = topic_with_data(broker, admin)
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(name, 0), TopicPartition(name, 5)]).result(30)
    errors = {tp.partition: err.code() if err is not None else None for tp, err in result.items()}
    assert errors == {0: ErrorCode.ELECTION_NOT_NEEDED, 5: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    result = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(name, 0)]).result(30)
    assert [err.code() for err in result.values() if err is not None] == [ErrorCode.ELECTION_NOT_NEEDED]
    # For all partitions Kafka leaves out the ones whose leader is already the preferred one: all of them.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(30) == {}


def test_partition_reassignments(broker: BrokerProcess, admin: AdminClient, kp_admin: KafkaAdminClient) -> None:
    name = topic_with_data(broker, admin)
    tp = KpTopicPartition(name, 0)
    assert kp_admin.alter_partition_reassignments({tp: [1]}) == {tp: None}  # the assignment it has
    result = kp_admin.alter_partition_reassignments({tp: [2]})
    assert result[tp] is InvalidReplicationAssignmentError or isinstance(result[tp], InvalidReplicationAssignmentError)
    result = kp_admin.alter_partition_reassignments({tp: None})
    assert result[tp] is NoReassignmentInProgressError or isinstance(result[tp], NoReassignmentInProgressError)
    assert kp_admin.list_partition_reassignments() == {}


def test_describe_metadata_quorum(broker: BrokerProcess, kp_admin: KafkaAdminClient) -> None:
    quorum = kp_admin.describe_metadata_quorum()
    [topic] = quorum["topics"]
    [part] = topic["partitions"]
    assert topic["topic_name"] == "__cluster_metadata" and part["leader_id"] == 1
    assert [v["replica_id"] for v in part["current_voters"]] == [1] and part["observers"] == []
    assert [n["node_id"] for n in quorum["nodes"]] == [1]


def test_update_features(broker: BrokerProcess) -> None:
    uf = messages.UpdateFeaturesRequest
    with WireClient.connect(broker.bootstrap) as wire:
        def update(feature: str, level: int) -> Any:
            return wire.request(ApiKey.UPDATE_FEATURES, 1, uf(timeout_ms=1000, validate_only=False, feature_updates=[
                uf.FeatureUpdateKey(feature=feature, max_version_level=level, upgrade_type=1)]))  # type: ignore[attr-defined]

        same = update("share.version", 2)
        assert same.error_code == ErrorCode.NONE and [r.error_code for r in same.results] == [ErrorCode.NONE]
        other = update("share.version", 1)
        assert [r.error_code for r in other.results] == [ErrorCode.INVALID_UPDATE_VERSION]
        unknown = update("no.such.version", 1)
        assert [r.error_code for r in unknown.results] == [ErrorCode.INVALID_UPDATE_VERSION]


def _describe_quotas(wire: WireClient, components: list[tuple[str, int, str | None]], strict: bool = False) -> Any:
    dcq = messages.DescribeClientQuotasRequest
    return wire.request(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, dcq(strict=strict, components=[
        dcq.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components]))  # type: ignore[attr-defined]


def test_client_quotas_are_kept_and_described(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with WireClient.connect(broker.bootstrap) as wire:
            assert alter_client_quota(wire, [("producer_byte_rate", 1024.0, False)], user="alice").error_code == ErrorCode.NONE
            assert alter_client_quota(wire, [("consumer_byte_rate", 2048.0, False)], user="alice",
                                client_id="app").error_code == ErrorCode.NONE
            assert alter_client_quota(wire, [("request_percentage", 50.0, False)], user=None).error_code == ErrorCode.NONE
            refused = [
                alter_client_quota(wire, [("no_such_quota", 1.0, False)], user="bob"),
                alter_client_quota(wire, [("producer_byte_rate", 1.5, False)], user="bob"),
                alter_client_quota(wire, [("producer_byte_rate", 0.0, False)], user="bob"),
                alter_client_quota(wire, [("connection_creation_rate", 5.0, False)], user="bob", ip="10.0.0.1"),
                alter_client_quota(wire, [("producer_byte_rate", 1.0, False)], group="g"),
            ]
            assert [r.error_code for r in refused] == [ErrorCode.INVALID_REQUEST] * 5
            assert refused[1].error_message == "producer_byte_rate cannot be a fractional value."
        broker.stop()
        broker.start()  # quotas persist
        with WireClient.connect(broker.bootstrap) as wire:
            exact = _describe_quotas(wire, [("user", 0, "alice")])
            found = {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
                     for entry in exact.entries}
            assert found == {(("user", "alice"),): {"producer_byte_rate": 1024.0},
                             (("user", "alice"), ("client-id", "app")): {"consumer_byte_rate": 2048.0}}
            strict = _describe_quotas(wire, [("user", 0, "alice")], strict=True)
            assert len(strict.entries) == 1
            default = _describe_quotas(wire, [("user", 1, None)])
            assert [[(e.entity_type, e.entity_name) for e in entry.entity] for entry in default.entries] == [[("user", None)]]
            bad = _describe_quotas(wire, [("user", 0, None)])
            assert bad.error_code == ErrorCode.INVALID_REQUEST and bad.entries is None
            # Removing the last value removes the entity.
            assert alter_client_quota(wire, [("producer_byte_rate", 0.0, True)], user="alice").error_code == ErrorCode.NONE
            assert len(_describe_quotas(wire, [("user", 0, "alice")], strict=True).entries) == 0
    finally:
        broker.stop()


def test_authorized_operations_are_reported_when_asked(broker: BrokerProcess, admin: AdminClient) -> None:
    name = topic_with_data(broker, admin)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert {AclOperation.DESCRIBE, AclOperation.ALTER, AclOperation.CLUSTER_ACTION} <= set(cluster.authorized_operations)
    assert admin.describe_cluster().result(30).authorized_operations is None
    described = admin.describe_topics(TopicCollection([name]), include_authorized_operations=True)[name].result(30)
    assert {AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE} <= set(described.authorized_operations)
    with WireClient.connect(broker.bootstrap) as wire:
        md = messages.MetadataRequest
        resp = wire.request(ApiKey.METADATA, 9, md(topics=[md.MetadataRequestTopic(name=name)],  # type: ignore[attr-defined]
                                                   allow_auto_topic_creation=False,
                                                   include_cluster_authorized_operations=True,
                                                   include_topic_authorized_operations=True))
        assert resp.cluster_authorized_operations > 0 and resp.topics[0].topic_authorized_operations > 0


def test_cluster_rights_are_checked_and_reported(tmp_path: Path) -> None:
    """With an authorizer: bob without rights is refused the cluster APIs and sees no cluster operations;
    granted ALTER on the cluster, he may elect leaders and sees ALTER (and the DESCRIBE it implies)."""
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="bob-secret";'
    broker = BrokerProcess(tmp_path / "data", overrides=[
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:ANONYMOUS", f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
    ], extra_listeners=["SASL_PLAINTEXT://127.0.0.1:0"]).start()
    try:
        name = unique("acl")
        superuser = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: its futures die with it
        superuser.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        host, port = broker.address("SASL_PLAINTEXT").rsplit(":", 1)

        def as_bob() -> WireClient:
            wire = WireClient(host, int(port))
            assert sasl_plain(wire, "bob", "bob-secret").error_code == ErrorCode.NONE
            return wire

        el = messages.ElectLeadersRequest
        elect = el(election_type=0, timeout_ms=1000, topic_partitions=[
            el.TopicPartitions(topic=name, partitions=[0])])  # type: ignore[attr-defined]
        with as_bob() as wire:
            cluster = wire.request(ApiKey.DESCRIBE_CLUSTER, 1, messages.DescribeClusterRequest(
                include_cluster_authorized_operations=True))
            assert cluster.cluster_authorized_operations == 0
            assert wire.request(ApiKey.ELECT_LEADERS, 2, elect).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            logdirs = wire.request(ApiKey.DESCRIBE_LOG_DIRS, 4, messages.DescribeLogDirsRequest(topics=None))
            assert logdirs.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and logdirs.results == []
            quotas = wire.request(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, messages.DescribeClientQuotasRequest(
                components=[], strict=False))
            assert quotas.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        grant = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:bob", "*",
                           AclOperation.ALTER, AclPermissionType.ALLOW)
        for future in superuser.create_acls([grant]).values():
            future.result(30)
        with as_bob() as wire:
            cluster = wire.request(ApiKey.DESCRIBE_CLUSTER, 1, messages.DescribeClusterRequest(
                include_cluster_authorized_operations=True))
            ops = {op for op in range(32) if cluster.cluster_authorized_operations & (1 << op)}
            assert ops == {int(AclOperation.ALTER.value), int(AclOperation.DESCRIBE.value)}
            [result] = wire.request(ApiKey.ELECT_LEADERS, 2, elect).replica_election_results
            assert [p.error_code for p in result.partition_result] == [ErrorCode.ELECTION_NOT_NEEDED]
    finally:
        broker.stop()
