"""The transaction-completion task of an in-process broker when a topic of the transaction is deleted
while its marker is being written: the transaction still completes, and the group offset it committed
becomes stable (OffsetFetch with RequireStable stops answering UNSTABLE_OFFSET_COMMIT).

The deletion runs right after the marker was appended and before its flush ran: the completion task
yields to the event loop between the two, and this test's task runs in that gap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.broker.common.config import BrokerConfig
from shoal.broker.server.server import Broker
from shoal.coordinator.classic_coordinator import OffsetToCommit
from shoal.coordinator.transaction_log import TxnState
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = BrokerConfig.from_strings({
        "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "metrics.port": "-1",
        "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
    })
    b = Broker(config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.mark.parametrize("segment_bytes", ["1073741824", "14"])  # "14": every marker rolls a segment
async def test_a_topic_deleted_while_its_marker_is_written(broker: Broker, segment_bytes: str) -> None:
    doomed = broker.topics.create("doomed", 1, {"segment.bytes": segment_bytes})
    kept = broker.topics.create("kept", 1)
    for topic in (doomed, kept):
        broker.on_topic_created(topic)
    coord = broker.transaction_coordinator
    init = await coord.init_producer_id("tx", 30_000)
    pid, epoch = init.producer_id, init.producer_epoch
    assert await coord.add_partitions("tx", pid, epoch, [("doomed", 0), ("kept", 0)]) == ErrorCode.NONE
    assert await coord.add_offsets("tx", pid, epoch, "grp") == ErrorCode.NONE
    for topic in (doomed, kept):
        batch = bytearray(encode_batch([RecordInput(value=b"x")], producer_id=pid, producer_epoch=epoch,
                                       base_sequence=0, is_transactional=True))
        topic.partitions[0].append(batch, list(iter_batches(batch)))
    groups = broker.group_coordinator
    assert await groups.commit_transactional_offsets("grp", pid, epoch, "", None, -1,
                                                     [OffsetToCommit("kept", 0, 5, -1, "")]) == (0, [0])
    assert groups.has_pending_offset("grp", "kept", 0)

    doomed_log = doomed.partitions[0]
    end = doomed_log.log_end_offset
    assert await coord.end_txn("tx", pid, epoch, True) == ErrorCode.NONE
    while doomed_log.log_end_offset == end:
        await asyncio.sleep(0)
    broker.delete_topic(doomed)  # its marker is appended; its flush has not run yet

    async def completed() -> None:
        while coord.describe("tx").state != TxnState.COMPLETE_COMMIT:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(completed(), 60)
    assert not groups.has_pending_offset("grp", "kept", 0)
    assert groups.fetch_offsets("grp", None, -1, [("kept", [0])])[1][0][2].offset == 5  # type: ignore[union-attr]
    kept_log = kept.partitions[0]
    assert kept_log.last_stable_offset == kept_log.log_end_offset
