"""The bundled share consumer against the real broker process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shoal.client import (
    RESOURCE_GROUP,
    AcknowledgeType,
    Admin,
    NewTopic,
    Producer,
    ShareConsumer,
    ShareRecord,
)
from shoal.client.consumer.share_consumer import AcquiredRange, new_member_id
from shoal.client.errors import ClientClosedError, IllegalStateError
from shoal.protocol.record_batch import HEADER_SIZE

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT

POLL_DEADLINE_S = 30.0
KIP_METRICS = {
    "last-poll-seconds-ago",
    "heartbeat-total",
    "heartbeat-rate",
    "heartbeat-response-time-max",
    "fetch-total",
    "fetch-latency-avg",
    "fetch-latency-max",
    "records-fetched-total",
    "acknowledgements-send-total",
    "acknowledgements-error-total",
}


def _setup(bootstrap: str, topic: str, group: str, count: int, *, partitions: int = 1, **group_configs: str) -> None:
    with Admin(bootstrap) as admin:
        result = admin.create_topics([NewTopic(topic, partitions)])
        assert result[topic].error is None
        configs = {"share.auto.offset.reset": "earliest", **{k.replace("_", "."): v for k, v in group_configs.items()}}
        assert admin.incremental_alter_configs(RESOURCE_GROUP, group, configs) is None
    _produce(bootstrap, topic, [f"v{i}".encode() for i in range(count)], partitions)


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    with Producer(bootstrap) as producer:
        futures = [producer.send(topic, v, partition=i % partitions) for i, v in enumerate(values)]
        producer.flush(30)
        for f in futures:
            f.result(0)


@pytest.fixture(scope="module")
def short_lock_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker that lets a group set acquisition locks of a few seconds (the default floor is 15 s)."""
    base = tmp_path_factory.mktemp("short-lock-broker")
    proc = BrokerProcess(base / "data", overrides=[*FAST_HEARTBEAT, "group.share.min.record.lock.duration.ms=1000"])
    yield proc.start()
    proc.stop()


def _produce_one_batch(bootstrap: str, topic: str, count: int) -> None:
    """`count` records in a single log batch: a batch-optimised fetch acquires all of it at once."""
    with Producer(bootstrap, linger_ms=60_000) as producer:
        futures = [producer.send(topic, f"v{i}".encode(), partition=0) for i in range(count)]
        producer.flush(30)
        for f in futures:
            f.result(0)


def _poll_until(consumer: ShareConsumer, want: int, *, ack: AcknowledgeType | None = None) -> list[ShareRecord]:
    got: list[ShareRecord] = []
    deadline = time.monotonic() + POLL_DEADLINE_S
    while len(got) < want and time.monotonic() < deadline:
        for record in consumer.poll(0.5):
            got.append(record)
            if ack is not None:
                consumer.acknowledge(record, ack)
    return got


def _poll_until_value(consumer: ShareConsumer, value: bytes, *, accept: bool) -> list[ShareRecord]:
    """Everything delivered until (and including) the record with `value`."""
    got: list[ShareRecord] = []
    deadline = time.monotonic() + POLL_DEADLINE_S
    while time.monotonic() < deadline:
        batch = consumer.poll(0.5)
        for record in batch:
            got.append(record)
            if accept:
                consumer.acknowledge(record, AcknowledgeType.ACCEPT)
        if any(r.value == value for r in batch):
            return got
    raise AssertionError(f"{value!r} never arrived; got {[(r.offset, r.value) for r in got]}")


