"""ACLs with the StandardAuthorizer model against the real broker.

The admin is User:ANONYMOUS on the PLAINTEXT listener (a super user, the bootstrap path); the users
alice, bob and root log in with SASL/PLAIN, dave with SCRAM, and a client certificate names a principal
on SSL. Covered: the share-group rows of KIP-932's ACL table (error code and nothing changed), grants
through AdminClient.create_acls taking effect without a restart, DENY beating ALLOW, Metadata hiding
topics, the ACL APIs' own rights, and ACLs plus SCRAM users surviving a restart.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import Consumed, poll_until, produce, set_group_config, share_consumer
from .test_security import make_pki, sasl_plain

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" '
        'user_bob="bob-secret" user_root="root-secret";')
ALICE_CERT_PRINCIPAL = "User:CN=alice,OU=eng,O=Acme\\, Inc.,C=US"
GROUP_ID_NOT_FOUND = 69
# confluent-kafka's stubs type AclBindingFilter's optional fields as str; None means "any".
ANY_VALUE: Any = None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("acl-pki"))


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("acl")
    proc = BrokerProcess(
        base / "data",
        overrides=[
            "group.share.min.heartbeat.interval.ms=1000",
            "group.share.heartbeat.interval.ms=1000",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:ANONYMOUS;User:root",
            f"ssl.keystore.location={pki['server.pem']}",
            f"ssl.truststore.location={pki['ca.pem']}",
            "ssl.client.auth=required",
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={JAAS}",
        ],
        extra_listeners=["SASL_PLAINTEXT://127.0.0.1:0", "SSL://127.0.0.1:0"],
    ).start()
    yield proc
    proc.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def sasl_conf(broker: BrokerProcess, user: str, password: str, mechanism: str = "PLAIN") -> dict[str, Any]:
    return {"bootstrap.servers": broker.address("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def grant(broker: BrokerProcess, *bindings: AclBinding) -> None:
    client = admin(broker)  # held: librdkafka fails pending futures of a destroyed handle
    for future in client.create_acls(list(bindings)).values():
        future.result(30)


def allow(rtype: ResourceType, name: str, principal: str, op: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


def create_topic(broker: BrokerProcess, name: str) -> bytes:
    admin_client = admin(broker)
    admin_client.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    with WireClient.connect(broker.bootstrap) as client:
        md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=name)],  # type: ignore[attr-defined]
            allow_auto_topic_creation=False))
    topic_id: bytes = md.topics[0].topic_id
    return topic_id


def listed_topics(client: WireClient) -> set[str]:
    md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False))
    return {t.name for t in md.topics}


def share_fetch(client: WireClient, group: str, topic_id: bytes) -> Any:
    req = messages.ShareFetchRequest
    return client.request(ApiKey.SHARE_FETCH, 1, req(
        group_id=group, member_id=uuid.uuid4().hex[:22], share_session_epoch=0, max_wait_ms=0, min_bytes=0,
        max_bytes=1 << 20, max_records=10, batch_size=10,
        topics=[req.FetchTopic(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
            req.FetchPartition(partition_index=0, acknowledgement_batches=[])])],  # type: ignore[attr-defined]
        forgotten_topics_data=[],
    ))


def describe_share_group(client: WireClient, group: str) -> Any:
    resp = client.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, messages.ShareGroupDescribeRequest(
        group_ids=[group], include_authorized_operations=False))
    return resp.groups[0]


def test_share_group_rights_matrix(acl_broker: BrokerProcess) -> None:
    topic, group = _name("aclq"), _name("aclg")
    topic_id = create_topic(acl_broker, topic)
    set_group_config(acl_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(acl_broker.bootstrap, topic, 50)
    with WireClient.connect(acl_broker.address("SASL_PLAINTEXT")) as bob:
        assert sasl_plain(bob, "bob", "bob-secret").error_code == ErrorCode.NONE
        # Metadata hides what bob may not describe.
        assert topic not in listed_topics(bob)
        hb = bob.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
            group_id=group, member_id=uuid.uuid4().hex[:22], member_epoch=0, subscribed_topic_names=[topic]))
        assert hb.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert describe_share_group(bob, group).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert share_fetch(bob, group, topic_id).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        ack = bob.request(ApiKey.SHARE_ACKNOWLEDGE, 1, messages.ShareAcknowledgeRequest(
            group_id=group, member_id=uuid.uuid4().hex[:22], share_session_epoch=1, topics=[]))
        assert ack.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        dreq = messages.DescribeShareGroupOffsetsRequest
        described = bob.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, dreq(groups=[
            dreq.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)]))  # type: ignore[attr-defined]
        assert described.groups[0].error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        areq = messages.AlterShareGroupOffsetsRequest
        altered = bob.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, areq(group_id=group, topics=[
            areq.AlterShareGroupOffsetsRequestTopic(topic_name=topic, partitions=[  # type: ignore[attr-defined]
                areq.AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=40)])]))  # type: ignore[attr-defined]
        assert altered.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        xreq = messages.DeleteShareGroupOffsetsRequest
        deleted = bob.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, xreq(group_id=group, topics=[
            xreq.DeleteShareGroupOffsetsRequestTopic(topic_name=topic)]))  # type: ignore[attr-defined]
        assert deleted.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        rreq = messages.ReadShareGroupStateRequest
        state = bob.request(ApiKey.READ_SHARE_GROUP_STATE, 0, rreq(group_id=group, topics=[
            rreq.ReadStateData(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
                rreq.PartitionData(partition=0, leader_epoch=0)])]))  # type: ignore[attr-defined]
        assert state.results[0].partitions[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        coord = bob.request(ApiKey.FIND_COORDINATOR, 6, messages.FindCoordinatorRequest(
            key_type=2, coordinator_keys=[f"{group}:{topic_id.hex()}:0"]))
        assert coord.coordinators[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # Nothing happened on bob's behalf: no group was created, no offsets were set.
    with WireClient.connect(acl_broker.bootstrap) as root:
        assert describe_share_group(root, group).error_code == GROUP_ID_NOT_FOUND

    # Granting through the Admin API takes effect at once: READ on the group, READ on a topic prefix.
    grant(acl_broker,
          allow(ResourceType.GROUP, group, "User:bob", AclOperation.READ),
          allow(ResourceType.TOPIC, "aclq-", "User:bob", AclOperation.READ, ResourcePatternType.PREFIXED))
    with WireClient.connect(acl_broker.address("SASL_PLAINTEXT")) as bob:
        assert sasl_plain(bob, "bob", "bob-secret").error_code == ErrorCode.NONE
        assert topic in listed_topics(bob)  # DESCRIBE is implied by READ
    conf = sasl_conf(acl_broker, "bob", "bob-secret")
    consumer = share_consumer(conf["bootstrap.servers"], group, [topic],
                              **{k.replace(".", "_"): v for k, v in conf.items() if k != "bootstrap.servers"})
    sink = Consumed()
    try:
        poll_until(consumer, lambda: len(sink) >= 50, sink, 60)
    finally:
        consumer.close()
    assert sorted(o for _p, o, _v, _d in sink.records) == list(range(50))

    # DENY wins over ALLOW: READ on this one topic, and DESCRIBE on the group despite READ implying it.
    grant(acl_broker,
          allow(ResourceType.TOPIC, topic, "User:bob", AclOperation.READ, permission=AclPermissionType.DENY),
          allow(ResourceType.GROUP, group, "User:bob", AclOperation.DESCRIBE, permission=AclPermissionType.DENY))
    with WireClient.connect(acl_broker.address("SASL_PLAINTEXT")) as bob:
        assert sasl_plain(bob, "bob", "bob-secret").error_code == ErrorCode.NONE
        fetched = share_fetch(bob, group, topic_id)
        assert fetched.error_code == ErrorCode.NONE
        assert fetched.responses[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert describe_share_group(bob, group).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    with WireClient.connect(acl_broker.bootstrap) as root:
        assert describe_share_group(root, group).error_code == ErrorCode.NONE


def test_acl_apis_need_cluster_rights(acl_broker: BrokerProcess) -> None:
    bob_admin = AdminClient(sasl_conf(acl_broker, "bob", "bob-secret"))
    binding = allow(ResourceType.TOPIC, _name("t"), "User:bob", AclOperation.WRITE)
    with pytest.raises(KafkaException) as err:
        bob_admin.create_acls([binding])[binding].result(30)
    assert err.value.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # On the wire: confluent-kafka's describe_acls turns a top-level error into an empty list.
    with WireClient.connect(acl_broker.address("SASL_PLAINTEXT")) as bob:
        assert sasl_plain(bob, "bob", "bob-secret").error_code == ErrorCode.NONE
        described = bob.request(ApiKey.DESCRIBE_ACLS, 3, messages.DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
            host_filter=None, operation=1, permission_type=1))
        assert described.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and described.resources == []
    # root is a super user by the second entry of the semicolon-separated super.users.
    root_admin = AdminClient(sasl_conf(acl_broker, "root", "root-secret"))
    root_admin.create_acls([binding])[binding].result(30)
    mine = AclBindingFilter(ResourceType.TOPIC, binding.name, ResourcePatternType.MATCH, ANY_VALUE, ANY_VALUE,
                            AclOperation.ANY, AclPermissionType.ANY)
    assert root_admin.describe_acls(mine).result(30) == [binding]
    deleted = root_admin.delete_acls([mine])[mine].result(30)
    assert deleted == [binding]
    assert root_admin.describe_acls(mine).result(30) == []


def test_certificate_subject_is_the_principal(acl_broker: BrokerProcess, pki: dict[str, Path]) -> None:
    allowed, other = _name("certok"), _name("certno")
    for name in (allowed, other):
        create_topic(acl_broker, name)
    grant(acl_broker, allow(ResourceType.TOPIC, allowed, ALICE_CERT_PRINCIPAL, AclOperation.WRITE))
    producer = Producer({"bootstrap.servers": acl_broker.address("SSL"), "security.protocol": "SSL",
                         "ssl.ca.location": str(pki["ca.pem"]), "ssl.certificate.location": str(pki["alice.crt"]),
                         "ssl.key.location": str(pki["alice.key"]), "message.timeout.ms": 10000})
    results: dict[str, Any] = {}
    for name in (allowed, other):
        producer.produce(name, b"x", on_delivery=lambda err, msg: results.__setitem__(msg.topic() or "", err))
    producer.flush(30)
    assert results[allowed] is None
    assert results[other].code() == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_scram_users_and_acls_survive_restart(acl_broker: BrokerProcess) -> None:
    topic = _name("dave")
    create_topic(acl_broker, topic)
    upsert = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"dave-secret")
    admin_client = admin(acl_broker)
    admin_client.alter_user_scram_credentials([upsert])["dave"].result(30)
    grant(acl_broker, allow(ResourceType.TOPIC, "dave-", "User:dave", AclOperation.WRITE, ResourcePatternType.PREFIXED))
    acl_broker.stop()
    acl_broker.start()
    conf = sasl_conf(acl_broker, "dave", "dave-secret", "SCRAM-SHA-256")
    produced = produce(conf["bootstrap.servers"], topic, 20,
                       extra={k: v for k, v in conf.items() if k != "bootstrap.servers"})
    assert len(produced) == 20
    # The admin (PLAINTEXT, super user) still sees the binding after the restart.
    dave_acls = AclBindingFilter(ResourceType.TOPIC, ANY_VALUE, ResourcePatternType.ANY, "User:dave", ANY_VALUE,
                                 AclOperation.ANY, AclPermissionType.ANY)
    admin_client = admin(acl_broker)
    assert [b.name for b in admin_client.describe_acls(dave_acls).result(30)] == ["dave-"]
