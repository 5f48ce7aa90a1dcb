"""Share groups end to end with confluent-kafka's real ShareConsumer (librdkafka 2.16) against the broker."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType

from .share_clients import Consumed, create_topic, poll_until, produce, set_group_config, share_consumer


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.external
def test_three_consumers_three_partitions_consume_everything_once(broker):
    topic, group = _name("q3"), _name("g3")
    create_topic(broker.bootstrap, topic, 3)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    produced = produce(broker.bootstrap, topic, 3000, partitions=3)
    sink = Consumed()
    consumers = [share_consumer(broker.bootstrap, group, [topic]) for _ in range(3)]
    threads = [
        threading.Thread(target=poll_until, args=(c, lambda: len(sink) >= 3000, sink, 90)) for c in consumers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in consumers:
        c.close()
    got = [(p, o) for p, o, _v, _d in sink.records]
    assert len(got) == len(set(got)), "a record was delivered twice"
    assert set(got) == {(p, o) for p, o, _v in produced}


@pytest.mark.external
def test_six_consumers_two_partitions_all_receive(broker):
    topic, group = _name("q6"), _name("g6")
    create_topic(broker.bootstrap, topic, 2)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    per_consumer: dict[int, Consumed] = {i: Consumed() for i in range(6)}
    consumers = [share_consumer(broker.bootstrap, group, [topic], max_poll_records=5) for _ in range(6)]
    everyone_got_some = lambda: all(len(s) > 0 for s in per_consumer.values())  # noqa: E731
    stop = threading.Event()

    def keep_producing() -> None:
        # Records keep arriving until every member has had some: members join at different moments,
        # and a fixed backlog could be drained before the last one is assigned a partition.
        while not stop.is_set():
            produce(broker.bootstrap, topic, 40, partitions=2, extra={"batch.num.messages": 5, "linger.ms": 0})
            time.sleep(0.1)

    def run(i: int) -> None:
        poll_until(consumers[i], lambda: everyone_got_some() or stop.is_set(), per_consumer[i], 90,
                   on_message=lambda _m: time.sleep(0.005))

    producer = threading.Thread(target=keep_producing)
    producer.start()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    producer.join()
    for c in consumers:
        c.close()
    assert everyone_got_some(), {i: len(s) for i, s in per_consumer.items()}
    seen = [(p, o) for s in per_consumer.values() for p, o, _v, _d in s.records]
    assert len(seen) == len(set(seen)), "two members were given the same record"


def _poll_one(consumer, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = [m for m in consumer.poll(0.5) if not m.error()]
        if msgs:
            return msgs
    return []


@pytest.mark.external
def test_release_redelivers_with_higher_count_and_reject_never_again(broker):
    topic, group = _name("qr"), _name("gr")
    create_topic(broker.bootstrap, topic, 1)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(broker.bootstrap, topic, 1)
    consumer = share_consumer(broker.bootstrap, group, [topic], share_acknowledgement_mode="explicit")
    try:
        first = _poll_one(consumer)
        assert [(m.offset(), m.delivery_count()) for m in first] == [(0, 1)]
        consumer.acknowledge(first[0], AcknowledgeType.RELEASE)
        assert all(v is None for v in consumer.commit_sync(30).values())
        second = _poll_one(consumer)
        assert [(m.offset(), m.delivery_count()) for m in second] == [(0, 2)]
        consumer.acknowledge(second[0], AcknowledgeType.REJECT)
        assert all(v is None for v in consumer.commit_sync(30).values())
        assert _poll_one(consumer, timeout=4) == []
    finally:
        consumer.close()


@pytest.mark.external
def test_release_past_delivery_limit_archives(broker):
    topic, group = _name("ql"), _name("gl")
    create_topic(broker.bootstrap, topic, 1)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest", share_delivery_count_limit="2")
    produce(broker.bootstrap, topic, 1)
    consumer = share_consumer(broker.bootstrap, group, [topic], share_acknowledgement_mode="explicit")
    try:
        for expected_count in (1, 2):
            msgs = _poll_one(consumer)
            assert [(m.offset(), m.delivery_count()) for m in msgs] == [(0, expected_count)]
            consumer.acknowledge(msgs[0], AcknowledgeType.RELEASE)
            consumer.commit_sync(30)
        assert _poll_one(consumer, timeout=4) == []
    finally:
        consumer.close()


@pytest.mark.external
def test_closed_consumer_records_come_back_at_once(broker):
    topic, group = _name("qc"), _name("gc")
    create_topic(broker.bootstrap, topic, 1)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(broker.bootstrap, topic, 10)
    holder = share_consumer(broker.bootstrap, group, [topic], share_acknowledgement_mode="explicit")
    held = _poll_one(holder)
    assert held
    held_offsets = {m.offset() for m in held}
    holder.close()  # no acknowledgement: close releases what it holds
    other = share_consumer(broker.bootstrap, group, [topic])
    try:
        start = time.monotonic()
        sink = Consumed()
        poll_until(other, lambda: held_offsets <= {o for _p, o, _v, _d in sink.records}, sink, 20)
        assert held_offsets <= {o for _p, o, _v, _d in sink.records}
        # Well inside the 30 s acquisition lock: they came back because of the close, not a lock expiry.
        assert time.monotonic() - start < 25
        redelivered = {o: d for _p, o, _v, d in sink.records if o in held_offsets}
        assert all(d == 2 for d in redelivered.values()), redelivered
    finally:
        other.close()


@pytest.mark.slow
def test_unacknowledged_records_return_after_lock_duration(fresh_broker):
    fresh_broker.overrides += ["group.share.record.lock.duration.ms=2000"]
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = _name("qt"), _name("gt")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 5)
    holder = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    other = share_consumer(bs, group, [topic])
    try:
        held = _poll_one(holder)
        assert held
        held_offsets = {m.offset() for m in held}
        sink = Consumed()
        # The holder stays connected and never acknowledges: only the lock expiry can free its records.
        poll_until(other, lambda: held_offsets <= {o for _p, o, _v, _d in sink.records}, sink, 30)
        got = {o: d for _p, o, _v, d in sink.records}
        assert held_offsets <= set(got)
        assert all(got[o] == 2 for o in held_offsets)
    finally:
        other.close()
        holder.close()


@pytest.mark.slow
def test_broker_kill_during_consumption_loses_nothing_and_redelivers_no_accepted(fresh_broker):
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = _name("qk"), _name("gk")
    create_topic(bs, topic, 2)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produced = produce(bs, topic, 2000, partitions=2)
    expected = {(p, o) for p, o, _v in produced}
    accepted: set[tuple[int, int]] = set()
    delivered_after_accept: list[tuple[int, int]] = []
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit", max_poll_records=100)
    killed = False
    deadline = time.monotonic() + 120
    try:
        while accepted != expected and time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(0.5) if not m.error()]
            for m in msgs:
                if (m.partition(), m.offset()) in accepted:
                    delivered_after_accept.append((m.partition(), m.offset()))
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            if not msgs:
                continue
            if not killed and len(accepted) > 600:
                # Crash with acknowledgements in flight, then come back on the same data directory and port.
                fresh_broker.kill()
                killed = True
                fresh_broker.start()
            try:
                results = consumer.commit_sync(30)
            except Exception:
                continue
            for tp, err in results.items():
                if err is None:
                    accepted.update((tp.partition, m.offset()) for m in msgs if m.partition() == tp.partition)
    finally:
        consumer.close()
    assert killed
    assert delivered_after_accept == []
    assert accepted == expected


_HOLDER_SCRIPT = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    msgs = [m for m in c.poll(0.5) if not m.error()]
    if msgs:
        print(" ".join(str(m.offset()) for m in msgs), flush=True)
        break
time.sleep(600)  # hold the records, unacknowledged, until killed
"""


@pytest.mark.slow
def test_sigkilled_consumer_records_go_to_another_consumer(fresh_broker):
    import signal
    import subprocess
    import sys

    fresh_broker.overrides += ["group.share.record.lock.duration.ms=2000"]
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = _name("qx"), _name("gx")
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 20)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER_SCRIPT, bs, group, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout is not None
        held = {int(o) for o in holder.stdout.readline().split()}
        assert held
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
    other = share_consumer(bs, group, [topic])
    try:
        sink = Consumed()
        poll_until(other, lambda: held <= {o for _p, o, _v, _d in sink.records}, sink, 30)
        got = {o: d for _p, o, _v, d in sink.records}
        assert held <= set(got)
        assert all(got[o] == 2 for o in held), got
    finally:
        other.close()
