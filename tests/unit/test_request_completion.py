"""Work a request started runs to completion when its client disconnects (Kafka semantics).

An in-process broker on a loopback port; a raw socket client sends a request and goes away while the
request is part way through its share-state write. The write is held mid-flight by holding that key in
the share coordinator's own partition gate, so the interleaving is exact rather than a race.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.common.config import BrokerConfig
from shoal.broker.common.purgatory import LogKey
from shoal.broker.server.server import Broker
from shoal.broker.share.group_configs import validation_context
from shoal.broker.share.share_partition import RecordState
from shoal.broker.storage.topic_registry import Topic
from shoal.persister.persister import SharePartitionKey
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch
from tests.integration.kafka_wire import WireClient

GROUP, MEMBER = "g-complete", "m-complete-0000000000000000000000001"
ACCEPT = 1
Req = messages.ShareFetchRequest
AckReq = messages.ShareAcknowledgeRequest


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = BrokerConfig.from_strings({
        "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "metrics.port": "-1",
        "offsets.topic.num.partitions": "1", "share.coordinator.state.topic.num.partitions": "1",
    })
    b = Broker(config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def produce(broker: Broker, topic: str, partition: int, count: int) -> None:
    t = broker.topics.get(topic)
    assert t is not None
    batch = bytearray(encode_batch([RecordInput(key=None, value=b"v%d" % i) for i in range(count)]))
    t.partitions[partition].append(batch, list(iter_batches(batch)))


def fetch_body(topic_id: bytes, partitions: list[int], epoch: int) -> Any:
    return Req(group_id=GROUP, member_id=MEMBER, share_session_epoch=epoch, max_wait_ms=0, min_bytes=1,
               max_bytes=1 << 20, max_records=500, batch_size=500, forgotten_topics_data=[],
               topics=[Req.FetchTopic(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
                   Req.FetchPartition(partition_index=p, acknowledgement_batches=[])  # type: ignore[attr-defined]
                   for p in partitions])])


def ack_body(topic_id: bytes, partition: int, first: int, last: int, epoch: int) -> Any:
    return AckReq(group_id=GROUP, member_id=MEMBER, share_session_epoch=epoch, topics=[
        AckReq.AcknowledgeTopic(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
            AckReq.AcknowledgePartition(partition_index=partition, acknowledgement_batches=[  # type: ignore[attr-defined]
                AckReq.AcknowledgementBatch(first_offset=first, last_offset=last,  # type: ignore[attr-defined]
                                            acknowledge_types=[ACCEPT])])])])


async def until(condition: Callable[[], bool]) -> None:
    """Let the broker's loop run until `condition` holds (bounded, so a broken broker fails, not hangs)."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


async def join(client: WireClient, topic: str, topic_id: bytes, partitions: list[int]) -> None:
    """ShareGroupHeartbeat until the member is assigned every partition (their share state is initialised)."""
    epoch = 0
    names: list[str] | None = [topic]
    for _ in range(200):
        body = messages.ShareGroupHeartbeatRequest(group_id=GROUP, member_id=MEMBER, member_epoch=epoch,
                                                   rack_id=None, subscribed_topic_names=names)
        resp = await asyncio.to_thread(client.request, ApiKey.SHARE_GROUP_HEARTBEAT, 1, body)
        assert resp.error_code == ErrorCode.NONE, resp.error_message
        epoch, names = resp.member_epoch, None
        assigned = {p for tp in (resp.assignment.topic_partitions if resp.assignment else [])
                    if tp.topic_id == topic_id for p in tp.partitions}
        if assigned == set(partitions):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never assigned")


async def acquire_everything(broker: Broker, client: WireClient, topic_id: bytes, partitions: list[int],
                             records: int) -> None:
    """Join, open a share session, then acquire `records` records on each partition."""
    topic = broker.topics.get_by_id(topic_id)
    assert topic is not None
    await join(client, topic.name, topic_id, partitions)
    resp = await asyncio.to_thread(client.request, ApiKey.SHARE_FETCH, 1, fetch_body(topic_id, partitions, 0))
    assert resp.error_code == ErrorCode.NONE
    for p in partitions:
        produce(broker, topic.name, p, records)
    resp = await asyncio.to_thread(client.request, ApiKey.SHARE_FETCH, 1, fetch_body(topic_id, partitions, 1))
    got = {p.partition_index: [(r.first_offset, r.last_offset) for r in p.acquired_records]
           for t in resp.responses for p in t.partitions}
    assert got == {p: [(0, records - 1)] for p in partitions}


async def member_holding(broker: Broker, name: str, partitions: int, records: int) -> tuple[Topic, WireClient]:
    """A topic, and a member on a raw connection that acquired `records` records on each of its partitions."""
    topic = broker.topics.create(name, partitions)
    broker.on_topic_created(topic)
    broker.group_configs.apply(GROUP, [("share.auto.offset.reset", "earliest")],
                               validation_context(broker.config, broker.topics))
    client = await asyncio.to_thread(WireClient, "127.0.0.1", broker.bound[0].port)
    await acquire_everything(broker, client, topic.topic_id, list(range(partitions)), records)
    return topic, client


@contextlib.asynccontextmanager
async def write_held(broker: Broker, key: SharePartitionKey) -> AsyncIterator[None]:
    """Hold `key` in the share coordinator: a state write for it waits until the block ends."""
    coordinator = broker.share_coordinator
    async with coordinator.runtime.hold(coordinator.partition_for(key), key):
        yield


