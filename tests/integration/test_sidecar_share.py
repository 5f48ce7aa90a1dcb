"""Share groups served by the sidecar over the upstream's records: a standalone Shoal process is the
upstream, a second Shoal process with `upstream.bootstrap.servers` the sidecar. Records are produced
straight to the upstream; confluent-kafka's ShareConsumer knows only the sidecar's address."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .kafka_wire import WireClient
from .names import unique_name
from .share_clients import create_topic, produce, set_group_config
from .test_metrics import scrape
from .test_share_admin import alter_offsets, consume_and_ack, describe_offsets, offsets_by_partition

POLL_DEADLINE_S = 45.0


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("share-upstream") / "data", overrides=NO_JOIN_DELAY).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sidecar_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("share-sidecar") / "data"


@pytest.fixture(scope="module")
def sidecar(sidecar_dir: Path, upstream: BrokerProcess) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(sidecar_dir, overrides=[
        "node.id=7", f"upstream.bootstrap.servers={upstream.bootstrap}", *FAST_HEARTBEAT]).start()
    yield proc
    proc.stop()


def _consumer(sidecar: BrokerProcess, group: str, topic: str, **extra: Any) -> ShareConsumer:
    consumer = ShareConsumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group,
                              "share.acknowledgement.mode": "explicit", **extra})
    consumer.subscribe([topic])
    return consumer


def _poll(consumer: ShareConsumer, want: int, *, ack: AcknowledgeType | None = AcknowledgeType.ACCEPT,
          deadline_s: float = POLL_DEADLINE_S) -> list[tuple[int, int, bytes, int]]:
    """(partition, offset, value, delivery count) of what arrives until `want` records came (or the
    deadline passed), each acknowledged with `ack` and committed."""
    got: list[tuple[int, int, bytes, int]] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < deadline:
        msgs = [m for m in consumer.poll(0.5) if m.error() is None]
        for m in msgs:
            got.append((m.partition(), m.offset(), m.value(), m.delivery_count()))
            if ack is not None:
                consumer.acknowledge(m, ack)
        if msgs and ack is not None:
            assert all(err is None for err in consumer.commit_sync(30).values())
    return got


def _setup(upstream: BrokerProcess, sidecar: BrokerProcess, partitions: int = 1, **group_configs: str
           ) -> tuple[str, str]:
    topic, group = unique_name("sc-share"), unique_name("sc-share-g")
    create_topic(upstream.bootstrap, topic, partitions)  # on the upstream, not through the sidecar
    # Share groups are the sidecar's own, so are their configs.
    set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest", **group_configs)
    return topic, group


def test_share_consumer_on_the_sidecar_reads_the_upstreams_records(upstream: BrokerProcess, sidecar: BrokerProcess,
                                                                    sidecar_dir: Path) -> None:
    topic, group = _setup(upstream, sidecar, partitions=2)
    produced = produce(upstream.bootstrap, topic, 40, partitions=2)
    consumer = _consumer(sidecar, group, topic)
    try:
        got = _poll(consumer, 40)
    finally:
        consumer.close()
    assert sorted((p, o, v) for p, o, v, _d in got) == sorted(produced)
    assert all(d == 1 for *_rest, d in got)
    # The records were read from the upstream, never copied into the sidecar's own logs.
    assert not [p for p in sidecar_dir.iterdir() if p.name.startswith(topic)]


def test_accept_release_reject_through_the_sidecar(upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    topic, group = _setup(upstream, sidecar)
    produce(upstream.bootstrap, topic, 10)
    consumer = _consumer(sidecar, group, topic)
    try:
        kinds = {0: AcknowledgeType.RELEASE, 1: AcknowledgeType.REJECT}
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + POLL_DEADLINE_S
        while len(seen) < 10 and time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(0.5) if m.error() is None]
            for m in msgs:
                seen.append((m.offset(), m.delivery_count()))
                consumer.acknowledge(m, kinds.get(m.offset(), AcknowledgeType.ACCEPT))
            if msgs:
                assert all(err is None for err in consumer.commit_sync(30).values())
        assert sorted(seen) == [(o, 1) for o in range(10)]
        # RELEASE: offset 0 comes back, delivered a second time; REJECT (offset 1) and ACCEPT: never again.
        again = _poll(consumer, 1)
        assert [(o, d) for _p, o, _v, d in again] == [(0, 2)]
        assert _poll(consumer, 1, deadline_s=4) == []
    finally:
        consumer.close()
    # Another member of the group sees only records produced since.
    produce(upstream.bootstrap, topic, 1, prefix="late")
    consumer = _consumer(sidecar, group, topic)
    try:
        late = _poll(consumer, 1)
        assert [(o, v) for _p, o, v, _d in late] == [(10, b"late-0")]
    finally:
        consumer.close()


def test_read_committed_share_group_skips_aborted_upstream_records(upstream: BrokerProcess,
                                                                   sidecar: BrokerProcess) -> None:
    topic, group = _setup(upstream, sidecar, share_isolation_level="read_committed")
    producer = Producer({"bootstrap.servers": upstream.bootstrap, "transactional.id": unique_name("sc-txn")})
    producer.init_transactions(30)
    for outcome, values in (("commit", [b"c0", b"c1"]), ("abort", [b"a0", b"a1", b"a2"]), ("commit", [b"c2"])):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=0)
        assert producer.flush(30) == 0
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    produce(upstream.bootstrap, topic, 1, prefix="plain")  # after every marker: the end of the stream
    consumer = _consumer(sidecar, group, topic)
    try:
        got = _poll(consumer, 4)
        assert [v for _p, _o, v, _d in sorted(got)] == [b"c0", b"c1", b"c2", b"plain-0"]
        assert _poll(consumer, 1, deadline_s=3) == []
    finally:
        consumer.close()
    # A read_uncommitted group of the same partition sees the aborted records too.
    other = unique_name("sc-share-g")
    set_group_config(sidecar.bootstrap, other, share_auto_offset_reset="earliest")
    consumer = _consumer(sidecar, other, topic)
    try:
        everything = _poll(consumer, 7)
        assert [v for _p, _o, v, _d in sorted(everything)] == [b"c0", b"c1", b"a0", b"a1", b"a2", b"c2", b"plain-0"]
    finally:
        consumer.close()


def test_a_second_group_reads_the_partition_from_the_sidecars_cache(upstream: BrokerProcess,
                                                                    sidecar: BrokerProcess) -> None:
    topic, group = _setup(upstream, sidecar)
    produce(upstream.bootstrap, topic, 200)
    consumer = _consumer(sidecar, group, topic)
    try:
        assert len(_poll(consumer, 200)) == 200
    finally:
        consumer.close()
    hits = "shoal_upstream_batch_cache_hits_total"
    before, _ = scrape(sidecar)
    second = unique_name("sc-share-g")
    set_group_config(sidecar.bootstrap, second, share_auto_offset_reset="earliest")
    consumer = _consumer(sidecar, second, topic)
    try:
        assert len(_poll(consumer, 200)) == 200
    finally:
        consumer.close()
    after, _ = scrape(sidecar)
    assert after[(hits, ())] > before.get((hits, ()), 0)


def test_share_group_offsets_are_described_and_altered_on_the_sidecar(upstream: BrokerProcess,
                                                                      sidecar: BrokerProcess) -> None:
    topic, group = _setup(upstream, sidecar)
    produce(upstream.bootstrap, topic, 100)
    seen = consume_and_ack(sidecar.bootstrap, group, [topic], accept_below=50, want=100)
    assert {(topic, o) for o in range(100)} <= set(seen)
    # The start offset is the sidecar's share state; the lag is counted to the upstream's high watermark.
    described = describe_offsets(sidecar.bootstrap, group)
    assert offsets_by_partition(described) == {(topic, 0): (50, 50, 0)}
    assert offsets_by_partition(describe_offsets(sidecar.bootstrap, group, {topic: [0, 3]}))[(topic, 3)][2] == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    deadline = time.monotonic() + 30
    while True:  # the closed member's leave may still be on its way
        altered = alter_offsets(sidecar.bootstrap, group, topic, {0: 90})
        if altered.error_code != ErrorCode.NON_EMPTY_GROUP or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert altered.error_code == ErrorCode.NONE
    assert [p.error_code for t in altered.responses for p in t.partitions] == [ErrorCode.NONE]
    assert offsets_by_partition(describe_offsets(sidecar.bootstrap, group)) == {(topic, 0): (90, 10, 0)}
    consumer = _consumer(sidecar, group, topic)
    try:
        assert sorted(o for _p, o, _v, _d in _poll(consumer, 10)) == list(range(90, 100))
    finally:
        consumer.close()


@pytest.mark.parametrize("produce_to", ["sidecar", "upstream"])
def test_a_share_long_poll_is_woken_by_a_produce(upstream: BrokerProcess, sidecar: BrokerProcess,
                                                 produce_to: str) -> None:
    """The consumer's MaxWaitMs is far beyond the test's deadline, so only the wake-up by the produce can
    deliver the record in time: a produce through the sidecar notifies its parked share fetches itself; one
    straight to the upstream reaches them through the sidecar's long poll of the upstream."""
    topic, group = _setup(upstream, sidecar)
    consumer = _consumer(sidecar, group, topic, **{"fetch.wait.max.ms": 120_000})
    try:
        # Joined, assigned, and parked in a ShareFetch on the empty partition (not asserted on: the fetch is
        # parked whether or not it arrived before the produce below).
        assert [m for m in consumer.poll(3.0) if m.error() is None] == []
        target = sidecar if produce_to == "sidecar" else upstream
        producer = Producer({"bootstrap.servers": target.bootstrap, "acks": "all"})
        producer.produce(topic, b"woken", partition=0)
        assert producer.flush(30) == 0
        got = _poll(consumer, 1, deadline_s=30)
        assert [(p, o, v) for p, o, v, _ in got] == [(0, 0, b"woken")]
    finally:
        consumer.close()


