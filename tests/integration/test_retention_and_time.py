"""Time and churn do not eat group state: with tiny segments and a one-second log.retention.ms, other
groups come and go and the broker is restarted, and still a long-lived share group keeps its member,
its SPSO and its acknowledged records, the share coordinator has pruned its own topic, and a topic with
cleanup.policy=compact keeps every record (their keys all differ)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import set_group_config
from .test_share_protocol import (
    ACCEPT,
    RawShareMember,
    acquired,
    heartbeat,
    join,
    produce_batches,
    share_setup,
    state_summary,
    unique,
)

RETENTION_MS = 1000
CHURN_GROUPS = 8


def describe_member(client: WireClient, group: str) -> tuple[str, list[tuple[str, int]]]:
    """(group state, [(member id, member epoch)]) from ShareGroupDescribe."""
    req = messages.ShareGroupDescribeRequest(group_ids=[group], include_authorized_operations=False)
    [described] = client.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, req).groups
    assert described.error_code == ErrorCode.NONE, described.error_message
    return described.group_state, [(m.member_id, m.member_epoch) for m in described.members]


def watermarks(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return int(low), int(high)
    finally:
        c.close()


def read_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("rd"), "enable.auto.commit": False})
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while len(out) < count and time.monotonic() < deadline:
            out += [m.value() for m in c.consume(count, 0.5) if m.error() is None]
    finally:
        c.close()
    return out


def churn(broker: BrokerProcess, topic: str, topic_id: bytes, keep_alive: Any) -> None:
    """Groups that join, take and accept records, and leave: writes on both internal topics."""
    for i in range(CHURN_GROUPS):
        group = unique(f"churn{i}")
        set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
        m = RawShareMember(broker, group, topic_id)
        try:
            join(m.client, group, m.member_id, topic, topic_id, {0})
            got = acquired(m.fetch([0], max_wait_ms=2000))
            assert got, "a churn group got nothing"
            assert m.ack_codes({0: [(a, b, [ACCEPT]) for a, b, _c in got]}) == {0: ErrorCode.NONE}
            assert heartbeat(m.client, group, m.member_id, -1, None).error_code == ErrorCode.NONE
        finally:
            m.close()
        keep_alive()


def test_group_state_outlives_retention_and_churn(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", overrides=[
        "log.segment.bytes=1024", f"log.retention.ms={RETENTION_MS}", "log.retention.check.interval.ms=100",
        "offsets.topic.num.partitions=1", "offsets.topic.segment.bytes=1024",
        "share.coordinator.state.topic.num.partitions=1", "share.coordinator.state.topic.segment.bytes=1024",
        "share.coordinator.state.topic.prune.interval.ms=100",
        "share.coordinator.cold.partition.snapshot.interval.ms=100",
    ]).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        compacted = unique("table")
        admin.create_topics([NewTopic(compacted, 1, 1, config={"cleanup.policy": "compact"})])[compacted].result(30)
        wire = WireClient.connect(broker.bootstrap)
        # Several small batches, so the compacted topic has sealed segments retention could take.
        produce_batches(wire, compacted, [5] * 8, keyed=True)

        s = share_setup(broker, members=1)
        # The group's own topic keeps its records: past retention.ms even the active segment goes, as in Kafka.
        keep = ConfigResource(ResourceType.TOPIC, s.topic, incremental_configs=[
            ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
        for future in admin.incremental_alter_configs([keep]).values():
            future.result(30)
        produce_batches(s.admin, s.topic, [5, 5])
        [member] = s.members
        got = acquired(member.fetch([0], max_wait_ms=2000, max_records=5, batch_size=5))
        assert got[0][0] == 0
        last = got[-1][1]
        assert last < 9
        assert member.ack_codes({0: [(0, last, [ACCEPT])]}) == {0: ErrorCode.NONE}
        state, members = describe_member(wire, s.group)
        [(member_id, member_epoch)] = members
        assert member_id == member.member_id and member_epoch > 0

        def keep_alive() -> None:
            resp = heartbeat(member.client, s.group, member.member_id, member_epoch, None)
            assert resp.error_code == ErrorCode.NONE, resp.error_code

        started = time.monotonic()
        churn(broker, s.topic, s.topic_id, keep_alive)
        # Let everything written before the churn age past retention, then a few retention passes run.
        while time.monotonic() - started < 2 * RETENTION_MS / 1000:
            keep_alive()
            time.sleep(0.2)
        produce_batches(wire, s.topic, [3])  # a fresh segment on the user topic
        low_state, high_state = watermarks(broker.bootstrap, "__share_group_state")
        assert low_state > 0, "the share coordinator never pruned its topic"
        assert high_state > low_state

        wire.close()
        member.close()
        s.admin.close()
        broker.kill()
        broker.start()

        wire = WireClient.connect(broker.bootstrap)
        try:
            # The member is still there, with its epoch (its session timeout restarted with the broker).
            state_after, members_after = describe_member(wire, s.group)
            assert members_after == [(member.member_id, member_epoch)]
            assert state_after == state
            # SPSO past the accepted records, and those are not handed out again.
            [(_p, err, _se, start, _dcc)] = state_summary(wire, s.group, s.topic_id, [0])
            assert (err, start) == (ErrorCode.NONE, last + 1)
            again = RawShareMember(broker, s.group, s.topic_id, member_id=member.member_id)
            try:
                regot = acquired(again.fetch([0], max_wait_ms=2000))
                assert regot and regot[0][0] == last + 1
            finally:
                again.close()
            # The compacted topic lost nothing to time.
            assert watermarks(broker.bootstrap, compacted) == (0, 40)
            assert len(read_values(broker.bootstrap, compacted, 40)) == 40
        finally:
            wire.close()
    finally:
        broker.stop()
