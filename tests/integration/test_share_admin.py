"""Share-group administration against the real broker: Describe/Alter/DeleteShareGroupOffsets and
DeleteGroups over raw requests (no Python client sends them yet), and confluent's AdminClient where
it has an API (list, describe, delete)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import Consumed, create_topic, poll_until, produce, set_group_config, share_consumer
from .share_clients import consume_and_ack as deliveries

pytestmark = pytest.mark.external

DescribeOffsets = messages.DescribeShareGroupOffsetsRequest
AlterOffsets = messages.AlterShareGroupOffsetsRequest
DeleteOffsets = messages.DeleteShareGroupOffsetsRequest


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def describe_offsets(bs: str, group: str, topics: dict[str, list[int]] | None = None, version: int = 1) -> Any:
    req_topics = None if topics is None else [
        DescribeOffsets.DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)  # type: ignore[attr-defined]
        for t, ps in topics.items()
    ]
    body = DescribeOffsets(groups=[
        DescribeOffsets.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=req_topics)  # type: ignore[attr-defined]
    ])
    with WireClient.connect(bs) as client:
        [described] = client.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, version, body).groups
    return described


def offsets_by_partition(described: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (start offset, lag, error)."""
    return {(t.topic_name, p.partition_index): (p.start_offset, p.lag, p.error_code)
            for t in described.topics for p in t.partitions}


def alter_offsets(bs: str, group: str, topic: str, offsets: dict[int, int]) -> Any:
    body = AlterOffsets(group_id=group, topics=[AlterOffsets.AlterShareGroupOffsetsRequestTopic(  # type: ignore[attr-defined]
        topic_name=topic,
        partitions=[AlterOffsets.AlterShareGroupOffsetsRequestPartition(  # type: ignore[attr-defined]
            partition_index=p, start_offset=o) for p, o in sorted(offsets.items())],
    )])
    with WireClient.connect(bs) as client:
        return client.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, body)


def delete_offsets(bs: str, group: str, topics: list[str]) -> Any:
    body = DeleteOffsets(group_id=group, topics=[
        DeleteOffsets.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in topics  # type: ignore[attr-defined]
    ])
    with WireClient.connect(bs) as client:
        return client.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, body)


def delete_groups(bs: str, groups: list[str]) -> dict[str, int]:
    with WireClient.connect(bs) as client:
        resp = client.request(ApiKey.DELETE_GROUPS, 2, messages.DeleteGroupsRequest(groups_names=groups))
    return {r.group_id: r.error_code for r in resp.results}


def describe_group(bs: str, group: str, version: int = 6) -> Any:
    with WireClient.connect(bs) as client:
        resp = client.request(ApiKey.DESCRIBE_GROUPS, version,
                              messages.DescribeGroupsRequest(groups=[group], include_authorized_operations=True))
    [described] = resp.groups
    return described


def group_state(bs: str, group: str) -> str | None:
    """The share group's state as ListGroups v5 reports it (DescribeGroups is for classic groups only)."""
    listed = list_groups(bs, [], ["share"]).get(group)
    return None if listed is None else str(listed.group_state)


def wait_for_state(bs: str, group: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    current = None
    while time.monotonic() < deadline:
        current = group_state(bs, group)
        if current == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"group {group} is {current}, not {state}")


def consume_and_ack(bs: str, group: str, topics: list[str], accept_below: int, want: int,
                    timeout: float = 60) -> list[tuple[str, int]]:
    """ACCEPT offsets below `accept_below`, RELEASE the rest; (topic, offset) of every delivery."""
    return [(t, o) for t, o, _ in deliveries(bs, group, topics, accept_below, want, timeout)]