def states(broker: Broker, key: SharePartitionKey, count: int) -> list[RecordState]:
    leader = broker.share_partitions.get(key)
    assert leader is not None and leader.state is not None
    out = []
    for offset in range(count):
        found = leader.state.offset_state(offset)
        out.append(RecordState.AVAILABLE if found is None else found[0])
    return out


def durable_batches(broker: Broker, key: SharePartitionKey) -> list[tuple[int, int, int, int]]:
    """The share coordinator's durable state batches of a share partition."""
    coordinator = broker.share_coordinator
    durable = coordinator.maps[coordinator.partition_for(key)].get(key)
    assert durable is not None
    return [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in durable.state_batches]


def start_offsets(broker: Broker, key: SharePartitionKey) -> tuple[int, int]:
    """(SPSO in the leader's memory, SPSO the share coordinator holds durably)."""
    coordinator = broker.share_coordinator
    durable = coordinator.maps[coordinator.partition_for(key)].get(key)
    leader = broker.share_partitions.get(key)
    assert durable is not None and leader is not None and leader.state is not None
    return leader.state.start_offset, durable.start_offset


async def test_acknowledgement_finishes_after_its_client_disconnects(broker: Broker) -> None:
    topic, client = await member_holding(broker, "complete-ack", 1, 5)
    key = SharePartitionKey(GROUP, topic.topic_id, 0)
    leader = broker.share_partitions.get(key)
    assert leader is not None
    async with write_held(broker, key):
        await asyncio.to_thread(client.send, ApiKey.SHARE_ACKNOWLEDGE, 1, ack_body(topic.topic_id, 0, 0, 4, 2))
        await until(lambda: leader.writes_in_flight > 0)  # the acknowledgement is applied, its write waits
        await asyncio.to_thread(client.close)
        await until(lambda: not broker.connections)
        assert start_offsets(broker, key) == (5, 0)  # applied in memory, not yet written
    # The write goes ahead once the key is free, and memory and the state topic agree.
    await until(lambda: leader.writes_in_flight == 0)
    assert start_offsets(broker, key) == (5, 5)


async def test_session_close_releases_every_partition_when_its_client_disconnects(broker: Broker) -> None:
    topic, client = await member_holding(broker, "complete-close", 3, 4)
    keys = [SharePartitionKey(GROUP, topic.topic_id, p) for p in range(3)]
    first = broker.share_partitions.get(keys[0])
    assert first is not None
    async with write_held(broker, keys[0]):
        # Close the session (epoch -1) and go away while the first partition's release is being written.
        await asyncio.to_thread(client.send, ApiKey.SHARE_FETCH, 1, fetch_body(topic.topic_id, [], -1))
        await until(lambda: first.writes_in_flight > 0)
        await asyncio.to_thread(client.close)
        await until(lambda: not broker.connections)
        # The other partitions were released at the same time, not one after another.
        for key in keys[1:]:
            await until(lambda key=key: states(broker, key, 4) == [RecordState.AVAILABLE] * 4)  # type: ignore[misc]
    # Every release written, the group has no session left on this broker: its share partitions are
    # forgotten, and what is durable has the records back, AVAILABLE.
    await until(lambda: all(broker.share_partitions.get(key) is None for key in keys))
    for key in keys:
        assert durable_batches(broker, key) == [(0, 3, RecordState.AVAILABLE, 1)]


async def test_long_polls_end_with_their_connection(broker: Broker) -> None:
    topic = broker.topics.create("complete-poll", 1)
    broker.on_topic_created(topic)
    client = await asyncio.to_thread(WireClient, "127.0.0.1", broker.bound[0].port)
    fr = messages.FetchRequest
    await asyncio.to_thread(client.send, ApiKey.FETCH, 12, fr(
        replica_id=-1, max_wait_ms=60_000, min_bytes=1 << 20, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, forgotten_topics_data=[], rack_id="", topics=[fr.FetchTopic(  # type: ignore[attr-defined]
            topic=topic.name, partitions=[fr.FetchPartition(  # type: ignore[attr-defined]
                partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]))
    await until(lambda: len(broker._requests) == 1)
    await asyncio.to_thread(client.close)
    await until(lambda: not broker._requests)  # long before its minute is up


async def test_records_acquired_for_a_vanished_connection_are_released(broker: Broker) -> None:
    topic, client = await member_holding(broker, "complete-vanished", 1, 2)
    key = SharePartitionKey(GROUP, topic.topic_id, 0)
    leader = broker.share_partitions.get(key)
    assert leader is not None and leader.state is not None
    resp = await asyncio.to_thread(client.request, ApiKey.SHARE_ACKNOWLEDGE, 1, ack_body(topic.topic_id, 0, 0, 1, 2))
    assert resp.error_code == ErrorCode.NONE
    poll = fetch_body(topic.topic_id, [0], 3)
    poll.max_wait_ms = 60_000
    await asyncio.to_thread(client.send, ApiKey.SHARE_FETCH, 1, poll)
    await until(lambda: len(broker._requests) == 1)
    async with leader.lock:
        # New records wake the parked ShareFetch; it waits for the partition while its client goes away.
        produce(broker, topic.name, 0, 3)
        broker.purgatory.notify(LogKey(topic.topic_id, 0))
        await asyncio.to_thread(client.close)
        await until(lambda: not broker.connections)
    await until(lambda: not broker._requests)
    # Its acquisition cannot be delivered, so it was handed back rather than locked for a lock duration
    # (durably; the group has no session left here, so its share partition is then forgotten).
    await until(lambda: broker.share_partitions.get(key) is None)
    assert durable_batches(broker, key) == [(2, 4, RecordState.AVAILABLE, 1)]
