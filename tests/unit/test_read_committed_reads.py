"""read_committed reads (librdkafka's default isolation level) of a partition that never saw a transaction:
they list no aborted transactions and do not build the partition's producer state, which would read up to
64 MiB of its log inside the request (the first Fetch of a consumer after a restart stalled on it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.broker.server.server import Broker
from shoal.broker.storage.partition_log import PartitionLog
from shoal.broker.storage.partition_source import LocalPartitionSource
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .fetch_calls import fetch, fetch_request, running_broker
from .test_partition_log import append, make_batch

TOPIC = "committed-reads"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async for b in running_broker(tmp_path):
        yield b


async def fetch_committed(broker: Broker) -> messages.FetchResponse.PartitionData:
    """A read_committed Fetch of partition 0 from offset 0."""
    out = await fetch(broker, fetch_request(TOPIC, [(0, 0, 1 << 20)], isolation_level=1))
    assert out.error_code == ErrorCode.NONE
    return out.responses[0].partitions[0]  # type: ignore[no-any-return]


def partition(broker: Broker) -> PartitionLog:
    topic = broker.topics.get(TOPIC)
    assert topic is not None
    return topic.partitions[0]


async def test_fetch_without_transactions_leaves_the_producer_state_unbuilt(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1)
    plog = partition(broker)
    append(plog, make_batch([b"a", b"b"]), make_batch([b"c"]))
    pd = await fetch_committed(broker)
    assert (pd.error_code, pd.high_watermark, pd.last_stable_offset) == (ErrorCode.NONE, 3, 3)
    assert pd.records and pd.aborted_transactions == []
    assert plog._producer_state is None


async def test_share_read_without_transactions_leaves_the_producer_state_unbuilt(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1)
    plog = partition(broker)
    append(plog, make_batch([b"a", b"b"]))
    read = await LocalPartitionSource(plog).read(0, 1 << 20, read_committed=True)
    assert [h.records_count for h, _data in read.batches] == [2]
    assert read.aborted == []
    assert plog._producer_state is None


async def test_an_aborted_transaction_is_still_listed(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1)
    plog = partition(broker)
    plog.append_as_leader(encode_batch([RecordInput(value=b"t")], producer_id=9, producer_epoch=0, base_sequence=0,
                                       is_transactional=True), transactional_id="tx")
    plog.append_marker(producer_id=9, producer_epoch=0, commit=False, coordinator_epoch=0, timestamp_ms=1000)
    pd = await fetch_committed(broker)
    assert [(t.producer_id, t.first_offset) for t in pd.aborted_transactions or []] == [(9, 0)]
    read = await LocalPartitionSource(plog).read(0, 1 << 20, read_committed=True)
    assert read.aborted == [(9, 0)]
