"""Log compaction of transactional data with real clients: an aborted transaction's record never
replaces a committed value, nor makes the same producer's later committed tombstone look aborted, on a
user topic (read by confluent-kafka read_committed and read_uncommitted consumers) and on `__consumer_offsets` (an aborted TxnOffsetCommit leaves the group's
committed offset in place after compaction and a restart)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .broker_process import BrokerProcess
from .names import unique_name
from .partition_reader import read_partition

CLEANER = ["log.cleaner.backoff.ms=100"]
_WAIT_S = float(os.environ.get("SHOAL_TEST_WAIT_S", "120"))


def _wait_for(check: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + _WAIT_S
    problem = check()
    while problem is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        problem = check()
    assert problem is None, problem


def _produce_plain(bootstrap: str, topic: str, items: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 2048})
    for key, value in items:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(60) == 0


def _filler(round_: int) -> list[tuple[bytes, bytes]]:
    # The same keys each round, more than a segment's worth: rounds supersede each other, and the
    # records before them leave the active segment.
    return [(b"filler-%d" % i, b"round-%d-" % round_ + b"x" * 40) for i in range(400)]


def test_an_aborted_transaction_never_erases_a_committed_value_of_its_key(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides=CLEANER).start()
    try:
        bootstrap = proc.bootstrap
        topic = unique_name("txn-compacted")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={
            "cleanup.policy": "compact", "internal.segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "1000"})])[topic].result(30)
        _produce_plain(bootstrap, topic, [(b"k", b"v1")])
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("tx")})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=b"v2", partition=0)
        producer.flush(30)
        producer.abort_transaction(30)
        _produce_plain(bootstrap, topic, _filler(0) + _filler(1))

        def compacted() -> str | None:
            records = read_partition(bootstrap, topic, "read_uncommitted")
            fillers = [key for _, key, _ in records if key is not None and key.startswith(b"filler-")]
            if len(fillers) == len(set(fillers)) * 2:
                return "not compacted yet"
            values = [value for _, key, value in records if key == b"k"]
            # The aborted record is gone from the log; the committed one stays.
            return None if values == [b"v1"] else f"key k holds {values}"

        _wait_for(compacted)
        committed = [(key, value) for _, key, value in read_partition(bootstrap, topic, "read_committed") if key == b"k"]
        assert committed == [(b"k", b"v1")]

        # The same producer, whose aborted transaction now lies below the cleaner's checkpoint, commits a
        # tombstone of k: it supersedes every earlier value of k, and once delete.retention.ms has passed
        # a clean removes it too, leaving nothing of k.
        _produce_plain(bootstrap, topic, [(b"k", b"v3")])
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=None, partition=0)
        producer.commit_transaction(30)
        _produce_plain(bootstrap, topic, _filler(2) + _filler(3))

        def deleted() -> str | None:
            values = [value for _, key, value in read_partition(bootstrap, topic, "read_uncommitted") if key == b"k"]
            return None if values == [] else f"key k holds {values}"

        _wait_for(deleted)
        assert [key for _, key, _ in read_partition(bootstrap, topic, "read_committed") if key == b"k"] == []
        # And so after a restart, which rebuilds the aborted transactions from the log.
        proc.stop()
        proc.start()
        assert [key for _, key, _ in read_partition(proc.bootstrap, topic, "read_committed") if key == b"k"] == []
    finally:
        proc.stop()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def test_an_aborted_txn_offset_commit_leaves_the_committed_offset_after_compaction(tmp_path: Path) -> None:
    overrides = [*CLEANER, "offsets.topic.num.partitions=1", "offsets.topic.segment.bytes=1024",
                 "log.cleaner.min.cleanable.ratio=0.01", "group.initial.rebalance.delay.ms=0"]
    proc = BrokerProcess(tmp_path / "data", overrides=overrides).start()
    try:
        bootstrap = proc.bootstrap
        topic = unique_name("in")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        group = unique_name("g")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        metadata = consumer.consumer_group_metadata()
        consumer.close()
        assert _committed(bootstrap, group, topic) == 5

        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("tx")})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 9)], metadata, 30)
        producer.abort_transaction(30)
        assert _committed(bootstrap, group, topic) == 5

        # Other groups' commits roll __consumer_offsets' segments and rewrite their own keys.
        other = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("other"),
                          "enable.auto.commit": False})
        for i in range(60):
            other.commit(offsets=[TopicPartition(topic, 0, i)], asynchronous=False)
        other.close()

        def cleaned() -> str | None:
            lines = [line for line in proc.log_text().splitlines()
                     if "log.cleaned" in line and "__consumer_offsets-0" in line]
            return None if lines else "__consumer_offsets-0 not cleaned yet"

        _wait_for(cleaned)
        assert _committed(bootstrap, group, topic) == 5
        # The coordinator replays the compacted log at start-up.
        proc.stop()
        proc.start()
        assert _committed(proc.bootstrap, group, topic) == 5
    finally:
        proc.stop()
