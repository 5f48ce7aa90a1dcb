"""PartitionLog / LogSegment: offsets, segment rolls, crash recovery, retention, group commit."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shoal.broker.storage import fsync_worker, log_segment
from shoal.broker.storage.log_segment import LogSegment
from shoal.broker.storage.partition_log import LogClosed, LogConfig, OffsetOutOfRange, PartitionLog
from shoal.protocol.record_batch import iter_batches

# -- test batch builder (a real v2 batch: header, CRC32C, varint-encoded records) ---------------------


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def make_batch(values: list[bytes], *, base_ts: int = 1000, ts_step: int = 1) -> bytes:
    records = bytearray()
    for i, value in enumerate(values):
        body = (
            b"\x00"
            + _varint(i * ts_step)
            + _varint(i)
            + _varint(-1)
            + _varint(len(value))
            + value
            + _varint(0)
        )
        records += _varint(len(body)) + body
    max_ts = base_ts + (len(values) - 1) * ts_step
    # attributes .. records_count, the span the CRC covers minus the records
    tail = struct.pack(">hiqqqhii", 0, len(values) - 1, base_ts, max_ts, -1, -1, -1, len(values)) + records
    crc = crc32c.crc32c(tail)
    batch_length = 4 + 1 + 4 + len(tail)  # leader epoch + magic + crc + rest
    return struct.pack(">qiibI", 0, batch_length, -1, 2, crc) + tail


def framed(*batches: bytes) -> tuple[bytearray, list]:
    buf = bytearray(b"".join(batches))
    return buf, list(iter_batches(buf, check_crc=True))


def append(plog: PartitionLog, *batches: bytes, **kw: int):
    buf, headers = framed(*batches)
    result = plog.append(buf, headers, **kw)
    return result, bytes(buf)


def cfg(**kw: int) -> LogConfig:
    return LogConfig(**kw)


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data, check_crc=True)]


# -- basics ------------------------------------------------------------------------------------------


def test_append_read_round_trip_across_segment_rolls(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=400, index_interval_bytes=100))
    written = []
    for i in range(60):
        n = 1 + i % 4
        result, stored = append(plog, make_batch([f"v{i}-{j}".encode() * (1 + i % 3) for j in range(n)]))
        assert result.base_offset == plog.log_end_offset - n
        assert result.last_offset == plog.log_end_offset - 1
        assert result.log_append_time == -1
        written.append(stored)
    assert len(plog.segments) > 5
    everything = b"".join(written)
    assert plog.read(0, 1 << 20) == everything
    assert plog.size_bytes() == len(everything)
    # every offset maps to the batch that contains it, even mid-batch and at segment boundaries
    for offset in range(plog.log_end_offset):
        first = offsets_of(plog.read(offset, 1))
        assert len(first) == 1
        assert first[0][0] <= offset <= first[0][1]
    plog.close()


def test_offsets_continue_after_reopen_and_sealed_segments_are_not_rescanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg(segment_bytes=300, index_interval_bytes=64))
    written = [append(plog, make_batch([b"x" * 20, b"y" * 20]))[1] for _ in range(20)]
    end = plog.log_end_offset
    sealed = len(plog.segments) - 1
    plog.close()
    assert len(list(d.glob("*.index"))) == sealed  # indexes of sealed segments reach disk
    assert len(list(d.glob("*.timeindex"))) == sealed

    scans: list[int] = []
    real_recover = LogSegment.recover

    def counting_recover(self: LogSegment) -> int:
        scans.append(self.base_offset)
        return real_recover(self)

    monkeypatch.setattr(LogSegment, "recover", counting_recover)
    plog = PartitionLog.open(d, cfg(segment_bytes=300, index_interval_bytes=64))
    assert scans == [plog.segments[-1].base_offset]  # only the active segment was scanned
    assert plog.log_end_offset == end
    result, stored = append(plog, make_batch([b"z"]))
    assert result.base_offset == end
    assert plog.read(0, 1 << 20) == b"".join(written) + stored
    plog.close()


def test_sealed_segment_without_index_files_is_scanned(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg(segment_bytes=200))
    written = [append(plog, make_batch([b"a" * 30]))[1] for _ in range(10)]
    # Crash before any flush: no loop ran, so the sealed segments' indexes never reached disk.
    for seg in plog.segments:
        seg.close()
    assert not list(d.glob("*.index"))
    plog = PartitionLog.open(d, cfg(segment_bytes=200))
    assert plog.log_end_offset == 10
    assert plog.read(0, 1 << 20) == b"".join(written)
    assert len(list(d.glob("*.index"))) == len(plog.segments) - 1  # rebuilt and persisted
    plog.close()


# -- crash recovery ----------------------------------------------------------------------------------


def _crash(plog: PartitionLog) -> None:
    for seg in plog.segments:
        seg.close()


@pytest.mark.parametrize("damage", ["half_batch", "truncate_mid_batch", "bad_crc", "garbage"])
def test_torn_or_corrupt_tail_is_truncated_on_reopen(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg(segment_bytes=500))
    written = [append(plog, make_batch([b"k" * 40, b"l" * 40]))[1] for _ in range(8)]
    active = plog.active.log_path
    _crash(plog)

    keep = b"".join(written)
    if damage == "half_batch":
        with open(active, "ab") as f:
            f.write(make_batch([b"torn" * 10])[:50])
        expected_end = 16
    elif damage == "truncate_mid_batch":
        os.truncate(active, active.stat().st_size - 10)
        keep = b"".join(written[:-1])
        expected_end = 14
    elif damage == "bad_crc":
        raw = bytearray(active.read_bytes())
        raw[-3] ^= 0xFF  # inside the last record's value
        active.write_bytes(raw)
        keep = b"".join(written[:-1])
        expected_end = 14
    else:
        with open(active, "ab") as f:
            f.write(os.urandom(200))
        expected_end = 16

    plog = PartitionLog.open(d, cfg(segment_bytes=500))
    assert plog.log_end_offset == expected_end
    assert plog.flushed_offset == expected_end
    assert plog.read(0, 1 << 20) == keep
    result, stored = append(plog, make_batch([b"after"]))
    assert result.base_offset == expected_end
    assert plog.read(expected_end, 1 << 20) == stored
    plog.close()
    plog = PartitionLog.open(d, cfg(segment_bytes=500))
    assert plog.log_end_offset == expected_end + 1
    assert plog.read(0, 1 << 20) == keep + stored
    plog.close()


def test_segment_truncate_to_rebuilds_indexes(tmp_path: Path) -> None:
    seg = LogSegment.create(tmp_path, 0, index_interval_bytes=0)
    buf, headers = framed(*(make_batch([b"p"], base_ts=100 + i) for i in range(5)))
    pos = 0
    for i, (_, h) in enumerate(headers):
        h.base_offset = i
        struct.pack_into(">q", buf, pos, i)
        pos += h.size
    seg.append(buf, headers)
    assert seg.next_offset == 5
    cut = seg.position_of(3)
    seg.truncate_to(cut)
    assert (seg.size, seg.next_offset, seg.max_timestamp) == (cut, 3, 102)
    assert seg.position_of(2) == headers[2][0]
    seg.delete()
    assert not list(tmp_path.iterdir())


# -- reads -------------------------------------------------------------------------------------------


def test_read_edges_and_out_of_range(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg())
    assert plog.read(0, 100) == b""
    with pytest.raises(OffsetOutOfRange):
        plog.read(1, 100)
    _, a = append(plog, make_batch([b"a"] * 3))
    _, b = append(plog, make_batch([b"b"] * 2))
    assert plog.read(5, 100) == b""
    with pytest.raises(OffsetOutOfRange):
        plog.read(6, 100)
    with pytest.raises(OffsetOutOfRange):
        plog.read(-1, 100)
    assert plog.read(0, len(a) + len(b) - 1) == a  # whole batches only
    assert plog.read(0, len(a) + len(b)) == a + b
    assert plog.read(1, 10_000, max_offset=3) == a
    assert plog.read(3, 10_000, max_offset=3) == b""
    plog.delete_records_before(3)
    with pytest.raises(OffsetOutOfRange):
        plog.read(2, 100)
    assert plog.read(3, 100) == b
    plog.close()
    with pytest.raises(LogClosed):
        plog.read(3, 100)


def test_read_returns_one_batch_even_when_bigger_than_max_bytes(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=10_000))
    _, big = append(plog, make_batch([os.urandom(200_000)]))  # bigger than a segment and a scan chunk
    _, small = append(plog, make_batch([b"s"]))
    assert len(plog.segments) == 2
    assert plog.read(0, 1) == big
    assert plog.read(0, 0) == big
    assert plog.read(1, 1) == small
    assert plog.read(0, len(big) + len(small)) == big + small
    plog.close()
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=10_000))
    assert plog.read(0, 10) == big
    plog.close()


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40), index_interval=st.sampled_from([0, 100, 4096]),
       data=st.data())
def test_a_read_cuts_at_the_last_whole_batch_within_max_bytes(sizes: list[int], index_interval: int,
                                                             data: st.DataObject) -> None:
    # Many batches in one segment, indexed sparsely or densely: the cut is found from the index, not by
    # walking every batch, and must still be the last batch boundary within max_bytes.
    with tempfile.TemporaryDirectory() as d:
        plog = PartitionLog.open(Path(d), cfg(index_interval_bytes=index_interval))
        stored = [append(plog, make_batch([b"x" * n]))[1] for n in sizes]
        start = data.draw(st.integers(0, len(stored) - 1))
        max_bytes = data.draw(st.integers(0, sum(len(b) for b in stored) + 10))
        expected = stored[start]
        for batch in stored[start + 1:]:
            if len(expected) + len(batch) > max_bytes:
                break
            expected += batch
        assert plog.read(start, max_bytes) == expected
        plog.close()


def test_read_batch_headers_and_log_append_time(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg())
    append(plog, make_batch([b"a", b"b"]))
    result, _ = append(plog, make_batch([b"c"], base_ts=5), log_append_time_ms=123_456)
    assert result.log_append_time == 123_456
    pairs = plog.read_batch_headers(0, 1 << 20)
    assert [(h.base_offset, h.last_offset) for h, _ in pairs] == [(0, 1), (2, 2)]
    assert pairs[1][0].max_timestamp == 123_456 and pairs[1][0].timestamp_type == 1
    for header, data in pairs:
        assert len(data) == header.size
        list(iter_batches(data, check_crc=True))  # CRC still valid after stamping
    assert plog.max_timestamp() == (2, 123_456)
    plog.close()


# -- timestamps --------------------------------------------------------------------------------------


def test_offset_for_timestamp_and_max_timestamp(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    config = cfg(segment_bytes=350, index_interval_bytes=80)
    plog = PartitionLog.open(d, config)
    assert plog.offset_for_timestamp(0) is None
    assert plog.max_timestamp() == (-1, -1)
    # batch i holds offsets 2i, 2i+1 with timestamps 1000+10i, 1000+10i+5
    for i in range(30):
        append(plog, make_batch([b"r" * 10, b"s" * 10], base_ts=1000 + 10 * i, ts_step=5))
    assert len(plog.segments) > 3

    def check(p: PartitionLog) -> None:
        # The first record at or after the timestamp, not the first record of its batch (as Kafka).
        assert p.offset_for_timestamp(0) == (0, 1000)
        assert p.offset_for_timestamp(1001) == (1, 1005)
        assert p.offset_for_timestamp(1005) == (1, 1005)
        assert p.offset_for_timestamp(1006) == (2, 1010)
        assert p.offset_for_timestamp(1150) == (30, 1150)
        assert p.offset_for_timestamp(1151) == (31, 1155)
        assert p.offset_for_timestamp(1295) == (59, 1295)
        assert p.offset_for_timestamp(1296) is None
        assert p.max_timestamp() == (59, 1295)

    check(plog)
    plog.close()
    plog = PartitionLog.open(d, config)  # sealed segments answer from persisted time indexes
    check(plog)
    plog.delete_records_before(41)
    assert plog.offset_for_timestamp(0) == (41, 1205)
    plog.close()


def test_out_of_order_timestamps(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(index_interval_bytes=0))
    for ts in (500, 100, 900, 200, 950):
        append(plog, make_batch([b"v"], base_ts=ts))
    assert plog.offset_for_timestamp(150) == (0, 500)
    assert plog.offset_for_timestamp(600) == (2, 900)
    assert plog.offset_for_timestamp(920) == (4, 950)
    assert plog.max_timestamp() == (4, 950)
    plog.close()


# -- deletion ----------------------------------------------------------------------------------------


def test_delete_records_before_persists_across_reopen(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    config = cfg(segment_bytes=300)
    plog = PartitionLog.open(d, config)
    for _ in range(12):
        append(plog, make_batch([b"d" * 30, b"e" * 30]))
    segments_before = len(plog.segments)
    assert plog.delete_records_before(7) == 7
    assert plog.log_start_offset == 7
    assert len(plog.segments) < segments_before  # whole segments below 7 are gone
    assert plog.delete_records_before(3) == 7  # never moves backwards
    assert offsets_of(plog.read(7, 1))[0] == (6, 7)
    plog.close()

    plog = PartitionLog.open(d, config)
    assert plog.log_start_offset == 7
    with pytest.raises(OffsetOutOfRange):
        plog.read(6, 100)
    assert plog.delete_records_before(10_000) == 24  # clamped to the high watermark
    assert plog.read(24, 100) == b""
    assert len(plog.segments) == 1 and plog.size_bytes() == 0
    result, _ = append(plog, make_batch([b"new"]))
    assert result.base_offset == 24 and result.log_start_offset == 24
    plog.close()
    plog = PartitionLog.open(d, config)
    assert (plog.log_start_offset, plog.log_end_offset) == (24, 25)
    plog.close()


def test_checkpoint_beyond_recovered_end_restarts_log_at_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg())
    for _ in range(5):
        append(plog, make_batch([b"q"]))
    with pytest.raises(OffsetOutOfRange):
        plog.delete_records_before(-2)
    plog.delete_records_before(4)
    active = plog.active.log_path
    _crash(plog)
    os.truncate(active, 10)  # data lost, checkpoint survived
    plog = PartitionLog.open(d, cfg())
    assert (plog.log_start_offset, plog.log_end_offset) == (4, 4)
    assert append(plog, make_batch([b"q"]))[0].base_offset == 4
    plog.close()


def test_delete_records_minus_one_means_high_watermark(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=200))
    for _ in range(6):
        append(plog, make_batch([b"x" * 40] * 2))
    assert plog.delete_records_before(-1) == 12
    assert plog.segments[0].base_offset == 12 and plog.size_bytes() == 0
    assert plog.read(12, 100) == b""
    plog.close()


def test_retention_by_bytes(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=300, retention_bytes=700))
    now = int(time.time() * 1000)
    for _ in range(20):
        append(plog, make_batch([b"b" * 50], base_ts=now))
    total, n = plog.size_bytes(), len(plog.segments)
    deleted = plog.enforce_retention(now_ms=now)
    assert deleted > 0 and len(plog.segments) == n - deleted
    # Like Kafka, keep at least retention.bytes: only segments that fit entirely in the excess go.
    assert 700 <= plog.size_bytes() < 700 + plog.segments[0].size
    assert plog.size_bytes() < total
    assert plog.log_start_offset == plog.segments[0].base_offset > 0
    assert offsets_of(plog.read(plog.log_start_offset, 1))[0][0] == plog.log_start_offset
    plog.close()


def test_retention_by_time_rolls_and_deletes_an_expired_active_segment(tmp_path: Path) -> None:
    # As Kafka does: a log whose every segment, the active one included, is past retention is emptied.
    d = tmp_path / "t-0"
    config = cfg(segment_bytes=200, retention_ms=1000)
    plog = PartitionLog.open(d, config)
    for i in range(12):
        append(plog, make_batch([b"t" * 40], base_ts=10_000 * (i + 1)))
    segs = [(s.base_offset, s.max_timestamp) for s in plog.segments]
    assert len(segs) > 3
    # Expire the segments whose newest record is older than now - retention.
    cutoff = segs[2][1]
    assert plog.enforce_retention(now_ms=cutoff + 1000) == 2  # exactly at the limit is kept
    assert plog.log_start_offset == segs[2][0]
    assert plog.enforce_retention(now_ms=10**12) == len(segs) - 2
    assert len(plog.segments) == 1 and plog.active.size == 0  # a new, empty active segment
    assert plog.log_start_offset == plog.log_end_offset == 12
    start = plog.log_start_offset
    plog.close()
    plog = PartitionLog.open(d, config)
    assert plog.log_start_offset == start and plog.log_end_offset == 12
    plog.close()


def test_delete_removes_directory(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg(segment_bytes=200))
    for _ in range(5):
        append(plog, make_batch([b"x" * 50]))
    plog.delete()
    assert not d.exists()


# -- flush / group commit ----------------------------------------------------------------------------


def executor_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flush rounds fsync with Python's os.fsync in the loop's executor, so a test can hold or fail it;
    the compiled worker that otherwise runs them is tested in test_fsync_worker.py."""
    monkeypatch.setattr(fsync_worker, "for_loop", lambda loop: None)


