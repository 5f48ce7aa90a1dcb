"""Two sidecar deployments (different `upstream.membership.group.id`) over one upstream, a standalone Shoal
process: each keeps its share groups' state in topics of its own, so a share group of the same name on the
same topic is two independent groups; and a deployment refuses to start on state topics another one owns,
also when both claim them at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from shoal.broker.upstream.cluster import UpstreamCluster, UpstreamStartError
from shoal.broker.upstream.forwarder import Forwarder
from shoal.broker.upstream.produce import produce_acks_all
from shoal.broker.upstream.settings import parse_upstream
from shoal.broker.upstream.state_topic_names import StateTopicNames
from shoal.broker.upstream.state_topics import claim_state_topics, deployment_owner, ensure_state_topics
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .names import unique_name
from .share_clients import consume_and_ack, create_topic, produce, set_group_config
from .test_share_admin import describe_offsets, offsets_by_partition

RECORDS = 30
POLL_DEADLINE_S = 45.0


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("deploy-upstream") / "data", overrides=NO_JOIN_DELAY).start()
    yield proc
    proc.stop()


def _sidecar(base: Path, upstream: BrokerProcess, membership_group: str, *extra: str) -> BrokerProcess:
    return BrokerProcess(base / "data", overrides=[
        "node.id=7", f"upstream.bootstrap.servers={upstream.bootstrap}",
        f"upstream.membership.group.id={membership_group}", *FAST_HEARTBEAT, *extra])


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory, upstream: BrokerProcess
                ) -> Iterator[dict[str, BrokerProcess]]:
    """Two deployments of one sidecar each, by membership group id."""
    started: dict[str, BrokerProcess] = {}
    try:
        for name in ("deploy-a", "deploy-b"):
            group = unique_name(name)
            started[group] = _sidecar(tmp_path_factory.mktemp(name), upstream, group).start()
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _consume(sidecar: BrokerProcess, group: str, topic: str, accept_below: int) -> list[tuple[int, int]]:
    """(offset, delivery count) of each delivery until every offset came once; offsets below `accept_below`
    are accepted, the others released."""
    got = consume_and_ack(sidecar.bootstrap, group, [topic], accept_below, RECORDS, POLL_DEADLINE_S)
    return [(offset, count) for _, offset, count in got]


def _offsets(sidecar: BrokerProcess, group: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """The group's share-group offsets once its coordinator has loaded them."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while True:
        described = describe_offsets(sidecar.bootstrap, group)
        if described.error_code == 0 or time.monotonic() > deadline:
            return offsets_by_partition(described)
        time.sleep(0.2)


def test_two_deployments_serve_a_share_group_of_one_name_each_with_its_own_state(
        upstream: BrokerProcess, deployments: dict[str, BrokerProcess]) -> None:
    topic, group = unique_name("deploy-orders"), unique_name("orders")
    create_topic(upstream.bootstrap, topic, 1)
    produce(upstream.bootstrap, topic, RECORDS)
    (a_id, a), (b_id, b) = deployments.items()
    for sidecar in (a, b):  # share groups, and so their configs, are each deployment's own
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest")

    # Deployment a accepts everything; deployment b, reading the same partition under the same group name
    # afterwards, still gets every record once, and accepts only the first ten.
    accepted_by = {a_id: RECORDS, b_id: 10}
    for sidecar_id, sidecar in deployments.items():
        got = _consume(sidecar, group, topic, accept_below=accepted_by[sidecar_id])
        # (A record released may come again, with a higher delivery count, before the last one first came.)
        assert sorted(o for o, count in got if count == 1) == list(range(RECORDS)), (sidecar_id, got)

    # Each deployment's share-partition start offset is its own acknowledgements', also once deployment a
    # rebuilt its state from the upstream (b wrote the same share partition's state last).
    a.stop()
    a.start()
    assert _offsets(a, group) == {(topic, 0): (RECORDS, 0, 0)}
    assert _offsets(b, group) == {(topic, 0): (10, RECORDS - 10, 0)}

    # Each kept it in topics of its own on the upstream.
    upstream_topics = set(AdminClient({"bootstrap.servers": upstream.bootstrap}).list_topics(timeout=10).topics)
    for sidecar_id in (a_id, b_id):
        assert {f"__shoal_{sidecar_id}_{what}" for what in
                ("consumer_offsets", "share_group_state", "group_configs", "deployment")} <= upstream_topics


def test_a_deployment_refuses_the_state_topics_of_another(
        tmp_path: Path, upstream: BrokerProcess, deployments: dict[str, BrokerProcess]) -> None:
    owner = next(iter(deployments))
    intruder = _sidecar(tmp_path, upstream, unique_name("deploy-c"), f"upstream.state.topic.prefix=__shoal_{owner}")
    with pytest.raises(RuntimeError, match="exited with 1"):
        intruder.start()
    intruder.stop()
    assert f"upstream.membership.group.id='{owner}'" in intruder.log_text()
    assert deployments[owner].alive()


def test_of_two_deployments_claiming_one_prefix_at_once_exactly_one_gets_it(upstream: BrokerProcess) -> None:
    prefix, groups = unique_name("__shoal_race"), [unique_name("race-a"), unique_name("race-b")]

    async def claim(group: str) -> None:
        cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}))
        try:
            await cluster.start()
            await claim_state_topics(cluster, Forwarder(cluster), StateTopicNames(prefix), group, None)
        finally:
            await cluster.close()

    async def run() -> None:
        first = await asyncio.gather(*(claim(g) for g in groups), return_exceptions=True)
        refused = [g for g, outcome in zip(groups, first, strict=True) if isinstance(outcome, UpstreamStartError)]
        assert len(refused) == 1 and not [o for o in first if o is not None and not isinstance(o, UpstreamStartError)]
        [winner] = set(groups) - set(refused)
        # The claim holds across starts: the winner starts again, the other is refused again.
        await claim(winner)
        with pytest.raises(UpstreamStartError, match=f"upstream.membership.group.id='{winner}'"):
            await claim(refused[0])

    asyncio.run(run())


def test_the_owner_is_the_first_record_left_once_earlier_ones_are_deleted(upstream: BrokerProcess) -> None:
    """The marker topic read from a log start past offset 0, which falls inside the batch that holds the next
    record: the records below it do not count, the first one at or after it names the owner."""
    topic = StateTopicNames(unique_name("__shoal_deleted")).deployment

    async def owner() -> str | None:
        cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}))
        try:
            await cluster.start()
            await ensure_state_topics(cluster, {topic: 1}, None)
            if (found := await deployment_owner(cluster, topic)) is None:
                batch = encode_batch([RecordInput(key=b"first", value=b"first"), RecordInput(key=b"second", value=b"")])
                await produce_acks_all(Forwarder(cluster), topic, 0, batch, timeout_ms=10_000, what="markers")
                found = await deployment_owner(cluster, topic)
            return found
        finally:
            await cluster.close()

    assert asyncio.run(owner()) == "first"
    admin = AdminClient({"bootstrap.servers": upstream.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 1)]).values():
        assert future.result(30).low_watermark == 1
    assert asyncio.run(owner()) == "second"
