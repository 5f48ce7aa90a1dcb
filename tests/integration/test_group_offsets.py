"""One group coordinator over `__consumer_offsets`: committed offsets belong to the group id, whatever type
of group holds it, as in Kafka's OffsetMetadataManager.

With real clients against the real broker: a classic group's offsets carry over to a KIP-848 group of the
same id (and back) once its members have left; offsets committed without a group (assign() + commit) are
kept by the KIP-848 group that forms later; a KIP-848 consumer's send_offsets_to_transaction is visible at
once after the commit; the later of a transactional and a regular commit wins, also after a restart; a
deleted topic takes its committed offsets with it; a compacted `__consumer_offsets` whose KIP-848 group
records all come after an offset commit keeps that offset across a restart; TxnOffsetCommit v3 fences
stale generations, unknown members and replaced static members (KIP-447); a JoinGroup and a
ConsumerGroupHeartbeat racing for a new group id make one group.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .names import unique_name
from .test_compaction import _wait_for

OVERRIDES = ["group.consumer.heartbeat.interval.ms=300", "group.initial.rebalance.delay.ms=0",
             "offsets.topic.num.partitions=3", "transaction.state.log.num.partitions=3",
             "transaction.max.timeout.ms=60000"]
MAX_POLLS = 600  # a hang guard, not a timing assertion
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed


@pytest.fixture(scope="module")
def gc_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("gc") / "data", overrides=OVERRIDES).start()
    yield proc
    proc.stop()


def _topic(bootstrap: str, partitions: int = 1, name: str | None = None) -> str:
    name = name or unique_name("gco")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0


def _consumer(bootstrap: str, group: str, protocol: str, **extra: Any) -> Consumer:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                              "enable.auto.commit": False, **extra}
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    return Consumer(config)


def _first_offset(consumer: Consumer, topic: str) -> int:
    """Subscribe and poll until the first record arrives; returns its offset (where the group resumed)."""
    consumer.subscribe([topic])
    errors: list[str] = []
    for _ in range(MAX_POLLS):
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error() is not None:
            errors.append(str(msg.error()))
            if msg.error().code() != KafkaError._PARTITION_EOF:
                break
            continue
        return int(msg.offset())
    raise AssertionError(f"no record consumed: {errors}")


def _committed(bootstrap: str, group: str, topic: str, protocol: str = "classic") -> int:
    consumer = _consumer(bootstrap, group, protocol)
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], 30)[0].offset)
    finally:
        consumer.close()


def _txn_state(bootstrap: str, txn_id: str) -> str:
    with WireClient.connect(bootstrap) as wire:
        resp = wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0,
                            messages.DescribeTransactionsRequest(transactional_ids=[txn_id]))
    return str(resp.transaction_states[0].transaction_state)


@pytest.mark.parametrize(("first", "then"), [("classic", "consumer"), ("consumer", "classic")])
def test_group_protocol_switch_after_members_left_keeps_offsets(gc_broker: BrokerProcess, first: str,
                                                                then: str) -> None:
    """A group whose members have all left is converted to the other protocol on the next join, as
    Kafka converts an empty classic group to a consumer group and back; the offsets stay."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap), unique_name("switch")
    _produce(bootstrap, topic, 10)
    before = _consumer(bootstrap, group, first)
    try:
        assert _first_offset(before, topic) == 0
        before.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        before.close()
    after = _consumer(bootstrap, group, then)
    try:
        assert _first_offset(after, topic) == 4
        assert int(after.committed([TopicPartition(topic, 0)], 30)[0].offset) == 4
    finally:
        after.close()


def test_offsets_only_group_is_joined_by_a_consumer_protocol_member(gc_broker: BrokerProcess) -> None:
    """assign() + commit leaves a group that holds only offsets (librdkafka's test 0029); a
    group.protocol=consumer member then joins that group id and resumes from those offsets."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap), unique_name("simple")
    _produce(bootstrap, topic, 10)
    simple = _consumer(bootstrap, group, "classic")
    try:
        simple.assign([TopicPartition(topic, 0, 0)])
        simple.commit(offsets=[TopicPartition(topic, 0, 6)], asynchronous=False)
    finally:
        simple.close()
    member = _consumer(bootstrap, group, "consumer")
    try:
        assert _first_offset(member, topic) == 6
        member.commit(offsets=[TopicPartition(topic, 0, 8)], asynchronous=False)
    finally:
        member.close()
    assert _committed(bootstrap, group, topic) == 8


def _transactional_producer(bootstrap: str) -> tuple[Producer, str]:
    txn_id = unique_name("gc-txn")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 30000})
    producer.init_transactions(30)
    return producer, txn_id


def test_send_offsets_to_transaction_from_a_consumer_protocol_member(gc_broker: BrokerProcess) -> None:
    """The transaction's COMMIT marker makes the offset the KIP-848 group's at once (not after a restart)."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap), unique_name("eos848")
    _produce(bootstrap, topic, 5)
    member = _consumer(bootstrap, group, "consumer")
    producer, txn_id = _transactional_producer(bootstrap)
    try:
        assert _first_offset(member, topic) == 0
        producer.begin_transaction()
        producer.produce(topic, b"out", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], member.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        _wait_for(lambda: None if _txn_state(bootstrap, txn_id) == "CompleteCommit" else "markers not written")
        assert int(member.committed([TopicPartition(topic, 0)], 30)[0].offset) == 3
    finally:
        member.close()


