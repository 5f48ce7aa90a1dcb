"""Two sidecars of one sidecar group over one upstream (a standalone Shoal process), whose requests to each
other are inter-broker traffic: they go to the INTERNAL listener (SASL_SSL with client certificates,
`inter.broker.listener.name`) with the PLAIN credentials of its JAAS line and its keystore and truststore,
and the anonymous principal of the clients' PLAINTEXT listener may not send them (CLUSTER_ACTION denied).
Share state written by a leader on one sidecar to the state partition the other owns; offsets altered
through one sidecar reach the share-partition leader on the other; group configs changed through both at
once all take effect."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from shoal.client.admin import Admin
from shoal.client.connection import BrokerConnection
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .kafka_wire import WireClient
from .names import unique_name
from .share_clients import Consumed, create_topic, group_configs, poll_until, set_group_config, share_consumer
from .test_security import make_pki
from .test_share_protocol import (
    ACCEPT,
    RawShareMember,
    fetch_until,
    heartbeat,
    join,
    produce_batches,
    topic_id_of,
)
from .test_sidecar_members import MEMBERSHIP, UPSTREAM_GROUPS, WAIT_S, _view, _wait_for

PEER_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="peer" '
             'password="peer-secret" user_peer="peer-secret";')
# Inter-broker traffic on its own listener, SASL over TLS with client certificates required; clients on
# PLAINTEXT, whose anonymous principal may do anything but CLUSTER_ACTION (the ACLs are set once the sidecars
# are up).
def _peer_security(pki: dict[str, Path]) -> list[str]:
    return [
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL",
        f"listener.name.internal.plain.sasl.jaas.config={PEER_JAAS}",
        f"listener.name.internal.ssl.keystore.location={pki['server.pem']}",
        f"listener.name.internal.ssl.truststore.location={pki['ca.pem']}",
        "listener.name.internal.ssl.client.auth=required",
        "inter.broker.listener.name=INTERNAL",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:peer",
        "allow.everyone.if.no.acl.found=true",
    ]


_KEY_TYPE_GROUP, _KEY_TYPE_SHARE = 0, 2


def _deny_anonymous_cluster_action(sidecar: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": sidecar.bootstrap})
    cluster = (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ANONYMOUS", "*")
    bindings = [AclBinding(*cluster, AclOperation.ALL, AclPermissionType.ALLOW),
                AclBinding(*cluster, AclOperation.CLUSTER_ACTION, AclPermissionType.DENY)]
    for future in admin.create_acls(bindings).values():
        future.result(30)


@dataclass
class Pair:
    upstream: BrokerProcess
    a: BrokerProcess
    b: BrokerProcess
    pki: dict[str, Path]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    base = tmp_path_factory.mktemp("peers")
    pki = make_pki(base)
    upstream = BrokerProcess(base / "upstream", overrides=UPSTREAM_GROUPS).start()
    group = unique_name("peers")
    sidecars: list[BrokerProcess] = []
    try:
        for node_id in (1, 2):
            sidecars.append(BrokerProcess(base / f"sidecar-{node_id}", extra_listeners=["INTERNAL://127.0.0.1:0"],
                                          overrides=[
                f"node.id={node_id}", f"upstream.bootstrap.servers={upstream.bootstrap}",
                f"upstream.membership.group.id={group}", *MEMBERSHIP, *FAST_HEARTBEAT, *NO_JOIN_DELAY,
                *_peer_security(pki)]).start())
        for sidecar in sidecars:
            _deny_anonymous_cluster_action(sidecar)
        yield Pair(upstream, sidecars[0], sidecars[1], pki)
    finally:
        for sidecar in sidecars:
            sidecar.stop()
        upstream.stop()


def _topic_text(topic_id: bytes) -> str:
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()


async def _coordinators(pair: Pair, key_type: int, keys: list[str]) -> list[tuple[int, int]]:
    """(error code, node id) of each key's coordinator, asked of sidecar a as the peer user on the INTERNAL
    listener (a SHARE key needs CLUSTER_ACTION)."""
    host, port = pair.a.address("INTERNAL").rsplit(":", 1)
    config = ClientConfig.from_dict({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "peer",
        "sasl.password": "peer-secret", "ssl.ca.location": str(pair.pki["ca.pem"]),
        "ssl.certificate.location": str(pair.pki["alice.crt"]), "ssl.key.location": str(pair.pki["alice.key"])})
    conn = await BrokerConnection(host, int(port), config).connect()
    try:
        response = await conn.request(ApiKey.FIND_COORDINATOR, messages.FindCoordinatorRequest(
            key_type=key_type, coordinator_keys=keys), version=6)
    finally:
        await conn.close()
    assert isinstance(response, messages.FindCoordinatorResponse)
    return [(c.error_code, c.node_id) for c in response.coordinators]


def _group_on(pair: Pair, node_id: int, topic_id: bytes, partition: int) -> str:
    """A share group whose group coordinator and whose state partition for (topic, partition) are both on
    sidecar `node_id`."""
    groups = [unique_name("peers-g") for _ in range(64)]
    coordinators = asyncio.run(_coordinators(pair, _KEY_TYPE_GROUP, groups))
    state_owners = asyncio.run(_coordinators(pair, _KEY_TYPE_SHARE,
                                             [f"{g}:{_topic_text(topic_id)}:{partition}" for g in groups]))
    for group, coordinator, state_owner in zip(groups, coordinators, state_owners, strict=True):
        if coordinator == state_owner == (ErrorCode.NONE, node_id):
            return group
    raise AssertionError(f"no group coordinated by sidecar {node_id}: {coordinators} {state_owners}")


def test_offsets_altered_through_one_sidecar_reach_the_leader_on_the_other(pair: Pair) -> None:
    a, b = pair.a, pair.b
    topic = unique_name("peers-alter")
    create_topic(pair.upstream.bootstrap, topic, 2)
    _wait_for(lambda: all(set(_view(s, topic)[1].values()) == {1, 2} for s in (a, b))
              and _view(a, topic)[1] == _view(b, topic)[1], "the sidecars to split the topic")
    [p] = [q for q, leader in _view(a, topic)[1].items() if leader == 2]  # the partition b leads
    upstream = WireClient.connect(pair.upstream.bootstrap)
    coordinator = WireClient.connect(a.bootstrap)
    member = None
    consumer = None
    try:
        topic_id = topic_id_of(upstream, topic)
        # Coordinated by a, its share state on a too: b's share-partition leader reads and writes it over the
        # INTERNAL listener, as user peer.
        group = _group_on(pair, 1, topic_id, p)
        produce_batches(upstream, topic, [10], partition=p)
        set_group_config(a.bootstrap, group, share_auto_offset_reset="earliest")
        _wait_for(lambda: group_configs(b.bootstrap, group)["share.auto.offset.reset"] == ("earliest", True),
                  "b to see the group config")

        # A member takes p's records through b and accepts them all (SPSO 10 in b's memory and stored), then
        # leaves the group; its share session on b stays open, as a consumer's does that its coordinator
        # (on another sidecar) has expired.
        member = RawShareMember(b, group, topic_id)
        join(coordinator, group, member.member_id, topic, topic_id, {p})
        got = fetch_until(member, [p], 10)
        assert [r for _p, r in got] == [(0, 9, 1)]
        assert member.ack_codes({p: [(0, 9, [ACCEPT])]}) == {p: ErrorCode.NONE}
        left = heartbeat(coordinator, group, member.member_id, -1, None)
        assert left.error_code == ErrorCode.NONE

        # The group is empty: its coordinator (a) moves p's start back to 4.
        with Admin(a.bootstrap) as admin:
            assert admin.alter_share_group_offsets(group, {(topic, p): 4}) == {(topic, p): None}

        # A new consumer's session on b finds the stored state changed and b loads it again: records 4..9
        # of p are handed out once more, nothing else.
        consumer = share_consumer(f"{a.bootstrap},{b.bootstrap}", group, [topic])
        consumed = Consumed()
        poll_until(consumer, lambda: len(consumed) >= 6, consumed, WAIT_S)
        assert sorted((q, offset) for q, offset, _v, _d in consumed.records) == [(p, o) for o in range(4, 10)]
    finally:
        if consumer is not None:
            consumer.close()
        if member is not None:
            member.close()
        coordinator.close()
        upstream.close()


def test_group_config_changes_through_both_sidecars_all_take_effect(pair: Pair) -> None:
    a, b = pair.a, pair.b
    group, key = unique_name("peers-configs"), "share.record.lock.duration.ms"
    # A change through one sidecar is seen by the other; a later change of the same name through the other
    # wins on both, and a deleted name returns to its default.
    set_group_config(a.bootstrap, group, share_record_lock_duration_ms="20000")
    _wait_for(lambda: group_configs(b.bootstrap, group)[key] == ("20000", True), "the other sidecar to see the change")
    set_group_config(b.bootstrap, group, share_record_lock_duration_ms="25000")
    _wait_for(lambda: group_configs(a.bootstrap, group)[key] == ("25000", True), "the first sidecar to see it")
    delete = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)])
    configs_admin = AdminClient({"bootstrap.servers": a.bootstrap})
    for future in configs_admin.incremental_alter_configs([delete]).values():
        future.result(30)
    assert not group_configs(a.bootstrap, group)[key][1]
    _wait_for(lambda: not group_configs(b.bootstrap, group)[key][1], "the other sidecar to see the name deleted")

    # One change through each sidecar, the second before that sidecar can have read the first.
    set_group_config(a.bootstrap, group, share_delivery_count_limit="3")
    set_group_config(b.bootstrap, group, share_isolation_level="read_committed")
    # Then two at a time, through both at once.
    wanted = {"share.delivery.count.limit": "3", "share.isolation.level": "read_committed"}
    for flag, reset in (("false", "earliest"), ("true", "latest")):
        threads = [threading.Thread(target=set_group_config, args=(a.bootstrap, group),
                                    kwargs={"share_renew_acknowledge_enable": flag}),
                   threading.Thread(target=set_group_config, args=(b.bootstrap, group),
                                    kwargs={"share_auto_offset_reset": reset})]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        wanted |= {"share.renew.acknowledge.enable": flag, "share.auto.offset.reset": reset}

    def explicit(sidecar: BrokerProcess) -> dict[str, str]:
        return {k: v for k, (v, set_here) in group_configs(sidecar.bootstrap, group).items() if set_here}

    _wait_for(lambda: explicit(a) == wanted and explicit(b) == wanted, "both sidecars to serve every change")

    # The group is deleted through its coordinator just after a config was set through the other sidecar:
    # that one goes with the rest.
    topic = unique_name("peers-configs")
    create_topic(pair.upstream.bootstrap, topic, 1)
    [(code, coordinator)] = asyncio.run(_coordinators(pair, _KEY_TYPE_GROUP, [group]))
    assert code == ErrorCode.NONE
    other = b if coordinator == 1 else a
    with Admin(a.bootstrap) as admin:
        # Creates the group, once the sidecar's view of the upstream's topics has the new one.
        _wait_for(lambda: admin.alter_share_group_offsets(group, {(topic, 0): 0}) == {(topic, 0): None},
                  "the offsets alter to create the group")
        set_group_config(other.bootstrap, group, share_delivery_count_limit="4")
        assert admin.delete_groups([group]) == {group: None}
    _wait_for(lambda: explicit(a) == {} and explicit(b) == {}, "both sidecars to have no configs for the group")

