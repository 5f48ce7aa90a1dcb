"""Sidecar mode keeps group configs on the upstream (`__shoal_group_configs`): they survive a sidecar that
starts again with an empty directory, and a change made through one sidecar is seen by the others."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .names import unique_name
from .share_clients import (
    Consumed,
    create_topic,
    group_configs,
    poll_until,
    produce,
    set_group_config,
    share_consumer,
)

WAIT_S = 30.0
MEMBERSHIP = ["upstream.membership.session.timeout.ms=3000", "upstream.membership.heartbeat.interval.ms=300",
              "upstream.membership.rebalance.timeout.ms=5000"]


def _wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("gconfigs-upstream") / "data",
                         overrides=[*NO_JOIN_DELAY, "group.min.session.timeout.ms=1000"]).start()
    yield proc
    proc.stop()


def _sidecar(data_dir: Path, node_id: int, upstream: BrokerProcess, membership_group: str) -> BrokerProcess:
    return BrokerProcess(data_dir, overrides=[
        f"node.id={node_id}", f"upstream.bootstrap.servers={upstream.bootstrap}",
        f"upstream.membership.group.id={membership_group}", *MEMBERSHIP, *FAST_HEARTBEAT])


def test_config_survives_a_sidecar_restarted_empty(upstream: BrokerProcess, tmp_path: Path) -> None:
    group, topic = unique_name("gconfigs-wipe"), unique_name("gconfigs-wipe")
    create_topic(upstream.bootstrap, topic, 1)
    data_dir = tmp_path / "sidecar"
    deployment = unique_name("gconfigs-alone")  # the same deployment, so the same state topics, after the restart
    sidecar = _sidecar(data_dir, 5, upstream, deployment).start()
    try:
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest",
                         share_delivery_count_limit="3")
        # The sidecar that wrote it answers with it at once.
        assert group_configs(sidecar.bootstrap, group)["share.auto.offset.reset"] == ("earliest", True)
    finally:
        sidecar.stop()
    shutil.rmtree(data_dir)
    # Records produced before the group's first consumer: only "earliest" hands them out.
    produce(upstream.bootstrap, topic, 10)
    sidecar = _sidecar(data_dir, 5, upstream, deployment).start()
    try:
        described = group_configs(sidecar.bootstrap, group)
        assert described["share.auto.offset.reset"] == ("earliest", True)
        assert described["share.delivery.count.limit"] == ("3", True)
        consumer = share_consumer(sidecar.bootstrap, group, [topic])
        consumed = Consumed()
        try:
            poll_until(consumer, lambda: len(consumed) >= 10, consumed, WAIT_S)
        finally:
            consumer.close()
        assert sorted(offset for _p, offset, _v, _d in consumed.records) == list(range(10))
    finally:
        sidecar.stop()