def test_regular_commit_after_a_transactional_one_wins(tmp_path: Path) -> None:
    """TxnOffsetCommit(5), then OffsetCommit(9), then the transaction commits: 9 is the later record and
    stays, when the marker arrives and when the log is replayed at start-up."""
    proc = BrokerProcess(tmp_path / "data", overrides=OVERRIDES).start()
    try:
        bootstrap = proc.bootstrap
        topic, group = _topic(bootstrap), unique_name("later")
        plain = _consumer(bootstrap, group, "classic")
        producer, txn_id = _transactional_producer(bootstrap)
        try:
            producer.begin_transaction()
            producer.produce(topic, b"out", partition=0)
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], plain.consumer_group_metadata(), 30)
            plain.commit(offsets=[TopicPartition(topic, 0, 9)], asynchronous=False)
            producer.commit_transaction(30)
            _wait_for(lambda: None if _txn_state(bootstrap, txn_id) == "CompleteCommit" else "markers not written")
        finally:
            plain.close()
        assert _committed(bootstrap, group, topic) == 9
        proc.stop()
        proc.start()
        assert _committed(proc.bootstrap, group, topic) == 9
    finally:
        proc.stop()


def test_deleted_topic_takes_its_committed_offsets(gc_broker: BrokerProcess) -> None:
    """Commit 100, delete the topic, create it again: the new topic has no committed offset (Kafka's
    onPartitionsDeleted)."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap), unique_name("deleted")
    consumer = _consumer(bootstrap, group, "classic")
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
    finally:
        consumer.close()
    assert _committed(bootstrap, group, topic) == 100
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    def recreated() -> str | None:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        except Exception as exc:  # the deletion may still be under way
            return str(exc)
        return None

    _wait_for(recreated)
    _wait_for(lambda: None if _committed(bootstrap, group, topic) == NO_OFFSET else "offset of the old topic kept")


def test_join_group_and_consumer_heartbeat_racing_make_one_group(gc_broker: BrokerProcess) -> None:
    """A JoinGroup and a ConsumerGroupHeartbeat for a new group id, sent back to back so the broker
    handles them at the same time: one group comes out, of one type, never two."""
    bootstrap = gc_broker.bootstrap
    topic = _topic(bootstrap)
    for _ in range(5):
        group = unique_name("race")
        with WireClient.connect(bootstrap) as wire:
            join = wire.send(ApiKey.JOIN_GROUP, 9, messages.JoinGroupRequest(
                group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
                group_instance_id=None, protocol_type="consumer", reason=None,
                protocols=[messages.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))
            heartbeat = wire.send(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, messages.ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=uuid.uuid4().hex, member_epoch=0, instance_id=None, rack_id=None,
                rebalance_timeout_ms=10000, subscribed_topic_names=[topic], server_assignor=None,
                topic_partitions=[]))
            assert wire.receive(ApiKey.JOIN_GROUP, 9)[0] == join
            assert wire.receive(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0)[0] == heartbeat
            listed = wire.request(ApiKey.LIST_GROUPS, 5, messages.ListGroupsRequest(states_filter=[], types_filter=[]))
        mine = [(g.group_id, g.group_type) for g in listed.groups if g.group_id == group]
        assert len(mine) == 1, mine


# ---- KIP-447: TxnOffsetCommit v3 carries the member's generation ------------------------------------------


def _join_classic(wire: WireClient, group: str, topic: str, instance_id: str | None = None) -> tuple[str, int]:
    """A classic member joined and synced over the wire: (member id, generation)."""
    jg = messages.JoinGroupRequest
    def join(member_id: str) -> Any:
        return wire.request(ApiKey.JOIN_GROUP, 9, jg(
            group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000, member_id=member_id,
            group_instance_id=instance_id, protocol_type="consumer", reason=None,
            protocols=[jg.JoinGroupRequestProtocol(name="range", metadata=b"")]))
    joined = join("")
    if joined.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        joined = join(joined.member_id)
    assert joined.error_code == ErrorCode.NONE, joined
    synced = wire.request(ApiKey.SYNC_GROUP, 5, messages.SyncGroupRequest(
        group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
        group_instance_id=instance_id, protocol_type="consumer", protocol_name=joined.protocol_name,
        assignments=[messages.SyncGroupRequest.SyncGroupRequestAssignment(member_id=joined.member_id,
                                                                          assignment=b"")]))
    assert synced.error_code == ErrorCode.NONE, synced
    return str(joined.member_id), int(joined.generation_id)


def _txn_offset_commit(wire: WireClient, txn: tuple[str, int, int], group: str, topic: str, member_id: str,
                       generation: int, instance_id: str | None = None) -> int:
    tx = messages.TxnOffsetCommitRequest
    txn_id, pid, epoch = txn
    resp = wire.request(ApiKey.TXN_OFFSET_COMMIT, 3, tx(
        transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch,
        generation_id_or_member_epoch=generation, member_id=member_id, group_instance_id=instance_id,
        topics=[tx.TxnOffsetCommitRequestTopic(name=topic, partitions=[tx.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=2, committed_leader_epoch=-1, committed_metadata="")])]))
    return int(resp.topics[0].partitions[0].error_code)


def _open_transaction(wire: WireClient, group: str) -> tuple[str, int, int]:
    txn_id = unique_name("kip447")
    init = wire.request(ApiKey.INIT_PRODUCER_ID, 4, messages.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout_ms=30000, producer_id=-1, producer_epoch=-1))
    assert init.error_code == ErrorCode.NONE
    added = wire.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, messages.AddOffsetsToTxnRequest(
        transactional_id=txn_id, producer_id=init.producer_id, producer_epoch=init.producer_epoch, group_id=group))
    assert added.error_code == ErrorCode.NONE
    return txn_id, int(init.producer_id), int(init.producer_epoch)


def test_txn_offset_commit_with_a_stale_generation_is_fenced(gc_broker: BrokerProcess) -> None:
    """KIP-447: TxnOffsetCommit v3 is checked against the group as Kafka's OffsetMetadataManager does:
    a stale generation gets ILLEGAL_GENERATION, an unknown member UNKNOWN_MEMBER_ID, a replaced static
    member FENCED_INSTANCE_ID; the current generation is accepted."""
    bootstrap = gc_broker.bootstrap
    topic, group, static_group = _topic(bootstrap), unique_name("fence"), unique_name("fence-static")
    with WireClient.connect(bootstrap) as wire:
        member_id, generation = _join_classic(wire, group, topic)
        txn = _open_transaction(wire, group)
        assert _txn_offset_commit(wire, txn, group, topic, member_id, generation - 1) == ErrorCode.ILLEGAL_GENERATION
        assert _txn_offset_commit(wire, txn, group, topic, "nobody", generation) == ErrorCode.UNKNOWN_MEMBER_ID
        assert _txn_offset_commit(wire, txn, group, topic, member_id, generation) == ErrorCode.NONE
        # Without member fields (a v0-v2 style commit) there is nothing to check.
        assert _txn_offset_commit(wire, txn, group, topic, "", -1) == ErrorCode.NONE

        static_member, static_generation = _join_classic(wire, static_group, topic, instance_id="static-1")
        static_txn = _open_transaction(wire, static_group)
        assert _txn_offset_commit(wire, static_txn, static_group, topic, "replaced-member", static_generation,
                                  "static-1") == ErrorCode.FENCED_INSTANCE_ID
        assert _txn_offset_commit(wire, static_txn, static_group, topic, static_member, static_generation,
                                  "static-1") == ErrorCode.NONE


def test_txn_offset_commit_with_a_stale_member_epoch_is_fenced(gc_broker: BrokerProcess) -> None:
    """For a KIP-848 group the generation is the member epoch; a stale one gets ILLEGAL_GENERATION (Kafka
    turns STALE_MEMBER_EPOCH into it for TxnOffsetCommit)."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap), unique_name("fence848")
    _produce(bootstrap, topic, 3)
    member = _consumer(bootstrap, group, "consumer")
    try:
        assert _first_offset(member, topic) == 0
        with WireClient.connect(bootstrap) as wire:
            [described] = wire.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
                group_ids=[group], include_authorized_operations=False)).groups
            [m] = described.members
            txn = _open_transaction(wire, group)
            assert _txn_offset_commit(wire, txn, group, topic, m.member_id, m.member_epoch + 1) \
                == ErrorCode.ILLEGAL_GENERATION
            assert _txn_offset_commit(wire, txn, group, topic, "nobody", m.member_epoch) == ErrorCode.UNKNOWN_MEMBER_ID
            assert _txn_offset_commit(wire, txn, group, topic, m.member_id, m.member_epoch) == ErrorCode.NONE
    finally:
        member.close()


