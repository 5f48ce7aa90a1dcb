"""The log seam's local side: `LocalPartitionSource` over a real `PartitionLog`, and which batches a reader
must not hand out under read_committed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.partition_source import LocalPartitionSource, OffsetOutOfRange, undeliverable
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch


def _append(plog: PartitionLog, batch: bytes) -> None:
    buf = bytearray(batch)
    plog.append(buf, list(iter_batches(buf, check_crc=True)))


def _txn(producer_id: int, values: list[bytes], seq: int) -> bytes:
    return encode_batch([RecordInput(None, v) for v in values], producer_id=producer_id, producer_epoch=0,
                        base_sequence=seq, is_transactional=True)


def test_local_source_reads_the_log_bytes_and_its_watermarks(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=300))
    for i in range(20):
        _append(plog, encode_batch([RecordInput(None, f"v{i}".encode())]))
    source = LocalPartitionSource(plog)
    read = asyncio.run(source.read(5, 10_000))
    assert [h.base_offset for h, _ in read.batches] == list(range(5, 20))
    assert b"".join(bytes(v) for _, v in read.batches) == plog.read(5, 10_000)
    assert (read.high_watermark, read.last_stable_offset, read.log_start_offset) == (20, 20, 0)
    assert asyncio.run(source.read(20, 10_000)).batches == []
    with pytest.raises(OffsetOutOfRange):
        asyncio.run(source.read(21, 10_000))


def test_read_committed_stops_at_the_open_transaction_and_names_the_aborted_one(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
    _append(plog, _txn(1, [b"aborted-a", b"aborted-b"], 0))             # 0-1, producer 1
    _append(plog, encode_batch([RecordInput(None, b"plain")]))          # 2
    plog.append_marker(producer_id=1, producer_epoch=0, commit=False, coordinator_epoch=0, timestamp_ms=0)  # 3
    _append(plog, _txn(2, [b"committed"], 0))                           # 4, producer 2
    plog.append_marker(producer_id=2, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=0)   # 5
    _append(plog, _txn(3, [b"open"], 0))                                # 6, still open
    source = LocalPartitionSource(plog)

    committed = asyncio.run(source.read(0, 1 << 20, read_committed=True))
    assert committed.last_stable_offset == 6
    assert [h.base_offset for h, _ in committed.batches] == [0, 2, 3, 4, 5]
    assert committed.aborted == [(1, 0)]
    assert undeliverable(committed) == {(0, 1), (3, 3), (5, 5)}

    everything = asyncio.run(source.read(0, 1 << 20))
    assert [h.base_offset for h, _ in everything.batches] == [0, 2, 3, 4, 5, 6]
    assert everything.aborted == []
    assert undeliverable(everything) == {(3, 3), (5, 5)}  # markers only: read_uncommitted hands out the rest
