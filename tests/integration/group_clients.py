"""The same classic-group consumer driven through confluent-kafka, kafka-python and aiokafka.

Each adapter offers what the group tests need: subscribe, poll a batch of (partition, offset, value),
commit what was polled synchronously, the current assignment, and close (which leaves the group).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Polled = list[tuple[int, int, bytes]]


class GroupConsumer(Protocol):
    def poll(self) -> Polled: ...
    def commit(self) -> None: ...
    def assignment(self) -> set[int]: ...
    def committed(self, partitions: int) -> dict[int, int]: ...
    def close(self) -> None: ...


SESSION_MS = 6000
HEARTBEAT_MS = 500


class ConfluentGroupConsumer:
    def __init__(self, bootstrap: str, group: str, topic: str, instance_id: str | None = None):
        from confluent_kafka import Consumer

        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
        }
        if instance_id is not None:
            config["group.instance.id"] = instance_id
        self.topic = topic
        self.consumer = Consumer(config)
        self.events: list[tuple[str, frozenset[int]]] = []
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _c, ps: self.events.append(("assign", frozenset(p.partition for p in ps))),
            on_revoke=lambda _c, ps: self.events.append(("revoke", frozenset(p.partition for p in ps))),
        )

    def poll(self) -> Polled:
        out = []
        for msg in self.consumer.consume(num_messages=200, timeout=0.2):
            if msg.error() is None:
                out.append((msg.partition(), msg.offset(), msg.value()))
        return out

    def commit(self) -> None:
        try:
            self.consumer.commit(asynchronous=False)
        except Exception as exc:  # nothing consumed since the last commit
            if "NO_OFFSET" not in str(exc):
                raise

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def committed(self, partitions: int) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        got = self.consumer.committed([TopicPartition(self.topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}

    def close(self) -> None:
        self.consumer.close()


class KafkaPythonGroupConsumer:
    def __init__(self, bootstrap: str, group: str, topic: str, instance_id: str | None = None):
        from kafka import KafkaConsumer

        self.topic = topic
        self.consumer = KafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            **({"group_instance_id": instance_id} if instance_id else {}),
        )
        # Know the topic's partitions before the first poll joins the group. kafka-python 3.0.12 otherwise
        # joins before its first metadata refresh, assigns nothing as leader ("No partition metadata for
        # topic"), and rejoins when the metadata arrives; a rejoin started that way is abandoned if the
        # poll's timeout passes before its SyncGroup is answered (need_rejoin() turns False once the
        # assignment is computed, so the in-flight join is never completed): the member stops
        # heartbeating, its session expires, and it never consumes again.
        self.consumer.partitions_for_topic(topic)

    def poll(self) -> Polled:
        records = self.consumer.poll(timeout_ms=200, max_records=200)
        return [(r.partition, r.offset, r.value) for batch in records.values() for r in batch]

    def commit(self) -> None:
        self.consumer.commit()

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def committed(self, partitions: int) -> dict[int, int]:
        from kafka import TopicPartition

        out = {}
        for p in range(partitions):
            value = self.consumer.committed(TopicPartition(self.topic, p))
            out[p] = -1001 if value is None else value
        return out

    def close(self) -> None:
        self.consumer.close()


class _LoopThread:
    """One asyncio loop in a daemon thread, so aiokafka's background tasks run between calls."""

    _instance: _LoopThread | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    @classmethod
    def get(cls) -> _LoopThread:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)


class AiokafkaGroupConsumer:
    def __init__(self, bootstrap: str, group: str, topic: str, instance_id: str | None = None):
        from aiokafka import AIOKafkaConsumer

        self.topic = topic
        self.loop = _LoopThread.get()

        async def make() -> Any:
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                **({"group_instance_id": instance_id} if instance_id else {}),
            )
            await consumer.start()
            return consumer

        self.consumer = self.loop.run(make())

    def poll(self) -> Polled:
        batches = self.loop.run(self.consumer.getmany(timeout_ms=200, max_records=200))
        return [(r.partition, r.offset, r.value) for batch in batches.values() for r in batch]

    def commit(self) -> None:
        self.loop.run(self.consumer.commit())

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def committed(self, partitions: int) -> dict[int, int]:
        from aiokafka import TopicPartition

        out = {}
        for p in range(partitions):
            value = self.loop.run(self.consumer.committed(TopicPartition(self.topic, p)))
            out[p] = -1001 if value is None else value
        return out

    def close(self) -> None:
        self.loop.run(self.consumer.stop())


CLIENTS: dict[str, type[Any]] = {
    "confluent": ConfluentGroupConsumer,
    "kafka-python": KafkaPythonGroupConsumer,
    "aiokafka": AiokafkaGroupConsumer,
}