async def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(segment_bytes=1000))
    in_flight = 0
    max_in_flight = 0
    lock = threading.Lock()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        nonlocal in_flight, max_in_flight
        with lock:
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
        try:
            time.sleep(0.005)
            real_fsync(fd)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(os, "fsync", slow_fsync)

    executor_fsync(monkeypatch)
    base_count = plog.fsync_count
    for _ in range(5):
        append(plog, make_batch([b"g" * 30]))
    await asyncio.gather(*(plog.flush() for _ in range(50)))
    assert plog.fsync_count - base_count == 1
    assert plog.flushed_offset == plog.log_end_offset

    # Appends keep arriving while fsyncs run: each flush still waits for its own data.
    async def produce_and_flush() -> int:
        result, _ = append(plog, make_batch([b"h" * 30]))
        await plog.flush()
        assert plog.flushed_offset > result.last_offset
        return result.last_offset

    base_count = plog.fsync_count
    results = []
    for _ in range(5):
        results += await asyncio.gather(*(produce_and_flush() for _ in range(10)))
        await asyncio.sleep(0)
    assert len(results) == 50
    assert plog.fsync_count - base_count <= 10
    assert max_in_flight == 1
    assert plog.flushed_offset == plog.log_end_offset
    await plog.flush(up_to_offset=3)  # already durable: no new round
    assert plog.fsync_count - base_count <= 10
    plog.close()


