"""The bundled share consumer against the real broker process."""

from __future__ import annotations

import time

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
from shoal.client.errors import ClientClosedError, IllegalStateError

from .broker_process import BrokerProcess

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
