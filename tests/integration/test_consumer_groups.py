"""KIP-848 consumer groups with confluent-kafka's `group.protocol=consumer`: two members split a topic with
incremental revocation (the first member keeps its other partitions throughout), committed offsets
survive SIGKILL, a regex subscription picks up a topic created later, and a group id of one type is
refused for another while ListGroups/ConsumerGroupDescribe report the type."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import create_topic
from .test_tools_consumer_groups import consumer_groups

PARTITIONS = 6
BATCH = 10  # records per partition per produced batch
# A short heartbeat interval makes each reconciliation step (one heartbeat each) quick.
OVERRIDES = ["group.consumer.heartbeat.interval.ms=300", "group.initial.rebalance.delay.ms=0"]
MAX_POLLS = 600  # a hang guard, not a timing assertion


@pytest.fixture
def cg_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", overrides=OVERRIDES).start()
    yield proc
    proc.stop()


def produce(bootstrap: str, topic: str, tag: str, partitions: int = PARTITIONS) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(BATCH):
            producer.produce(topic, value=f"{tag}:{p}:{i}".encode(), partition=p)
    assert producer.flush(30) == 0


class Member:
    """A `group.protocol=consumer` consumer that records what it gets and every (re)assignment."""

    def __init__(self, bootstrap: str, group: str, subscription: list[str], extra: dict[str, str] | None = None):
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False, **(extra or {}),
        })
        self.assigned: set[tuple[str, int]] = set()
        self.revoked: list[set[tuple[str, int]]] = []
        self.seen: dict[tuple[str, int], list[int]] = {}
        self.consumer.subscribe(subscription, on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.assigned |= {(tp.topic, tp.partition) for tp in parts}

    def _on_revoke(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in parts}
        self.revoked.append(gone)
        self.assigned -= gone

    def poll(self) -> int:
        msg = self.consumer.poll(0.05)
        if msg is None or msg.error() is not None:
            return 0
        self.seen.setdefault((msg.topic(), msg.partition()), []).append(msg.offset())
        return 1

    def partitions(self) -> set[int]:
        return {p for _t, p in self.assigned}

    def close(self) -> None:
        self.consumer.close()


def poll_until(members: list[Member], done: Callable[[], bool]) -> None:
    for _ in range(MAX_POLLS):
        for m in members:
            m.poll()
        if done():
            return
    raise AssertionError(f"not reached: {[sorted(m.assigned) for m in members]}")


def seen_count(members: list[Member], topic: str) -> int:
    return sum(len(offs) for m in members for (t, _p), offs in m.seen.items() if t == topic)


def test_two_members_split_incrementally_and_offsets_survive_kill(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", overrides=OVERRIDES).start()
    try:
        topic, group = f"kc-{uuid.uuid4().hex[:6]}", f"kg-{uuid.uuid4().hex[:6]}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        produce(broker.bootstrap, topic, "a")
        first = Member(broker.bootstrap, group, [topic])
        poll_until([first], lambda: seen_count([first], topic) == PARTITIONS * BATCH)
        assert first.partitions() == set(range(PARTITIONS)) and first.revoked == []
        second = Member(broker.bootstrap, group, [topic])
        poll_until([first, second], lambda: len(first.assigned) == len(second.assigned) == PARTITIONS // 2)
        # Incremental: the first member gave up exactly what the second got, in one revocation, and
        # never lost the partitions it kept (no stop-the-world revocation of everything).
        assert first.revoked == [second.assigned]
        assert first.partitions() | second.partitions() == set(range(PARTITIONS))
        assert not first.partitions() & second.partitions()
        # Both consume new records from their own partitions, and commit them (member epochs checked).
        produce(broker.bootstrap, topic, "b")
        poll_until([first, second], lambda: all(
            max(m.seen.get((topic, p), [-1])) == 2 * BATCH - 1 for m in (first, second) for p in m.partitions()))
        for m in (first, second):
            assert {p for (_t, p), offs in m.seen.items() if max(offs) >= BATCH} <= m.partitions()
            m.consumer.commit(asynchronous=False)
        committed = first.consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        assert [tp.offset for tp in committed] == [2 * BATCH] * PARTITIONS
        broker.kill()
        broker.start()
        # The group comes back from the log: both members carry on with their partitions, no rebalance.
        produce(broker.bootstrap, topic, "c")
        poll_until([first, second], lambda: all(
            max(m.seen.get((topic, p), [-1])) == 3 * BATCH - 1 for m in (first, second) for p in m.partitions()))
        assert len(first.revoked) == 1 and second.revoked == []
        first.close()
        second.close()
        # The committed offsets came back too: a new member resumes exactly there (the third batch was
        # not committed), nothing lost, nothing skipped.
        third = Member(broker.bootstrap, group, [topic])
        poll_until([third], lambda: seen_count([third], topic) == PARTITIONS * BATCH)
        for p in range(PARTITIONS):
            assert third.seen[(topic, p)] == list(range(2 * BATCH, 3 * BATCH))
        assert len(third.assigned) == PARTITIONS
        third.close()
    finally:
        broker.stop()


def test_regex_subscription_picks_up_a_new_topic(cg_broker: BrokerProcess) -> None:
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    create_topic(cg_broker.bootstrap, f"{prefix}-a", 2)
    produce(cg_broker.bootstrap, f"{prefix}-a", "a", 2)
    # Internal topics are never matched, even when the pattern names them.
    member = Member(cg_broker.bootstrap, f"rg-{prefix}", [f"^({prefix}-.*|__consumer_offsets)"])
    try:
        poll_until([member], lambda: seen_count([member], f"{prefix}-a") == 2 * BATCH)
        create_topic(cg_broker.bootstrap, f"{prefix}-b", 3)
        produce(cg_broker.bootstrap, f"{prefix}-b", "b", 3)
        poll_until([member], lambda: seen_count([member], f"{prefix}-b") == 3 * BATCH)
        assert {t for t, _p in member.assigned} == {f"{prefix}-a", f"{prefix}-b"}
    finally:
        member.close()


def test_group_types_are_exclusive_and_reported(cg_broker: BrokerProcess) -> None:
    topic, group = f"kt-{uuid.uuid4().hex[:6]}", f"kt-{uuid.uuid4().hex[:6]}"
    create_topic(cg_broker.bootstrap, topic, PARTITIONS)
    member = Member(cg_broker.bootstrap, group, [topic])
    try:
        poll_until([member], lambda: len(member.assigned) == PARTITIONS)
        admin = AdminClient({"bootstrap.servers": cg_broker.bootstrap})
        listed = admin.list_consumer_groups().result(timeout=30)
        [mine] = [g for g in listed.valid if g.group_id == group]
        assert mine.type == ConsumerGroupType.CONSUMER
        d = admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert d.type == ConsumerGroupType.CONSUMER and len(d.members) == 1
        assert {tp.partition for tp in d.members[0].assignment.topic_partitions} == set(range(PARTITIONS))
        with WireClient.connect(cg_broker.bootstrap) as wire:
            # A classic JoinGroup on the consumer group, and a share heartbeat, are refused.
            joined = wire.request(ApiKey.JOIN_GROUP, 9, messages.JoinGroupRequest(
                group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
                group_instance_id=None, protocol_type="consumer", reason=None,
                protocols=[messages.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))
            assert joined.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            share = wire.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
                group_id=group, member_id=uuid.uuid4().hex, member_epoch=0, subscribed_topic_names=[topic]))
            assert share.error_code == ErrorCode.GROUP_ID_NOT_FOUND
            # DescribeGroups (classic) does not describe it, as in Kafka.
            [g] = wire.request(ApiKey.DESCRIBE_GROUPS, 6, messages.DescribeGroupsRequest(
                groups=[group], include_authorized_operations=False)).groups
            assert (g.error_code, g.group_state) == (ErrorCode.GROUP_ID_NOT_FOUND, "Dead")
            # A stale member epoch cannot commit.
            _TopicC = messages.OffsetCommitRequest.OffsetCommitRequestTopic  # type: ignore[attr-defined]
            _PartC = messages.OffsetCommitRequest.OffsetCommitRequestPartition  # type: ignore[attr-defined]
            [mid] = [m.member_id for m in d.members]
            commit = wire.request(ApiKey.OFFSET_COMMIT, 9, messages.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=999, member_id=mid, group_instance_id=None,
                topics=[_TopicC(name=topic, partitions=[_PartC(partition_index=0, committed_offset=1,
                                                               committed_leader_epoch=-1, committed_metadata="")])]))
            assert commit.topics[0].partitions[0].error_code == ErrorCode.STALE_MEMBER_EPOCH
        # Shoal's admin and kafka-consumer-groups see the group through ConsumerGroupDescribe.
        code, rows, _ = consumer_groups(cg_broker, "--list")
        assert code == 0 and [group] in rows
        code, rows, _ = consumer_groups(cg_broker, "--describe", "--group", group, "--state")
        assert code == 0 and rows[1][-3:] == ["uniform", "Stable", "1"]
        code, rows, _ = consumer_groups(cg_broker, "--describe", "--group", group, "--members", "--verbose")
        assert code == 0 and rows[1][4:] == [str(PARTITIONS), f"{topic}:" + ",".join(map(str, range(PARTITIONS)))]
        # A classic consumer with that group id does not get in either.
        classic = Consumer({"bootstrap.servers": cg_broker.bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest"})
        classic.subscribe([topic])
        errors: list[int] = []
        for _ in range(MAX_POLLS):
            msg = classic.poll(0.05)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error().code())
                break
        classic.close()
        assert errors == [KafkaError.INCONSISTENT_GROUP_PROTOCOL]
    finally:
        member.close()


def test_a_second_consumer_with_a_live_static_members_instance_id_is_refused(cg_broker: BrokerProcess) -> None:
    """librdkafka sends InstanceId in the join only; the member keeps it, so a second consumer with the
    same group.instance.id gets UNRELEASED_INSTANCE_ID while the first lives (librdkafka test 0102 under
    group.protocol=consumer), and the group keeps one member."""
    topic, group = f"st-{uuid.uuid4().hex[:6]}", f"st-{uuid.uuid4().hex[:6]}"
    create_topic(cg_broker.bootstrap, topic, 2)
    produce(cg_broker.bootstrap, topic, "s", 2)
    first = Member(cg_broker.bootstrap, group, [topic], {"group.instance.id": "instance-1"})
    errors: list[KafkaError] = []
    second: Consumer | None = None
    try:
        # Every record consumed, and heartbeats past the join (which omit InstanceId) answered.
        poll_until([first], lambda: seen_count([first], topic) == 2 * BATCH)
        for _ in range(20):
            first.poll()
        second = Consumer({
            "bootstrap.servers": cg_broker.bootstrap, "group.id": group, "group.protocol": "consumer",
            "group.instance.id": "instance-1", "auto.offset.reset": "earliest",
            "error_cb": errors.append,
        })
        second.subscribe([topic])
        for _ in range(MAX_POLLS):
            msg = second.poll(0.05)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error())
            first.poll()
            if any(e.code() in (KafkaError.UNRELEASED_INSTANCE_ID, KafkaError._FATAL) for e in errors):
                break
        # librdkafka makes it fatal (_FATAL), naming the broker's error by its description.
        unreleased = "instance ID is still used by another member"
        refused = [e for e in errors if e.code() == KafkaError.UNRELEASED_INSTANCE_ID
                   or (e.code() == KafkaError._FATAL and unreleased in e.str())]
        assert refused, [str(e) for e in errors]
        with WireClient.connect(cg_broker.bootstrap) as wire:
            [described] = wire.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
                group_ids=[group], include_authorized_operations=False)).groups
        assert described.error_code == ErrorCode.NONE
        assert [m.instance_id for m in described.members] == ["instance-1"]
        assert first.partitions() == {0, 1}
    finally:
        if second is not None:
            second.close()
        first.close()