async def test_flush_propagates_fsync_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg())
    append(plog, make_batch([b"e"]))

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fsync", failing_fsync)

    executor_fsync(monkeypatch)
    results = await asyncio.gather(*(plog.flush() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)
    assert plog.flushed_offset == 0
    monkeypatch.undo()
    await plog.flush()
    assert plog.flushed_offset == 1
    plog.close()


async def test_durable_waiters_share_rounds_and_each_waits_for_its_own_data(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg())
    assert plog.durable(plog.log_end_offset) is None  # nothing to fsync
    release = threading.Event()
    real_fsync = os.fsync

    def held_fsync(fd: int) -> None:
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)

    executor_fsync(monkeypatch)
    append(plog, make_batch([b"a"]))
    first = [plog.durable(plog.log_end_offset) for _ in range(3)]
    flush_caller = asyncio.ensure_future(plog.flush())
    await asyncio.sleep(0)  # the round has taken its plan: later appends are not in it
    append(plog, make_batch([b"b"]))
    second = plog.durable(plog.log_end_offset)
    assert second is not None and all(w is not None and not w.done() for w in [*first, second])
    # What the log had made durable when the first waiters were resolved, and whether the later one was too.
    seen: list[tuple[int, bool]] = []
    assert first[0] is not None
    first[0].add_done_callback(lambda _w: seen.append((plog.flushed_offset, second.done())))
    base_count = plog.fsync_count
    release.set()
    await asyncio.gather(*(w for w in first if w is not None), flush_caller)
    assert seen == [(1, False)]
    await second  # its data needed the next round
    assert plog.flushed_offset == 2 and plog.fsync_count - base_count == 2
    assert plog.durable(1) is None
    plog.close()


