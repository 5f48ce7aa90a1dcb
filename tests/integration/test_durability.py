"""Crash safety: what a producer saw acknowledged with acks=all survives SIGKILL, and a damaged log tail
(torn write, garbage, bit rot) is cut at restart without losing the records before it."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.protocol.record_batch import iter_batches

from .broker_process import BrokerProcess

PARTITIONS = 3
BASE_TS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class Acked:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(timeout=30)


def topic_ids(bootstrap: str, names: Iterable[str]) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_topics(TopicCollection(list(names)))
    return {name: str(fut.result(timeout=30).topic_id) for name, fut in futures.items()}


def consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    c = consumer(bootstrap)
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)}
    finally:
        c.close()


def read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[tuple[int, int], Acked]:
    """Every record below each partition's end offset, keyed by (partition, offset)."""
    c = consumer(bootstrap)
    out: dict[tuple[int, int], Acked] = {}
    try:
        c.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        total = sum(ends.values())
        deadline = time.monotonic() + 60
        while len(out) < total and time.monotonic() < deadline:
            for msg in c.consume(10_000, 1.0):
                assert msg.error() is None, msg.error()
                rec = Acked(
                    msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1]
                )
                out[(rec.partition, rec.offset)] = rec
    finally:
        c.close()
    return out


