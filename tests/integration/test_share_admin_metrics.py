"""KIP-932 broker metrics on the Prometheus endpoint move with a live share-group workload."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType

from .broker_process import BrokerProcess
from .share_clients import create_topic, produce, set_group_config, share_consumer
from .test_metrics import Samples, scrape
from .test_share_admin import wait_for_state


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_share_metrics_follow_a_workload(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic, group = f"mt-{uuid.uuid4().hex[:8]}", f"gmt-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 1)
    set_group_config(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic, 30)
    before, types = scrape(broker)
    assert types["shoal_group_coordinator_record_acknowledgement"] == "counter"
    assert types["shoal_group_coordinator_group_count"] == "gauge"
    assert types["shoal_share_coordinator_write_latency_seconds"] == "histogram"
    # Loading __share_group_state at start-up was timed, one observation per state partition.
    assert value(before, "shoal_share_coordinator_partition_load_time_seconds_count") > 0

    sp = {"group": group, "topic": topic, "partition": "0"}
    consumer = share_consumer(bs, group, [topic], share_acknowledgement_mode="explicit")
    accepted: set[int] = set()
    rejected: set[int] = set()
    held: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            held = [m for m in consumer.poll(0.5) if not m.error()]
        assert held
        # Records handed out and not yet acknowledged are ACQUIRED, with a lock being held.
        during, _ = scrape(broker)
        assert value(during, "shoal_group_coordinator_group_count", protocol="share", state="Stable") == 1
        assert value(during, "shoal_share_partition_acquired_records", **sp) >= len(held)
        assert value(during, "shoal_share_partition_in_flight_records", **sp) >= len(held)
        assert ("shoal_share_partition_oldest_acquired_age_seconds", tuple(sorted(sp.items()))) in during
        assert value(during, "shoal_share_partition_lag", **sp) == 30
        assert delta(before, during, "shoal_group_coordinator_partition_load_time_seconds_count", protocol="share") == 1

        # ACCEPT 0-9, RELEASE 10-19 once (then ACCEPT on redelivery), REJECT 20-29.
        msgs = held
        while (len(accepted) < 20 or len(rejected) < 10) and time.monotonic() < deadline:
            for m in msgs:
                offset = m.offset()
                assert offset is not None
                if offset >= 20:
                    consumer.acknowledge(m, AcknowledgeType.REJECT)
                    rejected.add(offset)
                elif offset >= 10 and m.delivery_count() == 1:
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)
                else:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted.add(offset)
            if msgs:
                assert all(err is None for err in consumer.commit_sync(30).values())
            msgs = [m for m in consumer.poll(0.5) if not m.error()]
        assert accepted == set(range(20)) and rejected == set(range(20, 30))
        after, _ = scrape(broker)
    finally:
        consumer.close()

    accept = delta(before, after, "shoal_group_coordinator_record_acknowledgement_total", protocol="share",
                   ack_type="accept")
    release = delta(before, after, "shoal_group_coordinator_record_acknowledgement_total", protocol="share",
                    ack_type="release")
    reject = delta(before, after, "shoal_group_coordinator_record_acknowledgement_total", protocol="share",
                   ack_type="reject")
    assert (accept, release, reject) == (20, 10, 10)
    assert delta(before, after, "shoal_group_coordinator_share_acknowledgement_total", protocol="share") >= 1
    # Everything is terminal: the start offset moved to the end, nothing in flight, no lag.
    assert value(after, "shoal_share_partition_start_offset", **sp) == 30
    assert value(after, "shoal_share_partition_in_flight_records", **sp) == 0
    assert value(after, "shoal_share_partition_lag", **sp) == 0
    assert value(after, "shoal_share_partition_oldest_acquired_age_seconds", **sp) == 0
    assert delta(before, after, "shoal_group_coordinator_rebalance_total", protocol="share") >= 1
    assert value(after, "shoal_group_coordinator_num_partitions", protocol="share") >= 1
    # Acknowledgements are persisted with WriteShareGroupState calls, each one timed: at least one for
    # the first delivery's acknowledgements and one for the redelivered records'.
    writes = delta(before, after, "shoal_share_coordinator_write_total")
    assert writes >= 2
    assert delta(before, after, "shoal_share_coordinator_write_latency_seconds_count") == writes
    assert value(after, "shoal_share_coordinator_write_latency_max_seconds") >= 0
    # The millisecond names of the previous release are still there, as aliases with the same observations.
    assert delta(before, after, "shoal_share_coordinator_write_latency_ms_count") == writes
    assert value(after, "shoal_share_coordinator_write_latency_ms_sum") == pytest.approx(
        1000 * value(after, "shoal_share_coordinator_write_latency_seconds_sum"))
    assert value(after, "shoal_share_coordinator_write_latency_max_ms") == pytest.approx(
        1000 * value(after, "shoal_share_coordinator_write_latency_max_seconds"))
    assert value(after, "shoal_group_coordinator_partition_load_time_ms_sum", protocol="share") == pytest.approx(
        1000 * value(after, "shoal_group_coordinator_partition_load_time_seconds_sum", protocol="share"))
    assert delta(before, after, "shoal_share_coordinator_busy_seconds_total") > 0

    wait_for_state(bs, group, "Empty")
    empty, _ = scrape(broker)
    assert value(empty, "shoal_group_coordinator_group_count", protocol="share", state="Stable") == 0
    assert value(empty, "shoal_group_coordinator_group_count", protocol="share", state="Empty") == 1