# ---- a compacted __consumer_offsets ---------------------------------------------------------------------


def _group_records(bootstrap: str, group: str) -> list[int]:
    """Key versions (record types) of the group's records on __consumer_offsets-0, oldest first."""
    from shoal.protocol.coordinator_records import decode_record

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("reader"),
                       "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        low, high = reader.get_watermark_offsets(TopicPartition("__consumer_offsets", 0), timeout=30)
        reader.assign([TopicPartition("__consumer_offsets", 0, low)])
        types: list[int] = []
        last = low - 1
        while last < high - 1:
            msg = reader.poll(1.0)
            if msg is None or msg.error() is not None:
                if msg is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            last = msg.offset()
            record = decode_record(msg.key(), msg.value(), topic="__consumer_offsets")
            key = record.key
            if getattr(key, "group", getattr(key, "group_id", None)) == group:
                types.append(record.record_type)
        return types
    finally:
        reader.close()


def test_compacted_offsets_before_the_consumer_groups_records_survive_restart(tmp_path: Path) -> None:
    """A KIP-848 group commits, then its members come and go until compaction has removed every group
    record older than the commit: the offset commit is then the group's first record. A restart replays
    that log and keeps the offset."""
    overrides = [*OVERRIDES[:2], "offsets.topic.num.partitions=1", "offsets.topic.segment.bytes=1024",
                 "log.cleaner.backoff.ms=100", "log.cleaner.min.cleanable.ratio=0.1"]
    proc = BrokerProcess(tmp_path / "data", overrides=overrides).start()
    try:
        bootstrap = proc.bootstrap
        topic, group = _topic(bootstrap), unique_name("compacted")
        _produce(bootstrap, topic, 10)
        first = _consumer(bootstrap, group, "consumer")
        try:
            assert _first_offset(first, topic) == 0
            first.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        finally:
            first.close()

        def commit_comes_first() -> str | None:
            # More members come and go, rewriting the group's keys, until compaction has run past them.
            member = _consumer(bootstrap, group, "consumer")
            try:
                _first_offset(member, topic)
            finally:
                member.close()
            types = _group_records(bootstrap, group)
            return None if types and types[0] == 1 else f"group records on the log: {types[:12]}"

        _wait_for(commit_comes_first)
        proc.stop()
        proc.start()
        assert _committed(proc.bootstrap, group, topic) == 7
        member = _consumer(proc.bootstrap, group, "consumer")
        try:
            assert _first_offset(member, topic) == 7
        finally:
            member.close()
    finally:
        proc.stop()


