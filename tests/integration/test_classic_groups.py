"""Classic consumer groups with real clients: two members split a topic, one leaves and the other takes
over, committed offsets survive SIGKILL, a static member comes back without a rebalance, and bad
requests get Kafka's error codes without changing the group."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import NO_JOIN_DELAY
from .group_clients import CLIENTS, ConfluentGroupConsumer, GroupConsumer
from .kafka_wire import WireClient
from .share_clients import create_topic

PARTITIONS = 6
BATCH = 20  # records per partition per produced batch
ALL = set(range(PARTITIONS))
MAX_ROUNDS = 400  # poll rounds before a test gives up (a hang guard, not a timing assertion)


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", overrides=NO_JOIN_DELAY).start()
    yield proc
    proc.stop()


def produce(bootstrap: str, topic: str, batch: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(PARTITIONS):
        for i in range(BATCH):
            producer.produce(topic, value=f"{batch}:{p}:{i}".encode(), partition=p)
    assert producer.flush(30) == 0


def poll_until(consumers: list[GroupConsumer], done: Callable[[], bool], seen: dict[int, list[int]],
               owners: dict[int, set[int]] | None = None) -> None:
    """Poll every consumer (committing what it got) until `done()`; records offsets per partition."""
    for _ in range(MAX_ROUNDS):
        for index, consumer in enumerate(consumers):
            polled = consumer.poll()
            for partition, offset, _value in polled:
                seen[partition].append(offset)
                if owners is not None:
                    owners.setdefault(index, set()).add(partition)
            if polled:
                consumer.commit()
        if done():
            return
    raise AssertionError(f"condition not reached; seen {({p: len(o) for p, o in seen.items()})}")


def contiguous(offsets: list[int], start: int, end: int) -> bool:
    return sorted(set(offsets)) == list(range(start, end))


@pytest.mark.parametrize("client", list(CLIENTS))
def test_split_takeover_and_resume_after_kill(tmp_path: Path, client: str) -> None:
    broker = BrokerProcess(tmp_path / "data", overrides=NO_JOIN_DELAY).start()
    try:
        make = CLIENTS[client]
        topic, group = f"cg-{client}-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        seen: dict[int, list[int]] = {p: [] for p in ALL}
        a = make(broker.bootstrap, group, topic)
        b = make(broker.bootstrap, group, topic)

        # Two members split the six partitions.
        poll_until([a, b], lambda: a.assignment() | b.assignment() == ALL and len(a.assignment()) == 3
                   and not a.assignment() & b.assignment(), seen)
        split = (a.assignment(), b.assignment())
        produce(broker.bootstrap, topic, 1)
        owners: dict[int, set[int]] = {}
        poll_until([a, b], lambda: all(len(set(seen[p])) == BATCH for p in ALL), seen, owners)
        assert owners[0] <= split[0] and owners[1] <= split[1]

        # One leaves; the other takes every partition over and continues where the group committed.
        b.close()
        poll_until([a], lambda: a.assignment() == ALL, seen)
        produce(broker.bootstrap, topic, 2)
        poll_until([a], lambda: all(len(set(seen[p])) == 2 * BATCH for p in ALL), seen)
        assert all(contiguous(seen[p], 0, 2 * BATCH) for p in ALL)
        assert a.committed(PARTITIONS) == {p: 2 * BATCH for p in ALL}
        a.close()

        # More records arrive, the broker is killed, and a new member resumes from the commits.
        produce(broker.bootstrap, topic, 3)
        broker.kill()
        broker.start()
        after: dict[int, list[int]] = {p: [] for p in ALL}
        c = make(broker.bootstrap, group, topic)
        try:
            poll_until([c], lambda: all(len(set(after[p])) >= BATCH for p in ALL), after)
            assert all(contiguous(after[p], 2 * BATCH, 3 * BATCH) for p in ALL), after
            assert c.committed(PARTITIONS) == {p: 3 * BATCH for p in ALL}
        finally:
            c.close()
    finally:
        broker.stop()


def test_static_member_rejoins_without_rebalance(group_broker: BrokerProcess) -> None:
    topic, group = f"static-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(group_broker.bootstrap, topic, PARTITIONS)
    seen: dict[int, list[int]] = {p: [] for p in ALL}
    a = ConfluentGroupConsumer(group_broker.bootstrap, group, topic, instance_id="static-a")
    b = ConfluentGroupConsumer(group_broker.bootstrap, group, topic, instance_id="static-b")
    poll_until([a, b], lambda: a.assignment() | b.assignment() == ALL and not a.assignment() & b.assignment()
               and bool(a.assignment()) and bool(b.assignment()), seen)
    mine = b.assignment()
    a_events = list(a.events)
    b.close()  # a static member does not leave the group on close
    b2 = ConfluentGroupConsumer(group_broker.bootstrap, group, topic, instance_id="static-b")
    try:
        poll_until([a, b2], lambda: b2.assignment() == mine, seen)
        for _ in range(5):  # a few more rounds: a must see no revocation or new assignment
            a.poll()
            b2.poll()
        assert a.events == a_events
        assert b2.events == [("assign", frozenset(mine))]
    finally:
        a.close()
        b2.close()


# ---- bad input over the wire: Kafka's codes, and the group is left as it was ----------------------------


def join(wire: WireClient, group: str, member_id: str = "", protocol_type: str = "consumer",
         protocols: tuple[str, ...] = ("range",), instance_id: str | None = None, version: int = 9) -> object:
    req = messages.JoinGroupRequest(
        group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id=member_id,
        group_instance_id=instance_id, protocol_type=protocol_type,
        protocols=[messages.JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=b"\x00\x01") for n in protocols],
        reason=None,
    )
    return wire.request(ApiKey.JOIN_GROUP, version, req)


def stable_single_member_group(wire: WireClient, group: str) -> tuple[str, int]:
    first = join(wire, group)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    joined = join(wire, group, member_id=first.member_id)
    assert joined.error_code == ErrorCode.NONE and joined.leader == joined.member_id
    sync = wire.request(ApiKey.SYNC_GROUP, 5, messages.SyncGroupRequest(
        group_id=group, generation_id=joined.generation_id, member_id=joined.member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[messages.SyncGroupRequest.SyncGroupRequestAssignment(member_id=joined.member_id,
                                                                         assignment=b"A")]))
    assert sync.error_code == ErrorCode.NONE and sync.assignment == b"A"
    return joined.member_id, joined.generation_id


def describe(wire: WireClient, group: str) -> object:
    resp = wire.request(ApiKey.DESCRIBE_GROUPS, 5, messages.DescribeGroupsRequest(
        groups=[group], include_authorized_operations=False))
    [g] = resp.groups
    return (g.group_state, g.protocol_type, g.protocol_data,
            [(m.member_id, bytes(m.member_assignment)) for m in g.members])


def commit(wire: WireClient, group: str, member_id: str, generation: int, topic: str, offset: int) -> int:
    req = messages.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member_id, group_instance_id=None,
        topics=[messages.OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
            messages.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="m")])])
    resp = wire.request(ApiKey.OFFSET_COMMIT, 9, req)
    return int(resp.topics[0].partitions[0].error_code)


def fetch_committed(wire: WireClient, group: str, topic: str) -> int:
    req = messages.OffsetFetchRequest(groups=[messages.OffsetFetchRequest.OffsetFetchRequestGroup(
        group_id=group, member_id=None, member_epoch=-1,
        topics=[messages.OffsetFetchRequest.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])])],
        require_stable=False)
    resp = wire.request(ApiKey.OFFSET_FETCH, 9, req)
    return int(resp.groups[0].topics[0].partitions[0].committed_offset)


def test_bad_requests_get_kafka_codes_and_change_nothing(group_broker: BrokerProcess) -> None:
    topic, group = f"bad-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(group_broker.bootstrap, topic, PARTITIONS)
    with WireClient.connect(group_broker.bootstrap) as wire:
        member_id, generation = stable_single_member_group(wire, group)
        assert commit(wire, group, member_id, generation, topic, 5) == ErrorCode.NONE
        before = describe(wire, group)
        assert before[0] == "Stable" and before[3] == [(member_id, b"A")]

        # A new member with another protocol type, or no common protocol.
        assert join(wire, group, protocol_type="connect").error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert join(wire, group, protocols=("roundrobin",)).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # A brand-new group needs a protocol type.
        assert join(wire, f"{group}-x", protocol_type="").error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # A SyncGroup from a stale generation.
        stale = wire.request(ApiKey.SYNC_GROUP, 5, messages.SyncGroupRequest(
            group_id=group, generation_id=generation - 1, member_id=member_id, group_instance_id=None,
            protocol_type="consumer", protocol_name="range", assignments=[]))
        assert stale.error_code == ErrorCode.ILLEGAL_GENERATION
        # OffsetCommit from a fenced member: a stale generation, and an unknown member.
        assert commit(wire, group, member_id, generation - 1, topic, 9) == ErrorCode.ILLEGAL_GENERATION
        assert commit(wire, group, "ghost", generation, topic, 9) == ErrorCode.UNKNOWN_MEMBER_ID
        hb = wire.request(ApiKey.HEARTBEAT, 4, messages.HeartbeatRequest(
            group_id=group, generation_id=generation + 1, member_id=member_id, group_instance_id=None))
        assert hb.error_code == ErrorCode.ILLEGAL_GENERATION
        assert describe(wire, group) == before
        assert fetch_committed(wire, group, topic) == 5

        # Kafka does not check a committed offset against the log end: it is stored, and a consumer
        # starting from it is reset by auto.offset.reset (OFFSET_OUT_OF_RANGE on fetch).
        assert commit(wire, group, member_id, generation, topic, 10**9) == ErrorCode.NONE
        assert fetch_committed(wire, group, topic) == 10**9
        assert describe(wire, group) == before


def test_group_ids_are_not_shared_between_group_types(group_broker: BrokerProcess) -> None:
    topic, group = f"types-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(group_broker.bootstrap, topic, PARTITIONS)
    with WireClient.connect(group_broker.bootstrap) as wire:
        stable_single_member_group(wire, group)
        share = wire.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
            group_id=group, member_id=uuid.uuid4().hex[:22], member_epoch=0, rack_id=None,
            subscribed_topic_names=[topic]))
        assert share.error_code == ErrorCode.GROUP_ID_NOT_FOUND

        share_group = f"s-{uuid.uuid4().hex[:6]}"
        joined = wire.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
            group_id=share_group, member_id=uuid.uuid4().hex[:22], member_epoch=0, rack_id=None,
            subscribed_topic_names=[topic]))
        assert joined.error_code == ErrorCode.NONE
        assert join(wire, share_group).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        hb = wire.request(ApiKey.HEARTBEAT, 4, messages.HeartbeatRequest(
            group_id=share_group, generation_id=1, member_id=joined.member_id, group_instance_id=None))
        assert hb.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit(wire, share_group, "", -1, topic, 1) == ErrorCode.GROUP_ID_NOT_FOUND


def test_topic_ids_and_old_versions(group_broker: BrokerProcess) -> None:
    """OffsetCommit/OffsetFetch v10 name topics by id; LeaveGroup v0-2 and Heartbeat v0 have no batch form."""
    topic, group = f"ids-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(group_broker.bootstrap, topic, PARTITIONS)
    with WireClient.connect(group_broker.bootstrap) as wire:
        meta = wire.request(ApiKey.METADATA, 12, messages.MetadataRequest(
            topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic, topic_id=b"\x00" * 16)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        topic_id = meta.topics[0].topic_id
        oc = messages.OffsetCommitRequest
        commit = wire.request(ApiKey.OFFSET_COMMIT, 10, oc(
            group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=[oc.OffsetCommitRequestTopic(topic_id=topic_id, partitions=[oc.OffsetCommitRequestPartition(
                partition_index=2, committed_offset=7, committed_leader_epoch=-1, committed_metadata=None)]),
                    oc.OffsetCommitRequestTopic(topic_id=b"\x01" * 16, partitions=[oc.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=None)])]))
        assert [(t.topic_id, t.partitions[0].error_code) for t in commit.topics] == [
            (topic_id, ErrorCode.NONE), (b"\x01" * 16, ErrorCode.UNKNOWN_TOPIC_ID)]
        of = messages.OffsetFetchRequest
        fetched = wire.request(ApiKey.OFFSET_FETCH, 10, of(groups=[of.OffsetFetchRequestGroup(
            group_id=group, member_id=None, member_epoch=-1,
            topics=[of.OffsetFetchRequestTopics(topic_id=topic_id, partition_indexes=[2])])], require_stable=False))
        [t] = fetched.groups[0].topics
        assert (t.topic_id, t.partitions[0].committed_offset) == (topic_id, 7)
        # v1 names its topics; v2 may ask for all of them (null).
        v1 = wire.request(ApiKey.OFFSET_FETCH, 1, of(group_id=group, topics=[
            of.OffsetFetchRequestTopic(name=topic, partition_indexes=[2, 0])]))
        assert [(p.partition_index, p.committed_offset) for x in v1.topics for p in x.partitions] == [(2, 7), (0, -1)]
        v2 = wire.request(ApiKey.OFFSET_FETCH, 2, of(group_id=group, topics=None))
        assert [(x.name, p.committed_offset) for x in v2.topics for p in x.partitions] == [(topic, 7)]

        member_id, generation = stable_single_member_group(wire, group)
        hb = wire.request(ApiKey.HEARTBEAT, 0, messages.HeartbeatRequest(
            group_id=group, generation_id=generation, member_id=member_id))
        assert hb.error_code == ErrorCode.NONE
        left = wire.request(ApiKey.LEAVE_GROUP, 2, messages.LeaveGroupRequest(group_id=group, member_id="ghost"))
        assert left.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        left = wire.request(ApiKey.LEAVE_GROUP, 2, messages.LeaveGroupRequest(group_id=group, member_id=member_id))
        assert left.error_code == ErrorCode.NONE
        assert describe(wire, group)[0] == "Empty"
