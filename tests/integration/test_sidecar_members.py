"""Several sidecars over one upstream (a standalone Shoal process): they form a group on the upstream,
split the upstream's partitions and the state partitions between them, name each other in Metadata,
FindCoordinator and DescribeCluster, and take over from one that dies."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AdminClient

from shoal.client.connection import BrokerConnection
from shoal.client.consumer import ShareConsumer as BundledShareConsumer
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .names import unique_name
from .share_clients import create_topic, group_configs, produce, set_group_config

# A sidecar the test kills or pauses has a short session, so its work moves within seconds. The others keep
# theirs through a loaded machine: a sidecar starved of CPU for a few seconds would otherwise see its own
# membership lapse and hand its work around in the middle of a test. Heartbeats are frequent either way, so a
# rebalance (a sidecar joining or leaving) completes as soon as every member has rejoined; the rebalance
# timeout only bounds how long the group waits for a member that does not.
UPSTREAM_GROUPS = [*NO_JOIN_DELAY, "group.min.session.timeout.ms=1000"]
SHORT_SESSION_MS = 3000
STEADY_SESSION_MS = 20000
MEMBERSHIP = ["upstream.membership.heartbeat.interval.ms=300", "upstream.membership.rebalance.timeout.ms=20000"]
# Waits on conditions: generous, as they end as soon as the condition holds.
WAIT_S = 60.0
PEER_TIMEOUT_S = 30.0  # a sidecar's share-state request to another sidecar (the client's request.timeout.ms)
LOCK_S = 30.0  # group.share.record.lock.duration.ms, the default


def _wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S,
              detail: Callable[[], object] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {detail()}")
        time.sleep(0.2)


def _sidecar(base: Path, name: str, node_id: int, upstream: BrokerProcess, group: str,
             session_ms: int = STEADY_SESSION_MS) -> BrokerProcess:
    return BrokerProcess(base / name, overrides=[
        f"node.id={node_id}", f"upstream.bootstrap.servers={upstream.bootstrap}",
        f"upstream.membership.group.id={group}", f"upstream.membership.session.timeout.ms={session_ms}",
        *MEMBERSHIP, *FAST_HEARTBEAT])


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


Record = tuple[int, int]  # partition, offset


@dataclass
class AckLedger:
    """What four share consumers saw, shared between their threads: every delivery, the records whose
    ACCEPT the sidecar confirmed (commit_sync answered no error for the partition), the records whose commit
    failed (the state write may or may not have happened), and any delivery of an already confirmed record."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    deliveries: list[tuple[Record, int]] = field(default_factory=list)
    confirmed: set[Record] = field(default_factory=set)
    unsure: set[Record] = field(default_factory=set)
    redelivered_after_accept: list[Record] = field(default_factory=list)
    last_delivery: float = field(default_factory=time.monotonic)

    def delivered(self, record: Record, count: int) -> None:
        with self.lock:
            self.deliveries.append((record, count))
            self.last_delivery = time.monotonic()
            if record in self.confirmed:
                self.redelivered_after_accept.append(record)

    def committed(self, records: list[Record], failed_partitions: set[int] | None) -> None:
        with self.lock:
            for r in records:
                if failed_partitions is None or r[0] in failed_partitions:
                    self.unsure.add(r)
                else:
                    self.confirmed.add(r)

    def settled(self, records: set[Record]) -> bool:
        """Every one of `records` was accepted: confirmed, or its commit was cut off."""
        with self.lock:
            return records <= self.confirmed | self.unsure

    def missing(self, records: set[Record]) -> object:
        with self.lock:
            left = records - self.confirmed - self.unsure
            return {"missing": sorted(left)[:8], "count": len(left), "unsure": len(self.unsure)}

    def partitions_after(self, since: int) -> set[int]:
        with self.lock:
            return {r[0] for r, _ in self.deliveries[since:]}