def test_implicit_mode_accepts_previous_poll_and_reports_metrics(broker: BrokerProcess) -> None:
    topic, group = "cl-implicit", "cl-implicit-g"
    _setup(broker.bootstrap, topic, group, 20, partitions=2)
    with ShareConsumer(broker.bootstrap, group) as consumer:
        consumer.subscribe([topic])
        got = _poll_until(consumer, 20)
        assert sorted(r.value for r in got) == sorted(f"v{i}".encode() for i in range(20))
        assert all(r.delivery_count == 1 and r.topic == topic for r in got)
        assert {r.partition for r in got} == {0, 1}
        # The next commit accepts what the last poll delivered.
        results = consumer.commit_sync(30)
        assert results and all(err is None for err in results.values())
        metrics = consumer.metrics()
        assert KIP_METRICS <= set(metrics)
        assert metrics["records-fetched-total"] >= 20
        assert metrics["acknowledgements-send-total"] >= 20
        assert metrics["acknowledgements-error-total"] == 0
        assert metrics["heartbeat-total"] >= 1 and metrics["fetch-total"] >= 1
    # Accepted records never come back to the group: a later member sees only new ones.
    _produce(broker.bootstrap, topic, [b"sentinel"], 1)
    with ShareConsumer(broker.bootstrap, group) as consumer:
        consumer.subscribe([topic])
        got = _poll_until_value(consumer, b"sentinel", accept=False)
        assert [r.value for r in got] == [b"sentinel"]
    with pytest.raises(ClientClosedError):
        consumer.poll(0)


def test_explicit_accept_release_reject(broker: BrokerProcess) -> None:
    topic, group = "cl-explicit", "cl-explicit-g"
    _setup(broker.bootstrap, topic, group, 10)
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        got = _poll_until(consumer, 10)
        assert [r.offset for r in sorted(got, key=lambda r: r.offset)] == list(range(10))
        for record in got:
            kind = {0: AcknowledgeType.RELEASE, 1: AcknowledgeType.REJECT}.get(record.offset, AcknowledgeType.ACCEPT)
            consumer.acknowledge(record, kind)
        with pytest.raises(IllegalStateError):
            consumer.acknowledge(got[0], AcknowledgeType.ACCEPT)  # already settled
        assert consumer.commit_sync(30) == {(topic, 0): None}
        assert consumer.commit_sync(30) == {}  # nothing pending any more
        # The released record comes back (second delivery); the rejected one never does.
        _produce(broker.bootstrap, topic, [b"sentinel"])
        again = _poll_until_value(consumer, b"sentinel", accept=True)
        assert [(r.offset, r.delivery_count) for r in again if r.value != b"sentinel"] == [(0, 2)]
        assert consumer.commit_sync(30) == {(topic, 0): None}


def test_acknowledging_an_unknown_record_fails_and_implicit_mode_refuses_explicit_acks(broker: BrokerProcess) -> None:
    topic, group = "cl-misuse", "cl-misuse-g"
    _setup(broker.bootstrap, topic, group, 1)
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        with pytest.raises(IllegalStateError):
            consumer.acknowledge_offset(topic, 0, 12345, AcknowledgeType.ACCEPT)
        got = _poll_until(consumer, 1, ack=AcknowledgeType.ACCEPT)
        assert len(got) == 1
    with ShareConsumer(broker.bootstrap, group) as consumer:
        with pytest.raises(IllegalStateError):
            consumer.acknowledge(got[0])


def test_close_releases_acquired_records_to_another_member(broker: BrokerProcess) -> None:
    topic, group = "cl-close", "cl-close-g"
    # A lock far longer than the poll deadline: only the close can hand the records over in time.
    _setup(broker.bootstrap, topic, group, 5, share_record_lock_duration_ms="60000")
    first = ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit")
    first.subscribe([topic])
    held = _poll_until(first, 5)
    assert len(held) == 5
    first.close()
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as second:
        second.subscribe([topic])
        got = _poll_until(second, 5, ack=AcknowledgeType.ACCEPT)
        assert sorted(r.offset for r in got) == [r.offset for r in sorted(held, key=lambda r: r.offset)]
        assert {r.delivery_count for r in got} == {2}
        assert second.commit_sync(30) == {(topic, 0): None}