class AckingProducer:
    """A confluent producer with acks=all that remembers exactly what the broker acknowledged, and where."""

    def __init__(self, bootstrap: str, topic: str, tag: str, **extra: Any):
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 1000,
            "reconnect.backoff.max.ms": 500,
            "message.timeout.ms": 60_000,
        }
        conf.update(extra)
        self.producer = Producer(conf)
        self.topic = topic
        self.tag = tag
        self.sent = 0
        self.acked: list[Acked] = []
        self.failed = 0

    def send(self, count: int) -> None:
        for _ in range(count):
            i = self.sent
            self.sent += 1
            key = f"{self.tag}-{i}".encode()
            value = (f"{self.tag}:{i}:" * (1 + i % 5)).encode()
            headers = (("producer", self.tag.encode()), ("seq", str(i).encode()))
            ts = BASE_TS + i

            # librdkafka's delivery reports do not carry headers: remember what was sent.
            def report(
                err: Any, msg: Any, key: bytes = key, value: bytes = value, headers: Any = headers, ts: int = ts
            ) -> None:
                if err is not None:
                    self.failed += 1
                    return
                self.acked.append(Acked(msg.partition(), msg.offset(), key, value, headers, ts))

            while True:
                try:
                    self.producer.produce(
                        self.topic, key=key, value=value, headers=list(headers), timestamp=ts,
                        partition=i % PARTITIONS, on_delivery=report,
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.producer.poll(0)

    def flush(self, timeout: float = 60) -> int:
        return int(self.producer.flush(timeout))


def test_acked_records_survive_sigkill(fresh_broker: BrokerProcess) -> None:
    broker = fresh_broker.start()
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    ids_before = topic_ids(broker.bootstrap, [topic, "__consumer_offsets"])

    first = AckingProducer(broker.bootstrap, topic, "first")
    second = AckingProducer(broker.bootstrap, topic, "second")
    stop_second = threading.Event()

    def keep_producing() -> None:
        # Still producing while the broker is killed: whatever it saw acknowledged must survive too.
        while not stop_second.is_set():
            second.send(200)
            time.sleep(0.01)

    thread = threading.Thread(target=keep_producing)
    thread.start()
    try:
        first.send(6000)
        assert first.flush() == 0
        assert first.failed == 0 and len(first.acked) == 6000
        while len(second.acked) < 1000:  # make sure the second producer has had acknowledgements too
            second.producer.poll(0.1)
        broker.kill()
    finally:
        stop_second.set()
        thread.join()

    broker.start()
    # The second producer reconnects and delivers (or fails) what was in flight at the kill.
    assert second.flush() == 0
    assert topic_ids(broker.bootstrap, [topic, "__consumer_offsets"]) == ids_before

    marks = watermarks(broker.bootstrap, topic, PARTITIONS)
    assert all(low == 0 for low, _high in marks.values())
    stored = read_all(broker.bootstrap, topic, {p: high for p, (_low, high) in marks.items()})
    acked = first.acked + second.acked
    assert len({(a.partition, a.offset) for a in acked}) == len(acked), "two acks for the same offset"
    for rec in acked:
        assert stored.get((rec.partition, rec.offset)) == rec
    # Offsets within each partition are dense from 0 (no holes left by the crash).
    for p, (_low, high) in marks.items():
        assert sorted(o for (q, o) in stored if q == p) == list(range(high))

    # New writes continue right after the old end.
    after = AckingProducer(broker.bootstrap, topic, "after")
    after.send(PARTITIONS)
    assert after.flush() == 0
    assert sorted((a.partition, a.offset) for a in after.acked) == [(p, marks[p][1]) for p in range(PARTITIONS)]


def _segment(data_dir: Path, topic: str, partition: int) -> Path:
    logs = sorted((data_dir / f"{topic}-{partition}").glob("*.log"))
    assert logs, "no segment file"
    return logs[-1]


def _batch_bounds(path: Path) -> list[tuple[int, int, int]]:
    """(file position, size, record count) of each batch in a segment file."""
    buf = bytearray(path.read_bytes())
    return [(pos, header.size, header.records_count) for pos, header in iter_batches(buf)]


def test_damaged_log_tail_is_cut_at_restart(fresh_broker: BrokerProcess) -> None:
    broker = fresh_broker.start()
    topic = f"torn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = AckingProducer(broker.bootstrap, topic, "torn", **{"linger.ms": 0, "batch.num.messages": 10})
    # Several batches per partition: produce in rounds, each flushed on its own.
    for _ in range(5):
        producer.send(30)
        assert producer.flush() == 0
    assert producer.failed == 0
    assert broker.stop() == 0

    per_partition = {p: sorted((a for a in producer.acked if a.partition == p), key=lambda a: a.offset) for p in range(3)}
    kept: dict[int, int] = {}
    # Partition 0: the last batch torn in the middle, as a crash during write leaves it.
    seg = _segment(broker.data_dir, topic, 0)
    bounds = _batch_bounds(seg)
    pos, size, _count = bounds[-1]
    os.truncate(seg, pos + size // 2)
    kept[0] = sum(c for _p, _s, c in bounds[:-1])
    # Partition 1: garbage after the last whole batch.
    seg = _segment(broker.data_dir, topic, 1)
    bounds = _batch_bounds(seg)
    with open(seg, "ab") as fh:
        fh.write(os.urandom(37))
    kept[1] = sum(c for _p, _s, c in bounds)
    # Partition 2: a flipped byte inside the second-to-last batch's records (CRC no longer matches).
    seg = _segment(broker.data_dir, topic, 2)
    bounds = _batch_bounds(seg)
    pos, size, _count = bounds[-2]
    with open(seg, "r+b") as fh:
        fh.seek(pos + size - 3)
        byte = fh.read(1)
        fh.seek(pos + size - 3)
        fh.write(bytes([byte[0] ^ 0xFF]))
    kept[2] = sum(c for _p, _s, c in bounds[:-2])
    assert 0 < kept[0] < len(per_partition[0])
    assert kept[1] == len(per_partition[1])
    assert 0 < kept[2] < len(per_partition[2])

    broker.start()
    assert broker.alive()
    marks = watermarks(broker.bootstrap, topic, PARTITIONS)
    assert marks == {p: (0, kept[p]) for p in range(PARTITIONS)}
    stored = read_all(broker.bootstrap, topic, kept)
    for p in range(PARTITIONS):
        assert [stored[(p, o)] for o in range(kept[p])] == per_partition[p][: kept[p]]

    after = AckingProducer(broker.bootstrap, topic, "after")
    after.send(PARTITIONS)
    assert after.flush() == 0
    assert sorted((a.partition, a.offset) for a in after.acked) == [(p, kept[p]) for p in range(PARTITIONS)]
    # The truncated partition reads cleanly through the new record.
    stored = read_all(broker.bootstrap, topic, {0: kept[0] + 1})
    assert stored[(0, kept[0])].key == b"after-0"