async def test_durable_waiters_fail_with_the_fsync_error_and_on_close(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg())
    append(plog, make_batch([b"e"]))

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fsync", failing_fsync)

    executor_fsync(monkeypatch)
    waiters = [plog.durable(1) for _ in range(2)]
    results = await asyncio.gather(*(w for w in waiters if w is not None), return_exceptions=True)
    assert len(results) == 2 and all(isinstance(r, OSError) for r in results)
    assert plog.flushed_offset == 0
    monkeypatch.undo()
    waiter = plog.durable(1)
    assert waiter is not None
    await waiter
    assert plog.flushed_offset == 1
    # A partition deleted while a waiter waits fails it instead of leaving it hanging.
    append(plog, make_batch([b"f"]))
    monkeypatch.setattr(os, "fsync", lambda fd: time.sleep(0.05))
    executor_fsync(monkeypatch)
    waiter = plog.durable(2)
    assert waiter is not None
    round_in_flight = plog._flush_task
    plog.delete()
    with pytest.raises(LogClosed):
        await waiter
    if round_in_flight is not None:
        await asyncio.wait([round_in_flight])  # its fsync of the deleted files ends before the test does


async def test_flush_interval_messages_schedules_flush(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(flush_interval_messages=5))
    append(plog, make_batch([b"m"] * 3))
    await asyncio.sleep(0.05)
    assert plog.flushed_offset == 0
    append(plog, make_batch([b"m"] * 2))
    for _ in range(100):
        if plog.flushed_offset == 5:
            break
        await asyncio.sleep(0.01)
    assert plog.flushed_offset == 5
    plog.close()