def test_commit_async_and_callback_report_results(broker: BrokerProcess) -> None:
    topic, group = "cl-async", "cl-async-g"
    _setup(broker.bootstrap, topic, group, 3)
    seen: list[dict] = []
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.set_acknowledgement_commit_callback(seen.append)
        consumer.subscribe([topic])
        got = _poll_until(consumer, 3, ack=AcknowledgeType.ACCEPT)
        assert len(got) == 3
        assert consumer.commit_async().result(30) == {(topic, 0): None}
    assert {(topic, 0): None} in seen


def test_renew_extends_the_lock_and_the_record_is_settled_later(broker: BrokerProcess) -> None:
    topic, group = "cl-renew", "cl-renew-g"
    _setup(broker.bootstrap, topic, group, 2)
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        got = _poll_until(consumer, 2)
        assert len(got) == 2
        for record in got:
            consumer.acknowledge(record, "renew")  # names work as well as AcknowledgeType members
        assert consumer.commit_sync(30) == {(topic, 0): None}
        # Renewed records are still ours: they can (and must) be settled afterwards.
        for record in got:
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)
        assert consumer.commit_sync(30) == {(topic, 0): None}
        with pytest.raises(IllegalStateError):
            consumer.acknowledge(got[0], AcknowledgeType.REJECT)


def test_poll_max_records_acquires_no_more_than_it_hands_out(broker: BrokerProcess) -> None:
    topic, group = "cl-maxrec", "cl-maxrec-g"
    # A lock far longer than the test: what the first member acquired cannot reach the second one in time.
    _setup(broker.bootstrap, topic, group, 0, share_record_lock_duration_ms="60000")
    _produce_one_batch(broker.bootstrap, topic, 50)
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as first:
        first.subscribe([topic])
        with pytest.raises(ValueError):
            first.poll(0, max_records=0)
        held: list[ShareRecord] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while len(held) < 7 and time.monotonic() < deadline:
            batch = first.poll(0.5, max_records=7 - len(held))
            assert len(batch) <= 7 - len(held)
            # Record-limit acquisition split the 50-record log batch: nothing waits, locked, in the buffer.
            assert first.buffered() == 0
            held.extend(batch)
        assert sorted(r.offset for r in held) == list(range(7))
        # The rest of the log batch was never acquired: another member of the group gets it now.
        with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit") as second:
            second.subscribe([topic])
            rest = _poll_until(second, 43, ack=AcknowledgeType.ACCEPT)
            assert sorted(r.offset for r in rest) == list(range(7, 50))
            assert {r.delivery_count for r in held + rest} == {1}
            assert second.commit_sync(30) == {(topic, 0): None}


def test_buffered_records_whose_lock_ran_out_are_dropped_not_handed_out(short_lock_broker: BrokerProcess) -> None:
    bootstrap = short_lock_broker.bootstrap
    topic, group = "cl-expire", "cl-expire-g"
    _setup(bootstrap, topic, group, 0, share_record_lock_duration_ms="3000")
    _produce_one_batch(bootstrap, topic, 50)
    with ShareConsumer(bootstrap, group, acknowledgement_mode="explicit", max_poll_records=5) as consumer:
        consumer.subscribe([topic])
        first = _poll_until(consumer, 1)
        # Without max_records the fetch acquired the whole log batch; the poll handed out only 5.
        assert sorted(r.offset for r in first) == list(range(5))
        assert consumer.buffered() == 45
        deadline = time.monotonic() + POLL_DEADLINE_S
        while consumer.buffered():
            assert time.monotonic() < deadline, "the buffered records' locks never ran out"
            time.sleep(0.1)
        # The stale copies (delivery 1) are gone; each record comes back only as a new delivery.
        again: list[ShareRecord] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while {r.offset for r in again} != set(range(50)):
            assert time.monotonic() < deadline, f"missing {set(range(50)) - {r.offset for r in again}}"
            again.extend(consumer.poll(0.5))
        assert min(r.delivery_count for r in again) >= 2


