"""ShareFetch and ShareAcknowledge handlers of a real broker started in-process, driven through the wire
codec: acknowledgements and session-close releases of several partitions are written at once, and a
long poll does not miss a produce that lands while it looks at its partitions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.common.config import BrokerConfig, Listener
from shoal.broker.common.purgatory import LogKey
from shoal.broker.network.connection import KafkaConnection, RequestContext
from shoal.broker.server.server import Broker
from shoal.broker.share.share_partition_leader import SharePartitionLeader
from shoal.persister.persister import Persister, ReadStateResult, SharePartitionKey, WriteStateRequest
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .test_partition_log import append, make_batch

GROUP, MEMBER, TOPIC = "g1", "member-1", "orders"
ACCEPT, RELEASE = 1, 2
Req = messages.ShareFetchRequest
AckReq = messages.ShareAcknowledgeRequest


class WriteConcurrency:
    """The broker's own persister, noting how many WriteShareGroupState calls are under way at once."""

    def __init__(self, inner: Persister):
        self.inner = inner
        self.in_flight = 0
        self.most = 0
        # Runs at the start of every write, before the state reaches the coordinator.
        self.before_write: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_state(self, request: WriteStateRequest) -> int:
        if self.before_write is not None:
            await self.before_write()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            return await self.inner.write_state(request)
        finally:
            self.in_flight -= 1


@dataclass
class Running:
    broker: Broker
    topic_id: bytes
    writes: WriteConcurrency
    conn: KafkaConnection
    epoch: int = 0

    async def call(self, api_key: int, req: Any) -> Any:
        # Through the real wire codec both ways, as a client would see it.
        _, decoded = messages.decode_request(messages.encode_request(req, api_key, 1, 7, "test"))
        ctx = RequestContext(messages.RequestHeader(api_key, 1, 7, "test"), self.conn)
        resp = await self.broker.apis[api_key].handler(ctx, decoded)
        framed = messages.encode_response(resp, api_key, 1, 7)
        return messages.decode_response(framed[4:], api_key, 1)[1]

    async def fetch(self, acks: dict[int, tuple[int, int, int]] | None = None, *, max_records: int = 500,
                    max_wait_ms: int = 0) -> Any:
        acks = acks or {}
        resp = await self.call(ApiKey.SHARE_FETCH, Req(
            group_id=GROUP, member_id=MEMBER, share_session_epoch=self.epoch, max_wait_ms=max_wait_ms,
            min_bytes=1, max_bytes=1 << 20, max_records=max_records, batch_size=500,
            topics=[Req.FetchTopic(topic_id=self.topic_id, partitions=[  # type: ignore[attr-defined]
                Req.FetchPartition(partition_index=p, acknowledgement_batches=[  # type: ignore[attr-defined]
                    Req.AcknowledgementBatch(first_offset=a[0], last_offset=a[1],  # type: ignore[attr-defined]
                                             acknowledge_types=[a[2]])] if (a := acks.get(p)) else [])
                for p in (0, 1)])],
            forgotten_topics_data=[]))
        assert resp.error_code == ErrorCode.NONE
        self.epoch += 1
        return resp

    def append(self, partition: int, count: int) -> None:
        """Records land in the log and the broker is told, as a produce does."""
        topic = self.broker.topics.get(TOPIC)
        assert topic is not None
        append(topic.partitions[partition], make_batch([b"v"] * count))
        self.broker.purgatory.notify(LogKey(self.topic_id, partition))


def acquired(resp: Any) -> dict[int, list[tuple[int, int, int]]]:
    return {p.partition_index: [(r.first_offset, r.last_offset, r.delivery_count) for r in p.acquired_records]
            for t in resp.responses for p in t.partitions if p.acquired_records}


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    broker = Broker(BrokerConfig.from_strings({
        "log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0", "offsets.topic.num.partitions": "1",
        "share.coordinator.state.topic.num.partitions": "8",
    }))
    await broker.start()
    topic = broker.topics.create(TOPIC, 2)
    writes = WriteConcurrency(broker.persister)
    broker.share_partitions.persister = writes  # leaders are made on first use, with this persister
    for p in (0, 1):
        # What the group coordinator does when the partitions are first assigned.
        assert await broker.persister.initialize_state(SharePartitionKey(GROUP, topic.topic_id, p), 0, 0) == 0
    conn = KafkaConnection(broker, Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0))
    yield Running(broker, topic.topic_id, writes, conn)
    await broker.stop()