def test_a_join_for_a_topic_just_created_on_the_upstream_is_answered_with_its_assignment(
        upstream: BrokerProcess, sidecar: BrokerProcess) -> None:
    """The sidecar has not read the upstream's metadata since the topic was created: the heartbeat re-reads it,
    initialises the share partitions and answers with them assigned (Kafka's join would answer with none and
    assign them at the member's next heartbeat). The heartbeat interval stays the configured one."""
    topic, group = _setup(upstream, sidecar, partitions=3)
    with WireClient.connect(sidecar.bootstrap) as wire:
        joined = wire.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
            group_id=group, member_id=unique_name("m")[:22], member_epoch=0, rack_id=None,
            subscribed_topic_names=[topic]))
        assert joined.error_code == ErrorCode.NONE
        assert joined.heartbeat_interval_ms == 1000  # FAST_HEARTBEAT, as configured
        assert joined.assignment is not None
        assert [sorted(tp.partitions) for tp in joined.assignment.topic_partitions] == [[0, 1, 2]]
        # The next heartbeat finds the group settled: same epoch, nothing new to hand out.
        again = wire.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, messages.ShareGroupHeartbeatRequest(
            group_id=group, member_id=joined.member_id, member_epoch=joined.member_epoch, rack_id=None,
            subscribed_topic_names=None))
        assert (again.error_code, again.member_epoch, again.assignment) == (ErrorCode.NONE, joined.member_epoch, None)