def test_rejoining_under_a_known_member_id_takes_over_its_assignment(broker: BrokerProcess) -> None:
    topic, group = "cl-rejoin", "cl-rejoin-g"
    _setup(broker.bootstrap, topic, group, 0, partitions=4)
    with pytest.raises(ValueError):
        ShareConsumer(broker.bootstrap, group, member_id="x" * 37)
    member = new_member_id()
    other = ShareConsumer(broker.bootstrap, group)
    old = ShareConsumer(broker.bootstrap, group, member_id=member)
    new: ShareConsumer | None = None
    try:
        assert old.member_id == member
        other.subscribe([topic])
        old.subscribe([topic])
        everything = {(topic, p) for p in range(4)}
        deadline = time.monotonic() + POLL_DEADLINE_S
        while not (len(old.assignment()) == 2 and old.assignment() | other.assignment() == everything):
            assert time.monotonic() < deadline, (old.assignment(), other.assignment())
            time.sleep(0.1)
        held = old.assignment()
        # Stands in for kill -9: the loop stops, so the member neither leaves nor heartbeats any more.
        old._thread.stop()

        new = ShareConsumer(broker.bootstrap, group, member_id=member)
        new.subscribe([topic])
        deadline = time.monotonic() + POLL_DEADLINE_S
        while not new.assignment():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # Its first assignment is the old incarnation's, and the group did not grow a third member.
        assert new.assignment() == held
        with Admin(broker.bootstrap) as admin:
            members = admin.describe_share_groups([group])[group].members
        assert sorted(m.member_id for m in members) == sorted([member, other.member_id])
        _produce(broker.bootstrap, topic, [f"r{i}".encode() for i in range(8)], 4)
        got = _poll_until(new, 4)
        assert {(r.topic, r.partition) for r in got} == held
    finally:
        for consumer in (new, other):
            if consumer is not None:
                consumer.close()


def test_a_header_only_consumer_receives_batch_headers_and_settles_whole_ranges(broker: BrokerProcess) -> None:
    topic, group = "cl-headers-only", "cl-headers-only-g"
    _setup(broker.bootstrap, topic, group, 0)
    value = b"x" * 500
    with Producer(broker.bootstrap, linger_ms=60_000, batch_size=1 << 20) as producer:
        for _ in range(3):  # three log batches of 200 records each
            futures = [producer.send(topic, value, partition=0) for _ in range(200)]
            producer.flush(30)
            for f in futures:
                f.result(0)
    with ShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit", header_only=True,
                       max_poll_records=10_000) as consumer:
        consumer.subscribe([topic])
        ranges: list[AcquiredRange] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while sum(r.count for r in ranges) < 600 and time.monotonic() < deadline:
            ranges.extend(consumer.poll_ranges(0.5))
        offsets = [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]
        assert sorted(offsets) == list(range(600))
        assert all(r.delivery_count == 1 for r in ranges)
        # Each range is sized from its batches' lengths, though no record crossed the wire: each of the
        # three batches came as its 61-byte header alone.
        assert sum(r.size for r in ranges) > 600 * len(value)
        assert consumer.metrics()["bytes-fetched-total"] == 3 * HEADER_SIZE
        for r in ranges:
            consumer.acknowledge_range(r, AcknowledgeType.ACCEPT)
        results = consumer.commit_sync(30)
        assert results and all(err is None for err in results.values())
    # The ranges were accepted: a later member sees only what is produced after them.
    _produce(broker.bootstrap, topic, [b"sentinel"])
    with ShareConsumer(broker.bootstrap, group) as consumer:
        consumer.subscribe([topic])
        got = _poll_until_value(consumer, b"sentinel", accept=False)
        assert [(r.offset, r.value) for r in got] == [(600, b"sentinel")]
