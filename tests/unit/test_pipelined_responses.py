"""Requests pipelined on one connection are answered in request order, whichever way their handlers finish:
a Produce with acks=all waits for its fsync in a task, one with acks=1 answers at once without a task,
acks=0 is not answered, and responses that complete together leave in one write.

An in-process broker on a loopback port; a raw socket client sends every request in one write before
reading any answer.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.common.config import BrokerConfig
from shoal.broker.server.server import Broker
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch
from tests.integration.kafka_wire import WireClient

TOPIC = "pipelined"
PRODUCE_VERSION = 9
Produce = messages.ProduceRequest


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(BrokerConfig.from_strings({
        "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "metrics.port": "-1",
        "offsets.topic.num.partitions": "1", "share.coordinator.state.topic.num.partitions": "1",
    }))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def produce(acks: int, records: int) -> Any:
    batch = encode_batch([RecordInput(value=b"v%d" % i) for i in range(records)])
    return Produce(acks=acks, timeout_ms=10_000, topic_data=[Produce.TopicProduceData(  # type: ignore[attr-defined]
        name=TOPIC, partition_data=[Produce.PartitionProduceData(index=0, records=batch)])])  # type: ignore[attr-defined]


def exchange(port: int) -> list[tuple[int, Any]]:
    """Send every request in one write, then read the answers in the order they come."""
    requests: list[tuple[int, int, Any]] = [
        (ApiKey.PRODUCE, PRODUCE_VERSION, produce(-1, 2)),  # offsets 0-1, answered after the fsync
        (ApiKey.PRODUCE, PRODUCE_VERSION, produce(1, 1)),  # offset 2
        (ApiKey.PRODUCE, PRODUCE_VERSION, produce(0, 3)),  # offsets 3-5, no answer
        (ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(client_software_name="t", client_software_version="1")),
        (ApiKey.PRODUCE, PRODUCE_VERSION, produce(-1, 1)),  # offset 6
        (ApiKey.PRODUCE, PRODUCE_VERSION, produce(1, 1)),  # offset 7
    ]
    with WireClient("127.0.0.1", port, client_id="pipelined") as client:
        frames = b""
        for correlation, (key, version, body) in enumerate(requests, start=1):
            frame = messages.encode_request(body, key, version, correlation, client.client_id)
            frames += struct.pack(">i", len(frame)) + bytes(frame)
        client.sock.sendall(frames)
        answered = [(c, k, v) for c, (k, v, body) in enumerate(requests, start=1)
                    if not (k == ApiKey.PRODUCE and body.acks == 0)]
        out = []
        for correlation, key, version in answered:
            got, response = client.receive(key, version)
            out.append((got, response))
            assert got == correlation, f"answer {got} came where {correlation} was due"
        return out


async def test_pipelined_requests_are_answered_in_order(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1)
    answers = await asyncio.to_thread(exchange, broker.bound[0].port)
    assert [c for c, _r in answers] == [1, 2, 4, 5, 6]
    produced = [r.responses[0].partition_responses[0] for c, r in answers if c != 4]
    assert [(p.error_code, p.base_offset) for p in produced] == [(ErrorCode.NONE, 0), (ErrorCode.NONE, 2),
                                                                  (ErrorCode.NONE, 6), (ErrorCode.NONE, 7)]
    topic = broker.topics.get(TOPIC)
    assert topic is not None
    plog = topic.partitions[0]
    assert plog.log_end_offset == 8
    assert plog.flushed_offset >= 7  # the second acks=all answer came after its records were fsynced