def test_describe_offsets_after_consuming_half(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("ad"), _name("gad")
    no_such_topic = _name("no-such-topic")
    create_topic(bs, topic, 2)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 100)  # all on partition 0
    seen = consume_and_ack(bs, group, [topic], accept_below=50, want=100)
    assert {(topic, o) for o in range(100)} <= set(seen)
    wait_for_state(bs, group, "Empty")

    # Topics null: every topic the group has state for, both partitions. Partition 1 never had records:
    # its leader recorded the start offset share.auto.offset.reset chose (0) when it first loaded.
    described = describe_offsets(bs, group)
    assert described.error_code == ErrorCode.NONE
    rows = offsets_by_partition(described)
    assert rows[(topic, 0)] == (50, 50, ErrorCode.NONE)
    assert rows[(topic, 1)] == (0, 0, ErrorCode.NONE)

    # v0 has no lag on the wire: the decoded default is -1.
    assert offsets_by_partition(describe_offsets(bs, group, {topic: [0]}, version=0))[(topic, 0)] == (50, -1, 0)
    missing = offsets_by_partition(describe_offsets(bs, group, {topic: [0, 7], no_such_topic: [0]}))
    assert missing[(topic, 0)] == (50, 50, ErrorCode.NONE)
    assert missing[(topic, 7)][2] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert missing[(no_such_topic, 0)][2] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # A group without state for a named topic: unknown start offset, no error.
    assert offsets_by_partition(describe_offsets(bs, _name("nostate"), {topic: [0]}))[(topic, 0)] == (-1, -1, 0)
    assert describe_offsets(bs, _name("nogroup")).error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_alter_offsets_refused_while_active_then_new_consumer_starts_there(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("aa"), _name("gaa")
    no_such_topic = _name("no-such-topic")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 100)
    active = share_consumer(bs, group, [topic])
    try:
        sink = Consumed()
        poll_until(active, lambda: len(sink) > 0, sink, 30)
        assert len(sink) > 0
        refused = alter_offsets(bs, group, topic, {0: 80})
        assert refused.error_code == ErrorCode.NON_EMPTY_GROUP
    finally:
        active.close()
    wait_for_state(bs, group, "Empty")

    resp = alter_offsets(bs, group, topic, {0: 80, 3: 5})
    assert resp.error_code == ErrorCode.NONE
    codes = {p.partition_index: p.error_code for t in resp.responses for p in t.partitions}
    assert codes == {0: ErrorCode.NONE, 3: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    unknown = alter_offsets(bs, group, no_such_topic, {0: 1})
    assert [p.error_code for t in unknown.responses for p in t.partitions] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert offsets_by_partition(describe_offsets(bs, group))[(topic, 0)] == (80, 20, ErrorCode.NONE)

    consumer = share_consumer(bs, group, [topic])
    try:
        sink = Consumed()
        poll_until(consumer, lambda: len(sink) >= 20, sink, 60)
    finally:
        consumer.close()
    offsets = sorted(o for _p, o, _v, _d in sink.records)
    assert offsets == list(range(80, 100))
    # Fresh state: nothing carried over from the first consumer's deliveries.
    assert {d for _p, _o, _v, d in sink.records} == {1}


def test_alter_offsets_seeds_a_group_that_does_not_exist_yet(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("as"), _name("gas")
    create_topic(bs, topic, 1)
    produce(bs, topic, 30)
    assert alter_offsets(bs, group, topic, {0: 25}).error_code == ErrorCode.NONE
    assert group_state(bs, group) == "Empty"
    consumer = share_consumer(bs, group, [topic])  # default reset "latest" would deliver nothing
    try:
        sink = Consumed()
        poll_until(consumer, lambda: len(sink) >= 5, sink, 60)
    finally:
        consumer.close()
    assert sorted(o for _p, o, _v, _d in sink.records) == [25, 26, 27, 28, 29]


def test_delete_offsets_then_consumption_restarts_from_reset_policy(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, other_topic, group = _name("dl"), _name("dlo"), _name("gdl")
    no_such_topic = _name("no-such-topic")
    create_topic(bs, topic, 1)
    create_topic(bs, other_topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 10)
    produce(bs, other_topic, 10, prefix="other")
    active = share_consumer(bs, group, [topic])
    try:
        sink = Consumed()
        poll_until(active, lambda: len(sink) > 0, sink, 60)
        refused = delete_offsets(bs, group, [topic])
        assert refused.error_code == ErrorCode.NON_EMPTY_GROUP
    finally:
        active.close()
    seen = consume_and_ack(bs, group, [topic, other_topic], accept_below=10, want=20)
    assert len(set(seen)) == 20
    wait_for_state(bs, group, "Empty")
    rows = offsets_by_partition(describe_offsets(bs, group))
    assert rows[(topic, 0)][0] == 10 and rows[(other_topic, 0)][0] == 10

    resp = delete_offsets(bs, group, [topic, no_such_topic])
    assert resp.error_code == ErrorCode.NONE
    assert {t.topic_name: t.error_code for t in resp.responses} == {
        topic: ErrorCode.NONE, no_such_topic: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    # The topic is no longer one the group has state for; the other topic is untouched.
    rows = offsets_by_partition(describe_offsets(bs, group))
    assert (topic, 0) not in rows and rows[(other_topic, 0)][0] == 10
    assert offsets_by_partition(describe_offsets(bs, group, {topic: [0]}))[(topic, 0)] == (-1, -1, 0)
    # A topic the group holds no state for (deleted just now, or never consumed) is refused, as in Kafka.
    unconsumed = _name("dlu")
    create_topic(bs, unconsumed, 1)
    resp = delete_offsets(bs, group, [topic, unconsumed])
    assert resp.error_code == ErrorCode.NONE
    assert {t.topic_name: (t.error_code, t.error_message) for t in resp.responses} == {
        name: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "There is no offset information to delete.")
        for name in (topic, unconsumed)}
    assert offsets_by_partition(describe_offsets(bs, group))[(other_topic, 0)][0] == 10

    again = share_consumer(bs, group, [topic, other_topic])
    try:
        sink = Consumed()
        poll_until(again, lambda: len(sink) >= 10, sink, 60)
    finally:
        again.close()
    # share.auto.offset.reset=earliest: the deleted topic is consumed from 0 again, the other is not.
    assert sorted(o for _p, o, _v, _d in sink.records) == list(range(10))
    assert all(v.startswith(b"v-") for _p, _o, v, _d in sink.records)


def test_delete_groups_needs_an_empty_group(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("dg"), _name("gdg")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 5)
    consumer = share_consumer(bs, group, [topic])
    try:
        sink = Consumed()
        poll_until(consumer, lambda: len(sink) >= 5, sink, 60)
        assert delete_groups(bs, [group]) == {group: ErrorCode.NON_EMPTY_GROUP}
        assert group_state(bs, group) == "Stable"
    finally:
        consumer.close()
    wait_for_state(bs, group, "Empty")
    missing = _name("missing")
    assert delete_groups(bs, [group, missing]) == {group: ErrorCode.NONE, missing: ErrorCode.GROUP_ID_NOT_FOUND}
    assert group not in list_groups(bs, [], [])
    gone = describe_group(bs, group)
    assert (gone.error_code, gone.group_state) == (ErrorCode.GROUP_ID_NOT_FOUND, "Dead")
    assert describe_group(bs, group, version=5).error_code == ErrorCode.NONE
    assert describe_group(bs, group, version=5).group_state == "Dead"
    # State went with the group: a group of the same name starts over.
    assert offsets_by_partition(describe_offsets(bs, group, {topic: [0]}))[(topic, 0)] == (-1, -1, 0)


def list_groups(bs: str, states: list[str], types: list[str]) -> dict[str, Any]:
    with WireClient.connect(bs) as client:
        resp = client.request(ApiKey.LIST_GROUPS, 5, messages.ListGroupsRequest(states_filter=states, types_filter=types))
    assert resp.error_code == ErrorCode.NONE
    return {g.group_id: g for g in resp.groups}


@pytest.mark.filterwarnings("ignore:list_groups:DeprecationWarning")
def test_confluent_admin_and_list_groups_filters_see_share_groups(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = _name("ca"), _name("gca")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 3)
    consumer = share_consumer(bs, group, [topic])
    admin = AdminClient({"bootstrap.servers": bs})
    try:
        sink = Consumed()
        poll_until(consumer, lambda: len(sink) >= 3, sink, 60)
        # ListGroups v5 filters: by type and by state (case-insensitive, as Kafka).
        listed = list_groups(bs, [], ["share"])
        assert (listed[group].group_type, listed[group].protocol_type, listed[group].group_state) == (
            "share", "share", "Stable")
        assert group not in list_groups(bs, [], ["consumer", "classic"])
        assert group in list_groups(bs, ["stable"], [])
        assert group not in list_groups(bs, ["Empty"], ["share"])
        # DescribeGroups describes classic groups only: Kafka answers a share group as Dead, with
        # GROUP_ID_NOT_FOUND from v6 on.
        described = describe_group(bs, group)
        assert (described.error_code, described.group_state, described.members) == (
            ErrorCode.GROUP_ID_NOT_FOUND, "Dead", [])
        old = describe_group(bs, group, version=5)
        assert (old.error_code, old.group_state, old.protocol_type) == (ErrorCode.NONE, "Dead", "")
        # list_consumer_groups asks only for consumer/classic groups; describe_consumer_groups (DescribeGroups
        # here) sees no such classic group (librdkafka 2.16 has no share-group admin API).
        assert group not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}
        seen = admin.describe_consumer_groups([group])[group].result(30)
        assert (seen.state, seen.members) == (ConsumerGroupState.DEAD, [])
    finally:
        consumer.close()
    wait_for_state(bs, group, "Empty")
    assert group in list_groups(bs, ["empty"], ["SHARE"])
    # DeleteGroups sent by the confluent client works for share groups.
    admin.delete_consumer_groups([group])[group].result(30)
    assert group not in list_groups(bs, [], [])
    assert group not in {g.id for g in admin.list_groups(timeout=30)}
