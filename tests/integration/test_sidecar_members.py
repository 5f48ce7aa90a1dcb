"""Several sidecars over one upstream (a standalone Shoal process): they form a group on the upstream,
split the upstream's partitions and the state partitions between them, name each other in Metadata,
FindCoordinator and DescribeCluster, and take over from one that dies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from shoal.client.connection import BrokerConnection
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .names import unique_name
from .share_clients import create_topic

# Short sessions on both sides, so a dead sidecar's work moves within seconds.
UPSTREAM_GROUPS = [*NO_JOIN_DELAY, "group.min.session.timeout.ms=1000"]
MEMBERSHIP = ["upstream.membership.session.timeout.ms=3000", "upstream.membership.heartbeat.interval.ms=300",
              "upstream.membership.rebalance.timeout.ms=5000"]
WAIT_S = 30.0


def _wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _sidecar(base: Path, name: str, node_id: int, upstream: BrokerProcess, group: str) -> BrokerProcess:
    return BrokerProcess(base / name, overrides=[
        f"node.id={node_id}", f"upstream.bootstrap.servers={upstream.bootstrap}",
        f"upstream.membership.group.id={group}", *MEMBERSHIP, *FAST_HEARTBEAT])


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("members-upstream") / "data", overrides=UPSTREAM_GROUPS).start()
    yield proc
    proc.stop()


def _view(sidecar: BrokerProcess, topic: str) -> tuple[set[int], dict[int, int]]:
    """Broker ids and each partition's leader, as the sidecar's Metadata answers them."""
    md = AdminClient({"bootstrap.servers": sidecar.bootstrap}).list_topics(topic, timeout=10)
    return set(md.brokers), {p: part.leader for p, part in md.topics[topic].partitions.items()}


async def _request(bootstrap: str, api_key: int, body: messages.MessageBase, version: int) -> object:
    host, port = bootstrap.rsplit(":", 1)
    conn = await BrokerConnection(host, int(port), ClientConfig.from_dict({})).connect()
    try:
        return await conn.request(api_key, body, version=version)
    finally:
        await conn.close()


def _find_coordinator(bootstrap: str, key_type: int, keys: list[str]) -> list[tuple[int, int, int]]:
    """(error code, node id, port) for each key."""
    response = asyncio.run(_request(bootstrap, ApiKey.FIND_COORDINATOR,
                                    messages.FindCoordinatorRequest(key_type=key_type, coordinator_keys=keys), 6))
    assert isinstance(response, messages.FindCoordinatorResponse)
    return [(c.error_code, c.node_id, c.port) for c in response.coordinators]


def test_two_sidecars_split_the_work_and_name_each_other(upstream: BrokerProcess, tmp_path: Path) -> None:
    group = unique_name("sidecars")
    a = _sidecar(tmp_path, "a", 1, upstream, group).start()
    b = _sidecar(tmp_path, "b", 2, upstream, group).start()
    try:
        topic = unique_name("members")
        create_topic(upstream.bootstrap, topic, 4)
        ports = {1: a.port, 2: b.port}

        def split() -> bool:
            views = [_view(s, topic) for s in (a, b)]
            return all(brokers == {1, 2} and set(leaders.values()) == {1, 2} for brokers, leaders in views) \
                and views[0][1] == views[1][1]

        _wait_for(split, "both sidecars to lead partitions of the new topic and agree on who leads which")
        brokers, leaders = _view(a, topic)
        assert sorted(leaders.values()).count(1) == 2  # balanced: two partitions each

        # Every group has one coordinator, the same whichever sidecar is asked, and both sidecars coordinate some.
        groups = [f"g-{i}" for i in range(16)]
        from_a, from_b = (_find_coordinator(s.bootstrap, 0, groups) for s in (a, b))
        assert from_a == from_b
        assert all(code == ErrorCode.NONE and ports[node] == port for code, node, port in from_a)
        assert {node for _, node, _ in from_a} == {1, 2}

        described = asyncio.run(_request(a.bootstrap, ApiKey.DESCRIBE_CLUSTER,
                                         messages.DescribeClusterRequest(include_cluster_authorized_operations=False), 0))
        assert isinstance(described, messages.DescribeClusterResponse)
        assert {(br.broker_id, br.port) for br in described.brokers} == {(1, a.port), (2, b.port)}

        # One sidecar leaves: the other leads everything and coordinates every group.
        b.stop()
        _wait_for(lambda: _view(a, topic) == ({1}, dict.fromkeys(range(4), 1)), "the remaining sidecar to lead all")
        assert {node for _, node, _ in _find_coordinator(a.bootstrap, 0, groups)} == {1}
    finally:
        b.stop()
        a.stop()
