"""Small helpers around confluent-kafka for the share-group tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None, *,
                 replication_factor: int = 1) -> None:
    """replication_factor=-1 takes the broker's default (a cluster whose min.insync.replicas is above 1
    refuses acks=all writes to a topic with one replica)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})]).values():
        future.result(30)


def set_group_config(bootstrap: str, group: str, *, validate_only: bool = False, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(key.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        for key, value in configs.items()
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource], validate_only=validate_only).values():
        future.result(30)


def group_configs(bootstrap: str, group: str) -> dict[str, tuple[str, bool]]:
    """DescribeConfigs of a GROUP resource: each key's value and whether the group set it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    return {name: (entry.value, not entry.is_default) for name, entry in future.result(30).items()}


def produce(bootstrap: str, topic: str, count: int, *, partitions: int = 1, prefix: str = "v",
            extra: dict[str, Any] | None = None) -> list[tuple[int, int, bytes]]:
    """Produce `count` records round-robin over partitions; returns (partition, offset, value) of each."""
    delivered: list[tuple[int, int, bytes]] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.partition(), msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **(extra or {})})
    for i in range(count):
        producer.produce(topic, value=f"{prefix}-{i}".encode(), key=str(i).encode(), partition=i % partitions,
                         on_delivery=on_delivery)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors
    return delivered


def share_consumer(bootstrap: str, group: str, topics: list[str], **extra: Any) -> ShareConsumer:
    config = {"bootstrap.servers": bootstrap, "group.id": group, **{k.replace("_", "."): v for k, v in extra.items()}}
    consumer = ShareConsumer(config)
    consumer.subscribe(topics)
    return consumer


@dataclass
class Consumed:
    records: list[tuple[int, int, bytes, int]] = field(default_factory=list)  # partition, offset, value, delivery
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, msg: Any) -> None:
        with self.lock:
            self.records.append((msg.partition(), msg.offset(), msg.value(), msg.delivery_count()))

    def __len__(self) -> int:
        with self.lock:
            return len(self.records)


def poll_until(consumer: ShareConsumer, done: Callable[[], bool], sink: Consumed, timeout: float,
               on_message: Callable[[Any], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        for msg in consumer.poll(0.5):
            if msg.error():
                continue
            sink.add(msg)
            if on_message is not None:
                on_message(msg)


def reject_confirmed(consumer: ShareConsumer, count: int, timeout: float,
                     after_batch: Callable[[set[int]], None] | None = None) -> set[int]:
    """REJECT every record `consumer` gets, committing each poll's acknowledgements, until `count`
    rejections are confirmed or `timeout` passes; the offsets whose rejection the broker confirmed.
    `after_batch` sees the confirmed offsets after each commit (to crash a broker part-way)."""
    rejected: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(rejected) < count and time.monotonic() < deadline:
        msgs = [m for m in consumer.poll(0.5) if not m.error()]
        for m in msgs:
            consumer.acknowledge(m, AcknowledgeType.REJECT)
        if not msgs:
            continue
        try:
            results = consumer.commit_sync(30)
        except KafkaException:
            continue
        if all(err is None for err in results.values()):
            rejected.update(m.offset() for m in msgs)
        if after_batch is not None:
            after_batch(rejected)
    return rejected


def consume_and_ack(bootstrap: str, group: str, topics: list[str], accept_below: int, want: int,
                    timeout: float = 60) -> list[tuple[str, int, int]]:
    """Explicit acknowledgement: ACCEPT offsets below `accept_below`, RELEASE the rest, committing each poll,
    until `want` distinct (topic, offset) came or `timeout` passed; (topic, offset, delivery count) of every
    delivery."""
    consumer = share_consumer(bootstrap, group, topics, share_acknowledgement_mode="explicit")
    seen: list[tuple[str, int, int]] = []
    try:
        deadline = time.monotonic() + timeout
        while len({(t, o) for t, o, _ in seen}) < want and time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(0.5) if not m.error()]
            for m in msgs:
                topic, offset = m.topic(), m.offset()
                assert topic is not None and offset is not None
                seen.append((topic, offset, m.delivery_count()))
                consumer.acknowledge(m, AcknowledgeType.ACCEPT if offset < accept_below else AcknowledgeType.RELEASE)
            if msgs:
                assert all(err is None for err in consumer.commit_sync(30).values())
    finally:
        consumer.close()
    return seen
