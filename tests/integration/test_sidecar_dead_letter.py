"""Dead letters (KIP-1191) in sidecar mode: the records a share group gives up on are produced to the
dead-letter topic on the upstream, with the headers standalone Shoal writes. A standalone Shoal process is
the upstream; share consumers know only the sidecar."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .broker_process import BrokerProcess
from .names import unique_name
from .share_clients import create_topic, produce, reject_confirmed, set_group_config, share_consumer
from .sidecar_pair import upstream_and_sidecar
from .test_share_dead_letter import _create_dlq_topic, _dead_letters, _headers, _wait_logged

DEADLINE_S = 60


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with upstream_and_sidecar(tmp_path_factory.mktemp("sidecar-dlq"), sidecar_overrides=[
            "errors.deadletterqueue.auto.create.topics.enable=true"]) as brokers:
        yield brokers


def _reject(sidecar: BrokerProcess, topic: str, group: str, count: int, **extra: Any) -> set[int]:
    """REJECT `count` records of `topic` as a member of `group` through the sidecar; the offsets whose
    rejection the sidecar confirmed."""
    consumer = share_consumer(sidecar.bootstrap, group, [topic], share_acknowledgement_mode="explicit", **extra)
    try:
        return reject_confirmed(consumer, count, DEADLINE_S)
    finally:
        consumer.close()


def _setup(upstream: BrokerProcess, sidecar: BrokerProcess, prefix: str, **group_configs: str) -> tuple[str, str, str]:
    topic, group = unique_name(prefix), unique_name(f"{prefix}-g")
    dlq = f"dlq.{topic}"
    create_topic(upstream.bootstrap, topic, 1)
    set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest",
                     errors_deadletterqueue_topic_name=dlq, **group_configs)
    return topic, group, dlq


def test_a_rejected_record_lands_on_the_upstreams_dead_letter_topic_with_the_headers(
        pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    upstream, sidecar = pair
    topic, group, dlq = _setup(upstream, sidecar, "sc-dq", errors_deadletterqueue_copy_record_enable="true")
    _create_dlq_topic(upstream.bootstrap, dlq)
    produce(upstream.bootstrap, topic, 1)
    assert _reject(sidecar, topic, group, 1) == {0}
    # Read from the upstream itself: the record was produced there, not kept by the sidecar.
    [record] = _dead_letters(upstream.bootstrap, dlq, 1)
    assert _headers(record) == {
        "__dlq.errors.topic": topic,
        "__dlq.errors.partition": "0",
        "__dlq.errors.offset": "0",
        "__dlq.errors.group": group,
        "__dlq.errors.delivery.count": "1",
        "__dlq.errors.message": "Offset rejected by client.",
    }
    # The copy is read from the upstream partition too.
    assert (record.key(), record.value()) == (b"0", b"v-0")


def test_a_missing_dead_letter_topic_is_created_on_the_upstream_and_a_refusing_one_is_not_written(
        pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    upstream, sidecar = pair
    topic, group, dlq = _setup(upstream, sidecar, "sc-dqc")
    produce(upstream.bootstrap, topic, 2)
    assert _reject(sidecar, topic, group, 2) == {0, 1}
    records = _dead_letters(upstream.bootstrap, dlq, 2)
    assert sorted(int(_headers(r)["__dlq.errors.offset"]) for r in records) == [0, 1]
    assert all((r.key(), r.value()) == (None, None) for r in records)

    # A topic on the upstream without the opt-in is refused, with Kafka's reason in the sidecar's log.
    topic, group, dlq = _setup(upstream, sidecar, "sc-dqo")
    _create_dlq_topic(upstream.bootstrap, dlq, enabled=False)
    produce(upstream.bootstrap, topic, 1)
    assert _reject(sidecar, topic, group, 1) == {0}
    _wait_logged(sidecar, "records archived without a dead-letter record",
                 f"DLQ is not enabled on configured DLQ topic for share group: {group}, topic: {dlq}.")
    assert _dead_letters(upstream.bootstrap, dlq, 0) == []


def test_a_sidecar_killed_while_dead_lettering_loses_none_and_writes_none_twice(
        pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    """ARCHIVING is durable before the upstream write; after a restart the sidecar scans the upstream's
    dead-letter partition and writes only what is missing."""
    upstream, sidecar = pair
    topic, group, dlq = _setup(upstream, sidecar, "sc-dqk")
    _create_dlq_topic(upstream.bootstrap, dlq)
    count = 200
    produce(upstream.bootstrap, topic, count)
    consumer = share_consumer(sidecar.bootstrap, group, [topic], share_acknowledgement_mode="explicit",
                              max_poll_records=20)
    killed = False

    def crash_once(rejected: set[int]) -> None:
        nonlocal killed
        if not killed and len(rejected) >= 40:
            # Right behind answered rejections, whose dead-letter writes are under way.
            sidecar.kill()
            killed = True
            sidecar.start()

    try:
        rejected = reject_confirmed(consumer, count, 120, crash_once)
    finally:
        consumer.close()
    assert killed
    assert rejected == set(range(count))
    # A share partition is loaded again on its group's next fetch, and the load finishes the ARCHIVING
    # records it finds (the consumer may have rejected everything before the kill).
    again = share_consumer(sidecar.bootstrap, group, [topic])
    deadline = time.monotonic() + DEADLINE_S
    try:
        while _loads(sidecar, group) < 2 and time.monotonic() < deadline:
            again.poll(0.5)
    finally:
        again.close()
    records = _dead_letters(upstream.bootstrap, dlq, count)
    offsets = [int(_headers(r)["__dlq.errors.offset"]) for r in records]
    assert sorted(offsets) == list(range(count))


def _loads(sidecar: BrokerProcess, group: str) -> int:
    return sum(1 for line in sidecar.log_text().splitlines() if "share partition loaded" in line and group in line)
