"""Log compaction with real clients: the latest value of every key stays at its offset, deleted keys go,
a kill -9 in the middle of cleaning leaves a consistent log, and `__consumer_offsets` is compacted too."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT
from .share_clients import Consumed, poll_until, share_consumer

KEYS = 1000
DELETED = range(0, 100)  # keys that get a tombstone
CLEANER = ["log.cleaner.backoff.ms=100"]
TOPIC_CONFIGS = {"cleanup.policy": "compact", "internal.segment.bytes": "16384", "delete.retention.ms": "1000",
                 "min.cleanable.dirty.ratio": "0.1"}
_WAIT_S = float(os.environ.get("SHOAL_TEST_WAIT_S", "120"))


def _create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=configs)]).values():
        future.result(30)


def _produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes | None]]) -> dict[tuple[bytes, bytes | None], int]:
    """Produce in small batches; returns the offset of each (key, value)."""
    offsets: dict[tuple[bytes, bytes | None], int] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets[(msg.key(), msg.value())] = msg.offset()

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "batch.size": 2048})
    for i, (key, value) in enumerate(items):
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        if i % 200 == 199:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors
    return offsets


def _read_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        out: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and (not out or out[-1][0] >= high - 1):
                    return out
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
            if msg.offset() >= high - 1:
                return out
        raise AssertionError(f"read of {topic} did not reach {high}")
    finally:
        consumer.close()


def _wait_for(check: Callable[[], str | None]) -> None:
    """Poll `check` (None = done, else what is still wrong) until it passes; fail with its last answer."""
    deadline = time.monotonic() + _WAIT_S
    problem = check()
    while problem is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        problem = check()
    assert problem is None, problem


def _latest(offsets: dict[tuple[bytes, bytes | None], int]) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for (key, value), offset in sorted(offsets.items(), key=lambda item: item[1]):
        latest[key] = (offset, value)
    return latest


def _compacted(bootstrap: str, topic: str, latest: dict[bytes, tuple[int, bytes | None]]) -> str | None:
    """None once the topic holds exactly the latest live record of every key, at its original offset."""
    records = _read_all(bootstrap, topic)
    offsets = [o for o, _, _ in records]
    if offsets != sorted(set(offsets)):
        return "offsets out of order"
    seen: dict[bytes, list[tuple[int, bytes | None]]] = {}
    for offset, key, value in records:
        assert key is not None
        seen.setdefault(key, []).append((offset, value))
    for key, (offset, value) in latest.items():
        got = seen.get(key, [])
        if value is None and got:
            return f"deleted key {key!r} still has {len(got)} records"
        if value is not None and got != [(offset, value)]:
            return f"key {key!r}: {got[:4]} instead of {(offset, value)}"
    return None


def _keyed(round_: int, keys: range) -> list[tuple[bytes, bytes | None]]:
    return [(b"key-%d" % k, b"value-%d-%d" % (round_, k)) for k in keys]


def _filler(tag: str) -> list[tuple[bytes, bytes | None]]:
    # Unique keys that fill more than a segment, so the records before them leave the active segment.
    return [(b"filler-%s-%d" % (tag.encode(), i), b"x" * 40) for i in range(600)]


def test_compacted_topic_keeps_latest_values_drops_deleted_keys_and_survives_kill(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides=CLEANER).start()
    try:
        topic = "compacted"
        _create(proc.bootstrap, topic, TOPIC_CONFIGS)
        items = [*_keyed(0, range(KEYS)), *_keyed(1, range(KEYS)), *_keyed(2, range(KEYS))]
        items += [(b"key-%d" % k, None) for k in DELETED]
        offsets = _produce(proc.bootstrap, topic, items + _filler("a"))
        latest = _latest(offsets)
        _wait_for(lambda: _compacted(proc.bootstrap, topic, latest))

        # A record without a key is refused as Kafka refuses it on a compacted topic.
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": proc.bootstrap, "acks": "all"})
        producer.produce(topic, value=b"no key", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(30)
        assert errors and errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD

        # Another round makes the log dirty; kill -9 as soon as the cleaner starts on it.
        cleanings = proc.log_text().count("log.cleaning")
        offsets.update(_produce(proc.bootstrap, topic, _keyed(3, range(100, KEYS)) + _filler("b")))
        latest = _latest(offsets)
        deadline = time.monotonic() + _WAIT_S
        while proc.log_text().count("log.cleaning") == cleanings and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.kill()
        proc.start()
        # Whatever the cleaner had done, the latest record of every live key is there at its offset.
        records = _read_all(proc.bootstrap, topic)
        assert [o for o, _, _ in records] == sorted({o for o, _, _ in records})
        last = {key: (offset, value) for offset, key, value in records if key is not None}
        assert {k: v for k, v in latest.items() if v[1] is not None} == {
            k: v for k, v in last.items() if k in latest and latest[k][1] is not None}
        _wait_for(lambda: _compacted(proc.bootstrap, topic, latest))
    finally:
        proc.stop()


def _share_consume_one(bootstrap: str, topic: str) -> bool:
    """A share consumer joins group "sg", gets a record and leaves; the join and the leave write records
    under the same keys of `__consumer_offsets`."""
    consumer = share_consumer(bootstrap, "sg", [topic])
    producer = Producer({"bootstrap.servers": bootstrap})
    sink = Consumed()
    try:
        # Records produced before the share partition starts are not delivered: keep producing.
        deadline = time.monotonic() + 30
        while not len(sink) and time.monotonic() < deadline:
            producer.produce(topic, key=b"k", value=b"v")
            producer.flush(10)
            poll_until(consumer, lambda: len(sink) > 0, sink, 1)
    finally:
        consumer.close()
    return len(sink) > 0


def test_consumer_offsets_is_compacted(tmp_path: Path) -> None:
    overrides = [*CLEANER, "offsets.topic.num.partitions=1", "offsets.topic.segment.bytes=1024",
                 "log.cleaner.min.cleanable.ratio=0.1", *FAST_HEARTBEAT]
    proc = BrokerProcess(tmp_path / "data", overrides=overrides).start()
    try:
        topic = "shared"
        _create(proc.bootstrap, topic, {})
        # Members joining and leaving rewrite the same group keys on __consumer_offsets.
        for _ in range(3):
            _share_consume_one(proc.bootstrap, topic)

        def gaps() -> str | None:
            if "__consumer_offsets-0" not in "".join(
                line for line in proc.log_text().splitlines() if "log.cleaned" in line
            ):
                return "__consumer_offsets-0 not cleaned yet"
            consumer = Consumer({"bootstrap.servers": proc.bootstrap, "group.id": "unused"})
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition("__consumer_offsets", 0), timeout=30)
            finally:
                consumer.close()
            count = len(_read_all(proc.bootstrap, "__consumer_offsets"))
            return None if count < high - low else f"{count} records for offsets {low}..{high}"

        _wait_for(gaps)
        # The group coordinator replays the compacted log at start-up, and the group still works.
        proc.stop()
        proc.start()
        assert _share_consume_one(proc.bootstrap, topic)
    finally:
        proc.stop()
