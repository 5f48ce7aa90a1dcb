"""A Fetch response's byte limits, as Kafka's ReplicaManager.readFromLog applies them: until some partition
returned records, the next one's first batch is returned whole even past PartitionMaxBytes and MaxBytes (a
batch larger than the limits must not stall a consumer); after that every partition gets whole batches within
min(its PartitionMaxBytes, what is left of MaxBytes), and nothing when its next batch does not fit. Shoal never
cuts a batch: where Kafka sends a partial last batch for the client to drop, Shoal stops before it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.broker.server.server import Broker
from shoal.broker.storage.partition_log import PartitionLog
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches

from .fetch_calls import fetch, fetch_request, running_broker
from .test_partition_log import append, make_batch

TOPIC = "fetch-limits"
SMALL = [b"s" * 100]
BIG = [b"b" * 3000]


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async for b in running_broker(tmp_path):
        b.topics.create(TOPIC, 3)
        yield b


def plog(broker: Broker, partition: int) -> PartitionLog:
    topic = broker.topics.get(TOPIC)
    assert topic is not None
    return topic.partitions[partition]


def fill(broker: Broker, partition: int, *batches: list[bytes]) -> list[int]:
    """Append one log batch per item; returns each stored batch's size in bytes."""
    _, stored = append(plog(broker, partition), *(make_batch(values) for values in batches))
    return [header.size for _, header in iter_batches(stored)]


def batch_offsets(records: bytes | None) -> list[int]:
    """Base offsets of the batches in a partition's records, which must all be whole."""
    data = records or b""
    found = list(iter_batches(data, check_crc=True))
    assert sum(h.size for _, h in found) == len(data), "a batch was cut"
    return [h.base_offset for _, h in found]


async def partitions(broker: Broker, parts: list[tuple[int, int, int]], *, max_bytes: int = 1 << 20,
                     ) -> list[messages.FetchResponse.PartitionData]:
    out = await fetch(broker, fetch_request(TOPIC, parts, max_bytes=max_bytes))
    assert out.error_code == ErrorCode.NONE
    return list(out.responses[0].partitions)


async def test_first_batch_is_returned_whole_past_both_limits(broker: Broker) -> None:
    big, _small = fill(broker, 0, BIG, SMALL)
    fill(broker, 1, BIG)
    p0, p1 = await partitions(broker, [(0, 0, 100), (1, 0, 100)], max_bytes=100)
    assert batch_offsets(p0.records) == [0] and len(p0.records or b"") == big
    # Nothing left of MaxBytes: the next partition's batch waits for a later fetch.
    assert (p1.error_code, p1.high_watermark, batch_offsets(p1.records)) == (ErrorCode.NONE, 1, [])


async def test_a_later_partition_gets_nothing_when_its_first_batch_is_over_its_limit(broker: Broker) -> None:
    fill(broker, 0, SMALL)
    fill(broker, 1, BIG)
    fill(broker, 2, SMALL)
    # MaxBytes has room for the big batch, but partition 1's own limit does not: Kafka returns it empty,
    # and reads on past it.
    p0, p1, p2 = await partitions(broker, [(0, 0, 1000), (1, 0, 1000), (2, 0, 1000)])
    assert batch_offsets(p0.records) == [0]
    assert (p1.error_code, p1.high_watermark, batch_offsets(p1.records)) == (ErrorCode.NONE, 1, [])
    assert batch_offsets(p2.records) == [0]


async def test_the_first_batch_rule_carries_past_partitions_with_nothing_to_return(broker: Broker) -> None:
    fill(broker, 0, SMALL)
    big, = fill(broker, 1, BIG)
    # Partition 0 is read at its end: nothing returned, so partition 1 still gets one batch past its limit.
    p0, p1 = await partitions(broker, [(0, 1, 100), (1, 0, 100)])
    assert batch_offsets(p0.records) == []
    assert batch_offsets(p1.records) == [0] and len(p1.records or b"") == big


async def test_partition_limit_returns_whole_batches_only(broker: Broker) -> None:
    size, _, _ = fill(broker, 0, SMALL, SMALL, SMALL)
    p0, = await partitions(broker, [(0, 0, size * 5 // 2)])
    assert batch_offsets(p0.records) == [0, 1]


async def test_max_bytes_is_shared_by_the_partitions_in_request_order(broker: Broker) -> None:
    size, _ = fill(broker, 0, SMALL, SMALL)
    fill(broker, 1, SMALL, SMALL)
    fill(broker, 2, SMALL)
    p0, p1, p2 = await partitions(broker, [(0, 0, 1 << 20), (1, 0, 1 << 20), (2, 0, 1 << 20)],
                                  max_bytes=size * 7 // 2)
    assert (batch_offsets(p0.records), batch_offsets(p1.records), batch_offsets(p2.records)) == ([0, 1], [0], [])


async def test_a_partition_past_the_limits_still_reports_an_offset_out_of_range(broker: Broker) -> None:
    size, = fill(broker, 0, SMALL)
    fill(broker, 1, SMALL)
    p0, p1 = await partitions(broker, [(0, 0, 1 << 20), (1, 5, 1 << 20)], max_bytes=size)
    assert batch_offsets(p0.records) == [0]
    assert p1.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
