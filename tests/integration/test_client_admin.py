"""The bundled admin client against the real broker."""

from __future__ import annotations

import time

import pytest

from shoal.client import (
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    AcknowledgeType,
    Admin,
    NewTopic,
    Producer,
    ShareConsumer,
)
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .names import unique_name

pytestmark = pytest.mark.external


def _consume_all(bootstrap: str, group: str, topic: str, count: int) -> None:
    with ShareConsumer(bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < count and time.monotonic() < deadline:
            for record in consumer.poll(0.5):
                consumer.acknowledge(record, AcknowledgeType.ACCEPT)
                got += 1
        assert got == count
        assert all(err is None for err in consumer.commit_sync(30).values())


def test_topics_offsets_and_configs(broker: BrokerProcess) -> None:
    a, b, missing = unique_name("cl-adm-a"), unique_name("cl-adm-b"), unique_name("cl-adm-missing")
    group = unique_name("cl-adm-g")
    with Admin(broker.bootstrap) as admin:
        created = admin.create_topics([NewTopic(a, 3, configs={"retention.ms": "3600000"}), b])
        assert created[a].error is None and created[a].num_partitions == 3
        assert created[a].topic_id is not None
        again = admin.create_topics([a])
        assert again[a].error is not None and again[a].error.code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert {a: 3, b: 1}.items() <= admin.list_topics().items()

        with Producer(broker.bootstrap) as producer:
            first = producer.send(a, b"x", partition=1, timestamp_ms=1_000_000).result(30)
            producer.send(a, b"y", partition=1, timestamp_ms=2_000_000).result(30)
        offsets = admin.list_offsets(
            {(a, 1): "earliest", (a, 0): "latest", (a, 2): 1_500_000}
        )
        assert offsets[(a, 1)].offset == first.offset == 0
        assert offsets[(a, 0)].offset == 0
        # No record in partition 2 at or after that timestamp.
        assert offsets[(a, 2)].offset == -1
        by_time = admin.list_offsets({(a, 1): 1_500_000, (a, 9): "latest"})
        assert by_time[(a, 1)].offset == 1
        assert by_time[(a, 9)].error is not None

        described = admin.describe_configs(RESOURCE_TOPIC, a, ["retention.ms"])
        assert described.error is None and described.entries["retention.ms"].value == "3600000"
        assert admin.incremental_alter_configs(RESOURCE_TOPIC, a, {"retention.ms": "7200000"}) is None
        assert admin.describe_configs(RESOURCE_TOPIC, a).entries["retention.ms"].value == "7200000"
        assert admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"}) is None
        group_cfg = admin.describe_configs(RESOURCE_GROUP, group, ["share.auto.offset.reset"])
        assert group_cfg.entries["share.auto.offset.reset"].value == "earliest"
        bad = admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "sideways"})
        assert bad is not None and bad.code == ErrorCode.INVALID_CONFIG

        deleted = admin.delete_topics([b, missing])
        assert deleted[b] is None
        assert deleted[missing] is not None
        assert b not in admin.list_topics()


def test_share_group_listing_and_description(broker: BrokerProcess) -> None:
    topic, group = unique_name("cl-adm-share"), unique_name("cl-adm-share-g")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2)])
        admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"})
        with ShareConsumer(broker.bootstrap, group, client_id="describe-me") as consumer:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
                consumer.poll(0.2)
            assert consumer.assignment() == {(topic, 0), (topic, 1)}
            listed = {g.group_id: g for g in admin.list_groups(types=["share"])}
            assert listed[group].type == "share" and listed[group].state == "Stable"
            assert group not in {g.group_id for g in admin.list_groups(types=["share"], states=["Empty"])}
            desc = admin.describe_share_groups([group])[group]
            assert desc.error is None and desc.state == "Stable" and desc.assignor == "simple"
            [member] = desc.members
            assert member.member_id == consumer.member_id and member.client_id == "describe-me"
            assert member.subscribed_topics == [topic]
            assert member.assignment == [(topic, 0), (topic, 1)]
        after = admin.describe_share_groups([group])[group]
        assert after.state == "Empty" and after.members == []
        no_such = unique_name("cl-no-such-group")
        missing = admin.describe_share_groups([no_such])[no_such]
        assert missing.error is not None or missing.state == "Dead"


def test_share_group_offsets_alter_delete_and_delete_group(broker: BrokerProcess) -> None:
    topic, group = unique_name("cl-adm-offsets"), unique_name("cl-adm-offsets-g")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1)])
        admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"})
        with Producer(broker.bootstrap) as producer:
            for i in range(6):
                producer.send(topic, f"v{i}".encode(), partition=0)
            producer.flush(30)
        _consume_all(broker.bootstrap, group, topic, 6)

        offsets = admin.list_share_group_offsets(group)
        assert offsets[(topic, 0)].start_offset == 6 and offsets[(topic, 0)].error is None
        assert admin.list_share_group_offsets(group, [topic])[(topic, 0)].start_offset == 6

        # Rewind to offset 2: the group sees records 2..5 again.
        assert admin.alter_share_group_offsets(group, {(topic, 0): 2}) == {(topic, 0): None}
        assert admin.list_share_group_offsets(group, {topic: [0]})[(topic, 0)].start_offset == 2
        _consume_all(broker.bootstrap, group, topic, 4)

        assert admin.delete_share_group_offsets(group, [topic]) == {topic: None}
        assert (topic, 0) not in admin.list_share_group_offsets(group) or (
            admin.list_share_group_offsets(group)[(topic, 0)].start_offset == -1
        )
        assert admin.delete_groups([group]) == {group: None}
        assert group not in {g.group_id for g in admin.list_groups(types=["share"])}
