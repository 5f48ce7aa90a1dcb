"""ListGroups, DescribeGroups and DeleteGroups through a sidecar: the upstream's groups and the sidecar's
own share groups in one view; the legacy AlterConfigs splits group configs from the upstream's resources
in the same way. A standalone Shoal process is the upstream; clients know only the sidecar."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, ConsumerGroupState
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .names import unique_name
from .share_clients import Consumed, create_topic, poll_until, produce, set_group_config, share_consumer
from .sidecar_pair import upstream_and_sidecar
from .test_share_admin import describe_group, list_groups, wait_for_state
from .test_share_dead_letter import _group_configs


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with upstream_and_sidecar(tmp_path_factory.mktemp("sidecar-groups")) as brokers:
        yield brokers


def _classic_group_on_the_upstream(sidecar: BrokerProcess, topic: str) -> str:
    """A classic group, made through the sidecar (so it lives on the upstream), left Empty with offsets."""
    group = unique_name("sc-classic")
    consumer = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                consumer.commit(msg, asynchronous=False)
                break
        else:
            raise AssertionError("the classic consumer got no record through the sidecar")
    finally:
        consumer.close()
    return group


@pytest.mark.filterwarnings("ignore:list_groups:DeprecationWarning")
def test_group_administration_sees_the_sidecars_share_groups_and_the_upstreams_groups(
        pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    upstream, sidecar = pair
    bs = sidecar.bootstrap
    topic, share_group = unique_name("sc-groups"), unique_name("sc-share")
    create_topic(upstream.bootstrap, topic, 1)
    produce(upstream.bootstrap, topic, 3)
    classic_group = _classic_group_on_the_upstream(sidecar, topic)
    set_group_config(bs, share_group, share_auto_offset_reset="earliest")
    consumer = share_consumer(bs, share_group, [topic])
    admin = AdminClient({"bootstrap.servers": bs})
    try:
        got = Consumed()
        poll_until(consumer, lambda: len(got) >= 3, got, 60)

        # ListGroups: one answer with both, each filter applied to both (librdkafka 2.16's
        # list_consumer_groups has no SHARE type, so the type filter is sent by hand).
        every = list_groups(bs, [], [])
        assert (every[share_group].group_type, every[share_group].group_state) == ("share", "Stable")
        assert every[classic_group].group_type == "classic"
        assert set(list_groups(bs, [], ["share"])) >= {share_group}
        assert classic_group not in list_groups(bs, [], ["share"])
        assert share_group not in list_groups(bs, [], ["classic", "consumer"])
        assert classic_group in list_groups(bs, ["empty"], [])
        assert share_group not in list_groups(bs, ["empty"], [])
        # confluent-kafka's list_consumer_groups asks for consumer and classic groups; its older list_groups
        # (ListGroups with no filter) sees both.
        consumer_groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
        assert classic_group in consumer_groups and share_group not in consumer_groups
        assert {share_group, classic_group} <= {g.id for g in admin.list_groups(timeout=30)}
        # The upstream itself knows nothing of the sidecar's share group.
        assert share_group not in list_groups(upstream.bootstrap, [], [])

        # DescribeGroups: the share group is answered by the sidecar as Kafka answers one (not a classic
        # group), the classic group by the upstream.
        described = describe_group(bs, share_group)
        assert (described.error_code, described.group_state) == (ErrorCode.GROUP_ID_NOT_FOUND, "Dead")
        assert "not a classic group" in described.error_message
        unknown = describe_group(bs, unique_name("sc-nobody"))
        assert (unknown.error_code, unknown.group_state) == (ErrorCode.GROUP_ID_NOT_FOUND, "Dead")
        assert "not a classic group" not in unknown.error_message
        both = admin.describe_consumer_groups([classic_group, share_group])
        classic = both[classic_group].result(30)
        assert (classic.group_id, classic.state, classic.members) == (classic_group, ConsumerGroupState.EMPTY, [])
        assert both[share_group].result(30).state == ConsumerGroupState.DEAD
    finally:
        consumer.close()

    # DeleteGroups in one request: the share group by the sidecar, the classic group by the upstream.
    wait_for_state(bs, share_group, "Empty")
    deleted = admin.delete_consumer_groups([share_group, classic_group])
    for future in deleted.values():
        future.result(30)
    assert not {share_group, classic_group} & set(list_groups(bs, [], []))
    assert classic_group not in list_groups(upstream.bootstrap, [], [])
    missing = admin.delete_consumer_groups([share_group])[share_group]
    with pytest.raises(Exception, match="GROUP_ID_NOT_FOUND"):
        missing.result(30)


@pytest.mark.filterwarnings("ignore:alter_configs:DeprecationWarning")
def test_legacy_alter_configs_sets_share_group_configs_here_and_topic_configs_upstream(
        pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    upstream, sidecar = pair
    topic, group = unique_name("sc-legacy"), unique_name("sc-legacy-g")
    create_topic(upstream.bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": sidecar.bootstrap})
    resources = [ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "654321"}),
                 ConfigResource(ResourceType.GROUP, group, set_config={"share.auto.offset.reset": "earliest"})]
    for future in admin.alter_configs(resources).values():
        future.result(30)
    up = AdminClient({"bootstrap.servers": upstream.bootstrap})
    topic_resource = ConfigResource(ResourceType.TOPIC, topic)
    assert up.describe_configs([topic_resource])[topic_resource].result(30)["retention.ms"].value == "654321"
    assert _group_configs(sidecar.bootstrap, group)["share.auto.offset.reset"][0] == "earliest"
    # The group config is the sidecar's own: the upstream never saw it.
    assert _group_configs(upstream.bootstrap, group)["share.auto.offset.reset"][0] != "earliest"

