"""OffsetForLeaderEpoch, DescribeTopicPartitions and DescribeProducers against the real broker."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient

OFLE = messages.OffsetForLeaderEpochRequest
DTP = messages.DescribeTopicPartitionsRequest
DP = messages.DescribeProducersRequest


def make_topics(bootstrap: str, names: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, p, 1) for n, p in names.items()], operation_timeout=10).values():
        future.result(timeout=30)


def test_offset_for_leader_epoch(broker: BrokerProcess) -> None:
    topic = f"ofle-{uuid.uuid4().hex[:6]}"
    make_topics(broker.bootstrap, {topic: 2})
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(7):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0

    def ask(partition: int, epoch: int, current: int = -1, name: str = topic) -> tuple[int, int, int]:
        req = OFLE(replica_id=-1, topics=[OFLE.OffsetForLeaderTopic(topic=name, partitions=[
            OFLE.OffsetForLeaderPartition(partition=partition, current_leader_epoch=current, leader_epoch=epoch)])])
        with WireClient.connect(broker.bootstrap) as wire:
            [t] = wire.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, req).topics
        [p] = t.partitions
        return p.error_code, p.leader_epoch, p.end_offset

    assert ask(0, 0) == (ErrorCode.NONE, 0, 7)
    assert ask(1, 0, current=0) == (ErrorCode.NONE, 0, 0)
    assert ask(0, 5) == (ErrorCode.NONE, -1, -1)  # an epoch this partition never had
    assert ask(0, 0, current=3)[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert ask(2, 0)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert ask(0, 0, name="no-such-topic")[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_describe_topic_partitions_pages_and_admin_client(broker: BrokerProcess) -> None:
    prefix = f"dtp-{uuid.uuid4().hex[:6]}"
    names = {f"{prefix}-a": 3, f"{prefix}-b": 2}
    make_topics(broker.bootstrap, names)
    # confluent's describe_topics uses DescribeTopicPartitions when the broker offers it.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = {n: f.result(timeout=30) for n, f in admin.describe_topics(TopicCollection(list(names))).items()}
    assert {n: len(d.partitions) for n, d in described.items()} == names

    pages = []
    cursor = None
    with WireClient.connect(broker.bootstrap) as wire:
        while True:
            req = DTP(topics=[DTP.TopicRequest(name=n) for n in [*names, f"{prefix}-missing"]],
                      response_partition_limit=2, cursor=cursor)
            resp = wire.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, req)
            pages.append([(t.name, t.error_code, [p.partition_index for p in t.partitions]) for t in resp.topics])
            if resp.next_cursor is None:
                break
            cursor = DTP.Cursor(topic_name=resp.next_cursor.topic_name, partition_index=resp.next_cursor.partition_index)
    assert pages == [
        [(f"{prefix}-a", 0, [0, 1])],
        [(f"{prefix}-a", 0, [2]), (f"{prefix}-b", 0, [0])],
        [(f"{prefix}-b", 0, [1]), (f"{prefix}-missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])],
    ]


def test_describe_producers(broker: BrokerProcess) -> None:
    topic = f"dp-{uuid.uuid4().hex[:6]}"
    make_topics(broker.bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for _ in range(5):
        producer.produce(topic, value=b"x", partition=0)
        producer.flush(30)
    req = DP(topics=[DP.TopicRequest(name=topic, partition_indexes=[0, 9])])
    with WireClient.connect(broker.bootstrap) as wire:
        [t] = wire.request(ApiKey.DESCRIBE_PRODUCERS, 0, req).topics
    known, missing = t.partitions
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    [state] = known.active_producers
    assert known.error_code == ErrorCode.NONE and state.producer_id >= 0 and state.last_sequence == 4
    assert state.last_timestamp > 0
