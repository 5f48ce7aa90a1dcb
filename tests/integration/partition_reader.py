"""Read one partition from its start to its end with a plain assigned confluent-kafka Consumer."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from .names import unique_name

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


def read_partition(bootstrap: str, topic: str, isolation: str = "read_uncommitted", partition: int = 0) -> list[Record]:
    """Every record up to the end the consumer sees (the last stable offset for read_committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("unused"),
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        out: list[Record] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
        raise AssertionError(f"read of {topic} did not reach its end")
    finally:
        consumer.close()