async def test_acknowledgements_and_session_close_write_all_partitions_at_once(running: Running) -> None:
    for p in (0, 1):
        running.append(p, 5)
    assert acquired(await running.fetch()) == {0: [(0, 4, 1)], 1: [(0, 4, 1)]}
    resp = await running.fetch({0: (0, 4, RELEASE), 1: (0, 4, RELEASE)}, max_records=0)
    assert [p.acknowledge_error_code for t in resp.responses for p in t.partitions] == [0, 0]
    assert running.writes.most == 2
    assert acquired(await running.fetch()) == {0: [(0, 4, 2)], 1: [(0, 4, 2)]}
    running.writes.most = 0
    resp = await running.call(ApiKey.SHARE_ACKNOWLEDGE, AckReq(
        group_id=GROUP, member_id=MEMBER, share_session_epoch=-1, topics=[]))
    assert resp.error_code == ErrorCode.NONE
    assert running.writes.most == 2  # the releases of both partitions went out together


async def test_a_produce_during_the_partition_scan_wakes_the_long_poll(running: Running) -> None:
    assert acquired(await running.fetch()) == {}  # opens the session, loads both share partitions
    scanned: list[int] = []

    def during_scan(leader: SharePartitionLeader) -> Callable[..., Any]:
        original = leader.acquire

        async def acquire(*args: Any, **kwargs: Any) -> Any:
            scanned.append(leader.key.partition)
            if len(scanned) == 2:
                running.append(scanned[0], 3)  # lands on the partition this pass already found empty
            return await original(*args, **kwargs)

        return acquire

    for p in (0, 1):
        leader = running.broker.share_partitions.get(SharePartitionKey(GROUP, running.topic_id, p))
        leader.acquire = during_scan(leader)  # type: ignore[method-assign]
    # MaxWaitMs far beyond the bound below: only the produce can end this long poll in time.
    resp = await asyncio.wait_for(running.fetch(max_wait_ms=600_000), timeout=60)
    assert acquired(resp) == {scanned[0]: [(0, 2, 1)]}


async def during_acknowledgement_write(running: Running, partition: int, count: int) -> None:
    """From the next state write on: once the fetch's first acquisition pass over `partition` is done,
    `count` records land there, then the write goes on."""
    leader = running.broker.share_partitions.get(SharePartitionKey(GROUP, running.topic_id, partition))
    assert leader is not None
    original = leader.acquire
    passed = asyncio.Event()

    async def acquire(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        finally:
            passed.set()

    async def before_write() -> None:
        running.writes.before_write = None
        await passed.wait()
        running.append(partition, count)

    leader.acquire = acquire  # type: ignore[method-assign]
    running.writes.before_write = before_write


async def test_records_produced_during_the_acknowledgement_write_ride_its_response(running: Running) -> None:
    running.append(0, 5)
    assert acquired(await running.fetch()) == {0: [(0, 4, 1)]}
    await during_acknowledgement_write(running, 0, 3)
    # The first pass found nothing new; the response waits for the ACCEPT's write, and so do records 5-7.
    resp = await running.fetch({0: (0, 4, ACCEPT)})
    assert [p.acknowledge_error_code for t in resp.responses for p in t.partitions if p.partition_index == 0] == [0]
    assert acquired(resp) == {0: [(5, 7, 1)]}
    # Handed out once: the next fetch acquires nothing.
    assert acquired(await running.fetch({0: (5, 7, ACCEPT)})) == {}


async def test_a_release_is_not_topped_up_with_records_produced_during_its_write(running: Running) -> None:
    running.append(0, 5)
    assert acquired(await running.fetch()) == {0: [(0, 4, 1)]}
    await during_acknowledgement_write(running, 0, 3)
    # The released records are available once written; as in Kafka they are not handed back in this response.
    assert acquired(await running.fetch({0: (0, 4, RELEASE)})) == {}
    assert acquired(await running.fetch()) == {0: [(0, 4, 2), (5, 7, 1)]}


class LoadConcurrency:
    """The broker's own persister, where the first share partition's state read waits (a bounded while) for
    a second one to start, and notes how many were under way at once."""

    def __init__(self, inner: Persister):
        self.inner = inner
        self.in_flight = 0
        self.most = 0
        self.second = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read_state(self, key: SharePartitionKey, leader_epoch: int) -> ReadStateResult:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if self.in_flight == 1:
                try:
                    await asyncio.wait_for(self.second.wait(), 5)
                except TimeoutError:
                    pass  # loaded one after another: the assertion below says so
            else:
                self.second.set()
            return await self.inner.read_state(key, leader_epoch)
        finally:
            self.in_flight -= 1


async def test_a_first_fetch_loads_its_share_partitions_side_by_side(running: Running) -> None:
    loads = LoadConcurrency(running.broker.persister)
    running.broker.share_partitions.persister = loads
    for p in (0, 1):
        running.append(p, 2)
    assert acquired(await running.fetch()) == {0: [(0, 1, 1)], 1: [(0, 1, 1)]}
    assert loads.most == 2