def test_offset_commit_of_a_partition_the_topic_does_not_have_is_refused(gc_broker: BrokerProcess) -> None:
    """Kafka checks every partition of an OffsetCommit against the metadata: a partition past the topic's
    count (or negative) gets UNKNOWN_TOPIC_OR_PARTITION and nothing is stored for it, while a valid
    partition in the same request is committed."""
    bootstrap = gc_broker.bootstrap
    topic, group = _topic(bootstrap, partitions=2), unique_name("badpart")
    consumer = _consumer(bootstrap, group, "classic")
    try:
        result = consumer.commit(offsets=[TopicPartition(topic, 1, 4), TopicPartition(topic, 7, 5)],
                                 asynchronous=False)
    except KafkaException as exc:
        result = None
        assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
    finally:
        consumer.close()
    if result is not None:
        errors = {tp.partition: (tp.error.code() if tp.error else None) for tp in result}
        assert errors == {1: None, 7: KafkaError.UNKNOWN_TOPIC_OR_PART}, errors
    _TopicC = messages.OffsetCommitRequest.OffsetCommitRequestTopic  # type: ignore[attr-defined]
    _PartC = messages.OffsetCommitRequest.OffsetCommitRequestPartition  # type: ignore[attr-defined]
    with WireClient.connect(bootstrap) as wire:
        committed = wire.request(ApiKey.OFFSET_COMMIT, 8, messages.OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=[_TopicC(name=topic, partitions=[
                _PartC(partition_index=i, committed_offset=3, committed_leader_epoch=-1, committed_metadata="")
                for i in (0, 2, -1)])]))
        codes = {p.partition_index: p.error_code for p in committed.topics[0].partitions}
        assert codes == {0: ErrorCode.NONE, 2: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                         -1: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        fetched = wire.request(ApiKey.OFFSET_FETCH, 7, messages.OffsetFetchRequest(
            group_id=group, topics=None, require_stable=False))
    stored = {(t.name, p.partition_index): p.committed_offset for t in fetched.topics for p in t.partitions}
    assert stored == {(topic, 0): 3, (topic, 1): 4}