def test_flush_interval_messages_without_event_loop_flushes_inline(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(flush_interval_messages=2))
    append(plog, make_batch([b"m"]))
    assert plog.flushed_offset == 0
    append(plog, make_batch([b"m"]))
    assert plog.flushed_offset == 2
    plog.close()


async def test_background_flush_by_time(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", cfg(flush_interval_ms=10))
    plog.start_background()
    append(plog, make_batch([b"w"]))
    for _ in range(100):
        if plog.flushed_offset == 1:
            break
        await asyncio.sleep(0.01)
    assert plog.flushed_offset == 1
    await plog.stop_background()
    plog.close()


async def test_roll_flush_persists_sealed_indexes(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    plog = PartitionLog.open(d, cfg(segment_bytes=200))
    for _ in range(6):
        append(plog, make_batch([b"r" * 60]))
    sealed = len(plog.segments) - 1
    # Index files are written in the flush thread before the loop records the flushed offset: wait for both.
    for _ in range(300):
        if len(list(d.glob("*.index"))) == sealed and plog.flushed_offset == plog.log_end_offset:
            break
        await asyncio.sleep(0.01)
    assert len(list(d.glob("*.index"))) == sealed
    assert plog.flushed_offset == plog.log_end_offset
    plog.close()


# -- property test -----------------------------------------------------------------------------------


class LogMachine(RuleBasedStateMachine):
    """Random appends, clean and crashed reopens, DeleteRecords: offsets stay contiguous and reads
    return exactly what was appended."""

    @initialize(
        segment_bytes=st.integers(min_value=150, max_value=1500),
        index_interval=st.integers(min_value=0, max_value=300),
    )
    def setup(self, segment_bytes: int, index_interval: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shoal-log-"))
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval)
        self.plog = PartitionLog.open(self.dir, self.config)
        self.batches: list[tuple[int, int, bytes]] = []  # (base offset, last offset, stored bytes)
        self.start = 0

    @rule(
        batches=st.lists(
            st.lists(st.binary(min_size=0, max_size=80), min_size=1, max_size=6), min_size=1, max_size=4
        )
    )
    def append_batches(self, batches: list[list[bytes]]) -> None:
        end = self.end
        result, stored = append(self.plog, *(make_batch(values) for values in batches))
        assert result.base_offset == end
        for pos, header in iter_batches(stored):
            self.batches.append((header.base_offset, header.last_offset, stored[pos : pos + header.size]))
        assert result.last_offset == self.batches[-1][1]

    @rule()
    def reopen(self) -> None:
        self.plog.close()
        self.plog = PartitionLog.open(self.dir, self.config)

    @rule()
    def crash_and_reopen(self) -> None:
        _crash(self.plog)
        self.plog = PartitionLog.open(self.dir, self.config)

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(min_value=0, max_value=self.end + 2))
        self.start = max(self.start, min(target, self.end))
        assert self.plog.delete_records_before(target) == self.start

    @rule(data=st.data())
    def read_from(self, data: st.DataObject) -> None:
        if self.start == self.end:
            assert self.plog.read(self.start, 100) == b""
            return
        offset = data.draw(st.integers(min_value=self.start, max_value=self.end - 1))
        max_bytes = data.draw(st.integers(min_value=0, max_value=2000))
        got = self.plog.read(offset, max_bytes)
        wanted = [b for b in self.batches if b[1] >= offset]
        expected = wanted[0][2]
        for _, _, stored in wanted[1:]:
            if len(expected) + len(stored) > max_bytes:
                break
            expected += stored
        assert got == expected

    @property
    def end(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else 0

    @invariant()
    def offsets_consistent(self) -> None:
        assert self.plog.log_end_offset == self.end
        assert self.plog.log_start_offset == self.start
        if self.start < self.end:
            got = self.plog.read(self.start, 1 << 24)
            assert got == b"".join(stored for _, last, stored in self.batches if last >= self.start)

    def teardown(self) -> None:
        self.plog.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LogMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_log_machine = LogMachine.TestCase


def test_segment_file_names() -> None:
    assert log_segment.segment_file_name(42, ".log") == "00000000000000000042.log"


@pytest.mark.parametrize("policy_deletes", [False, True])
def test_retention_honours_cleanup_policy(tmp_path: Path, policy_deletes: bool) -> None:
    # cleanup.policy=compact never loses a segment to age or size; compact,delete does (Kafka's LogConfig.delete).
    plog = PartitionLog.open(
        tmp_path / "t-0", cfg(segment_bytes=200, retention_ms=1000, retention_bytes=0, cleanup_delete=policy_deletes)
    )
    for i in range(12):
        append(plog, make_batch([b"c" * 40], base_ts=10_000 * (i + 1)))
    segments = len(plog.segments)
    assert segments > 3
    deleted = plog.enforce_retention(now_ms=10**12)
    if policy_deletes:
        assert deleted == segments and plog.log_start_offset == plog.log_end_offset
    else:
        assert deleted == 0 and plog.log_start_offset == 0 and len(plog.segments) == segments
        # DeleteRecords still moves the start of a compacted log and drops the segments below it.
        plog.delete_records_before(plog.segments[2].base_offset)
        assert plog.segments[0].base_offset == plog.log_start_offset
    plog.close()