def _consume(consumer: ShareConsumer, ledger: AckLedger, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            msgs = [m for m in consumer.poll(0.3) if m.error() is None]
        except Exception:
            continue
        records = []
        for m in msgs:
            ledger.delivered((m.partition(), m.offset()), m.delivery_count())
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            records.append((m.partition(), m.offset()))
        if not records:
            continue
        try:
            results = consumer.commit_sync(10)
        except Exception:
            ledger.committed(records, None)
            continue
        ledger.committed(records, {tp.partition for tp, err in results.items() if err is not None})


@dataclass
class Stream:
    """Two sidecars under four explicit-ack share consumers (bootstrap: both sidecars) and a producer."""

    upstream: BrokerProcess
    a: BrokerProcess
    b: BrokerProcess
    topic: str
    ledger: AckLedger = field(default_factory=AckLedger)
    produced: set[Record] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    consumers: list[ShareConsumer] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def produce(self, count: int, prefix: str) -> set[Record]:
        records = {(p, o) for p, o, _ in produce(self.upstream.bootstrap, self.topic, count, partitions=4, prefix=prefix)}
        self.produced |= records
        return records

    def consume(self, share_group: str) -> None:
        for _ in range(4):
            consumer = ShareConsumer({"bootstrap.servers": f"{self.a.bootstrap},{self.b.bootstrap}",
                                      "group.id": share_group, "share.acknowledgement.mode": "explicit",
                                      # A paused sidecar holds requests unanswered: give up on them soon.
                                      "socket.timeout.ms": 5000})
            consumer.subscribe([self.topic])
            self.consumers.append(consumer)
            self.threads.append(threading.Thread(target=_consume, args=(consumer, self.ledger, self.stop), daemon=True))
        for t in self.threads:
            t.start()

    def settle(self) -> None:
        """Until every produced record is accepted (or its commit was cut off: such a record may have been
        written before the sidecar went, and is then not delivered again); then the consumers stop."""
        ledger = self.ledger

        def settled() -> bool:
            with ledger.lock:
                if self.produced <= ledger.confirmed:
                    return True
                quiet = time.monotonic() - ledger.last_delivery > 5
                return quiet and self.produced <= ledger.confirmed | ledger.unsure

        _wait_for(settled, "every record to be accepted", 60, lambda: ledger.missing(self.produced))
        self.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        for consumer in self.consumers:
            consumer.close()
        self.consumers.clear()


def _from_earliest(a: BrokerProcess, b: BrokerProcess, share_group: str) -> None:
    """share.auto.offset.reset=earliest, set through one sidecar, in effect on both once the other has read
    it from the upstream."""
    set_group_config(a.bootstrap, share_group, share_auto_offset_reset="earliest")
    _wait_for(lambda: group_configs(b.bootstrap, share_group)["share.auto.offset.reset"] == ("earliest", True),
              "the other sidecar to see the group config")


@pytest.fixture
def stream(upstream: BrokerProcess, tmp_path: Path) -> Iterator[Stream]:
    group = unique_name("sidecars")
    a = _sidecar(tmp_path, "a", 1, upstream, group).start()
    b = _sidecar(tmp_path, "b", 2, upstream, group, SHORT_SESSION_MS).start()  # killed or paused
    s = Stream(upstream, a, b, unique_name("members-stream"))
    try:
        create_topic(upstream.bootstrap, s.topic, 4)
        _wait_for(lambda: set(_view(a, s.topic)[1].values()) == {1, 2}, "the sidecars to split the topic")
        share_group = unique_name("members-g")
        _from_earliest(a, b, share_group)
        s.produce(200, "first")
        s.consume(share_group)
        _wait_for(lambda: len(s.ledger.confirmed) >= 100, "half of the first records to be accepted", 60)
        yield s
    finally:
        s.close()
        if b.proc is not None and b.alive():
            b.proc.send_signal(signal.SIGCONT)
        b.stop()
        a.stop()


def _read_until(consumer: BundledShareConsumer, seen: set[Record], wanted: set[Record], what: str) -> None:
    def more() -> bool:
        seen.update((r.partition, r.offset) for r in consumer.poll(0.5))
        return wanted <= seen

    _wait_for(more, what, detail=lambda: sorted(wanted - seen)[:10])


def test_the_survivor_of_a_kill_serves_every_share_partition_with_nothing_lost_or_redelivered_after_accept(
        stream: Stream) -> None:
    a, b, ledger = stream.a, stream.b, stream.ledger
    # Shoal's own share consumer too (the Spark source's driver is one), in a group of its own: it fetched
    # from both sidecars before the kill, and must find the survivor leading the dead one's partitions after.
    bundled_group = unique_name("members-bundled")
    _from_earliest(a, b, bundled_group)
    bundled = BundledShareConsumer(f"{a.bootstrap},{b.bootstrap}", bundled_group, request_timeout_ms=5000)
    seen: set[Record] = set()
    try:
        bundled.subscribe([stream.topic])
        _read_until(bundled, seen, set(stream.produced), "the bundled share consumer to read the first records")
        b.kill()  # kill -9, mid-stream
        _wait_for(lambda: _view(a, stream.topic) == ({1}, dict.fromkeys(range(4), 1)),
                  "the survivor to lead every partition")
        with ledger.lock:
            mark = len(ledger.deliveries)
        second = stream.produce(200, "second")
        _read_until(bundled, seen, second, "the bundled share consumer to read the second records from the survivor")
    finally:
        bundled.close()
    stream.settle()
    assert ledger.redelivered_after_accept == []
    delivered = {r for r, _ in ledger.deliveries}
    assert stream.produced <= delivered, sorted(stream.produced - delivered)[:10]
    assert ledger.partitions_after(mark) == {0, 1, 2, 3}  # the survivor served every share partition


_TAKEN = re.compile(r"state partition taken .*?partition=(\d+) producer_epoch=(\d+) .*?topic=(\S+)")


def _taken(log_text: str) -> dict[tuple[str, int], int]:
    """The producer epoch each state partition was last taken with, from a sidecar's log."""
    return {(topic, int(p)): int(epoch) for p, epoch, topic in _TAKEN.findall(log_text)}


def test_a_sidecar_paused_past_its_session_is_fenced_and_hands_nothing_out_twice(stream: Stream) -> None:
    a, b, ledger = stream.a, stream.b, stream.ledger
    assert b.proc is not None
    held = _taken(b.log_text())
    assert held
    b.proc.send_signal(signal.SIGSTOP)
    _wait_for(lambda: _view(a, stream.topic) == ({1}, dict.fromkeys(range(4), 1)),
              "the other sidecar to take everything over")
    # Every state partition the paused sidecar held is taken with a higher producer epoch: the upstream
    # refuses that sidecar's writes from then on. Metadata names the new owner as soon as the assignment
    # arrives, before the take (InitProducerId, then the read of the partition) is done, so wait for it.
    _wait_for(lambda: all(_taken(a.log_text()).get(key, -1) > epoch for key, epoch in held.items()),
              "the other sidecar to take every state partition the paused one held",
              detail=lambda: (held, _taken(a.log_text())))
    while_paused = stream.produce(100, "while-paused")
    # A state write the survivor sent to the paused sidecar just before the pause waits out the peer request
    # timeout (30 s) and fails, and the writes queued behind it on that share partition wait with it: a
    # consumer's commit may give up first (its ACCEPT is then unsure, as in settle()), and records whose
    # ACCEPT the failed write rolled back come back once their acquisition lock (30 s) runs out.
    _wait_for(lambda: ledger.settled(while_paused), "records produced during the pause to be accepted",
              PEER_TIMEOUT_S + LOCK_S + WAIT_S, detail=lambda: ledger.missing(while_paused))
    b.proc.send_signal(signal.SIGCONT)
    # Resumed, it finds its membership lapsed and serves nothing until the group assigns it work again;
    # what it takes back it takes with a new producer epoch, which fences the other's writes on it.
    _wait_for(lambda: "membership lapsed" in b.log_text(), "the resumed sidecar to notice its lapse")
    _wait_for(lambda: set(_view(a, stream.topic)[1].values()) == {1, 2}, "the resumed sidecar to rejoin")
    groups = [f"g-{i}" for i in range(8)]
    _wait_for(lambda: _find_coordinator(a.bootstrap, 0, groups) == _find_coordinator(b.bootstrap, 0, groups),
              "both sidecars to name the same coordinator for every group")
    stream.produce(100, "after")
    stream.settle()
    assert ledger.redelivered_after_accept == []
    delivered = {r for r, _ in ledger.deliveries}
    assert stream.produced <= delivered, sorted(stream.produced - delivered)[:10]


def _topic_id(sidecar: BrokerProcess, topic: str) -> bytes:
    md = messages.MetadataRequest
    response = asyncio.run(_request(sidecar.bootstrap, ApiKey.METADATA, md(
        topics=[md.MetadataRequestTopic(topic_id=bytes(16), name=topic)],  # type: ignore[attr-defined]
        allow_auto_topic_creation=False), 12))
    assert isinstance(response, messages.MetadataResponse)
    [found] = response.topics
    return bytes(found.topic_id)


def _state_rpc(sidecars: tuple[BrokerProcess, ...], api_key: int, body: messages.MessageBase, version: int) -> object:
    """The one partition result of a share-state RPC, from whichever sidecar coordinates its state partition
    (the others answer NOT_COORDINATOR)."""
    answers = []
    for sidecar in sidecars:
        response = asyncio.run(_request(sidecar.bootstrap, api_key, body, version))
        [result] = response.results  # type: ignore[attr-defined]
        [partition] = result.partitions
        if partition.error_code != ErrorCode.NOT_COORDINATOR:
            answers.append(partition)
    assert len(answers) == 1, answers
    return answers[0]


def _stored_leader_epoch(sidecars: tuple[BrokerProcess, ...], group: str, topic_id: bytes, partition: int) -> int:
    req = messages.ReadShareGroupStateSummaryRequest
    body = req(group_id=group, topics=[req.ReadStateSummaryData(  # type: ignore[attr-defined]
        topic_id=topic_id, partitions=[req.PartitionData(partition=partition, leader_epoch=0)])])  # type: ignore[attr-defined]
    found = _state_rpc(sidecars, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, body, 1)
    assert found.error_code == ErrorCode.NONE, found  # type: ignore[attr-defined]
    return int(found.leader_epoch)  # type: ignore[attr-defined]


def _read_as_leader(sidecars: tuple[BrokerProcess, ...], group: str, topic_id: bytes, partition: int,
                    leader_epoch: int) -> int:
    """ReadShareGroupState as a share-partition leader loading with `leader_epoch` does."""
    req = messages.ReadShareGroupStateRequest
    body = req(group_id=group, topics=[req.ReadStateData(  # type: ignore[attr-defined]
        topic_id=topic_id, partitions=[req.PartitionData(partition=partition, leader_epoch=leader_epoch)])])  # type: ignore[attr-defined]
    return int(_state_rpc(sidecars, ApiKey.READ_SHARE_GROUP_STATE, body, 0).error_code)  # type: ignore[attr-defined]


_LOADED = re.compile(r"share partition loaded .*?leader_epoch=(\d+) .*?partition=(\d+)")


def _load_epochs(sidecar: BrokerProcess, partition: int) -> list[int]:
    """The leader epochs the sidecar loaded the share partition with, in order, from its log."""
    return [int(e) for e, p in _LOADED.findall(sidecar.log_text()) if int(p) == partition]


def test_a_later_leaders_epoch_refuses_the_earlier_leaders_acknowledgement(
        upstream: BrokerProcess, tmp_path: Path) -> None:
    group = unique_name("sidecars")
    a = _sidecar(tmp_path, "a", 1, upstream, group).start()
    b = _sidecar(tmp_path, "b", 2, upstream, group).start()
    consumer: ShareConsumer | None = None
    try:
        topic, share_group = unique_name("members-epoch"), unique_name("members-epoch-g")
        create_topic(upstream.bootstrap, topic, 4)
        _wait_for(lambda: set(_view(a, topic)[1].values()) == {1, 2}, "the sidecars to split the topic")
        p = min(q for q, leader in _view(a, topic)[1].items() if leader == 2)  # a partition b leads
        _from_earliest(a, b, share_group)
        produced = {(q, o) for q, o, _ in produce(upstream.bootstrap, topic, 16, partitions=4)}
        topic_id, both = _topic_id(a, topic), (a, b)

        consumer = ShareConsumer({"bootstrap.servers": f"{a.bootstrap},{b.bootstrap}", "group.id": share_group,
                                  "share.acknowledgement.mode": "explicit"})
        consumer.subscribe([topic])
        ledger = AckLedger()

        def poll() -> list[Any]:
            assert consumer is not None
            msgs = [m for m in consumer.poll(0.3) if m.error() is None]
            for m in msgs:
                ledger.delivered((m.partition(), m.offset()), m.delivery_count())
            return msgs

        def accept(msgs: list[Any]) -> set[int]:
            """ACCEPT the records; returns the partitions whose acknowledgement the sidecar refused."""
            assert consumer is not None
            for m in msgs:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            failed = {tp.partition for tp, err in consumer.commit_sync(10).items() if err is not None} if msgs else set()
            ledger.committed([(m.partition(), m.offset()) for m in msgs], failed)
            return failed

        def poll_until_partition(q: int) -> list[Any]:
            """Poll (accepting what else comes) until a poll hands out records of partition q; those are held."""
            held: list[Any] = []

            def got() -> bool:
                msgs = poll()
                if any(m.partition() == q for m in msgs):
                    held.extend(msgs)
                    return True
                assert accept(msgs) == set()
                return False

            _wait_for(got, f"records of partition {q}", 60, detail=lambda: [
                line for s in (a, b) for line in s.log_text().splitlines()[-400:]
                if "share" in line or "ownership" in line or "warning" in line][-40:])
            return held

        held = poll_until_partition(p)
        held_p = {(m.partition(), m.offset()) for m in held if m.partition() == p}
        [loaded_by_b] = _load_epochs(b, p)
        assert _stored_leader_epoch(both, share_group, topic_id, p) == loaded_by_b

        # A later leader of p loads its state with its own, higher epoch while b still holds the records
        # acquired: from then on the share coordinator refuses b's write, so its ACCEPT is not confirmed.
        assert _read_as_leader(both, share_group, topic_id, p, loaded_by_b + 1) == ErrorCode.NONE
        assert p in accept(held)
        assert not held_p & ledger.confirmed

        # b dropped the partition; loading it again it goes above the epoch recorded, and the records come back.
        _wait_for(lambda: accept(poll()) == set() and held_p <= ledger.confirmed, "the refused records to come back")
        assert _load_epochs(b, p)[-1] > loaded_by_b + 1

        # Ownership moves for real: b leaves, a leads p and loads it above every epoch b used.
        b.stop()
        _wait_for(lambda: _view(a, topic) == ({1}, dict.fromkeys(range(4), 1)), "a to lead every partition")
        produced |= {(q, o) for q, o, _ in produce(upstream.bootstrap, topic, 8, partitions=4, prefix="after")}
        _wait_for(lambda: accept(poll()) == set() and produced <= ledger.confirmed, "every record to be accepted")
        assert _load_epochs(a, p)[-1] > _load_epochs(b, p)[-1]
        assert ledger.redelivered_after_accept == []
    finally:
        if consumer is not None:
            consumer.close()
        b.stop()
        a.stop()
