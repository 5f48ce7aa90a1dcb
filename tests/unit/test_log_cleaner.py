"""Log compaction: what survives a clean, offsets, tombstones, the active segment, crash recovery of a swap."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.broker.storage.log_cleaner import (
    CleanAborted,
    CleanResult,
    Throttler,
    clean,
    dirty_ratio,
    plan_clean,
    swap_in,
)
from shoal.broker.storage.log_cleaner_manager import grab_filthiest
from shoal.broker.storage.log_segment import CLEANED_SUFFIX, SWAP_SUFFIX
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.protocol.compression import GZIP, NONE
from shoal.protocol.record_batch import BatchHeader, iter_batches
from shoal.protocol.records import (
    CONTROL_ABORT,
    Record,
    RecordInput,
    control_record_type,
    decode_batches,
    decode_records,
    encode_batch,
)

DAY_MS = 24 * 3600 * 1000
NOW = 1_700_000_000_000

# A batch: records of (key index, value or None for a tombstone), and its codec.
_batch = st.tuples(
    st.lists(st.tuples(st.integers(0, 7), st.one_of(st.none(), st.binary(min_size=1, max_size=6))),
             min_size=1, max_size=4),
    st.sampled_from([NONE, GZIP]),
)


def _config(**kw: object) -> LogConfig:
    base: dict[str, object] = dict(segment_bytes=300, compact=True, cleanup_delete=False, delete_retention_ms=DAY_MS,
                                   index_interval_bytes=64)
    base.update(kw)
    return LogConfig(**base)  # type: ignore[arg-type]


def _append(plog: PartitionLog, batches: list[tuple[list[tuple[int, bytes | None]], int]]) -> None:
    for records, codec in batches:
        buf = bytearray(encode_batch([RecordInput(b"k%d" % k, v, (), NOW - DAY_MS) for k, v in records],
                                     compression=codec))
        plog.append(buf, list(iter_batches(buf)))
    plog.flush_sync()  # sealed segments' indexes become durable, which makes them cleanable


def _all_records(plog: PartitionLog) -> list[Record]:
    out: list[Record] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20)
        if not data:
            break
        out.extend(r for r in decode_batches(data) if r.offset >= offset)
        offset = max(h.last_offset for _, h in iter_batches(data)) + 1
    return out


def _clean(plog: PartitionLog, now: int) -> CleanResult | None:
    plan = plan_clean(plog, now, 1 << 20)
    if plan is None:
        return None
    result = clean(plan)
    if swap_in(plog, result):
        plog.write_cleaner_checkpoint(result.end_offset)
    plog.flush_sync()
    return result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_batch, min_size=1, max_size=30))
def test_clean_keeps_the_latest_record_per_key(batches: list[tuple[list[tuple[int, bytes | None]], int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(Path(tmp), _config())
        _append(plog, batches)
        before = _all_records(plog)
        active = plog.active
        active_bytes = active.read(0, active.size)
        cleaned_end = active.base_offset
        result = _clean(plog, NOW)

        after = _all_records(plog)
        offsets = [r.offset for r in after]
        assert offsets == sorted(set(offsets))
        assert set(offsets) <= {r.offset for r in before}  # a subsequence: nothing renumbered
        assert plog.active is active and active.read(0, active.size) == active_bytes
        latest = {r.key: r for r in before}
        by_offset = {r.offset: r for r in after}
        for key, rec in latest.items():
            kept = by_offset.get(rec.offset)
            assert kept is not None and (kept.key, kept.value) == (rec.key, rec.value), key
        for offset in range(plog.log_start_offset, plog.log_end_offset):
            # A fetch at any offset, even one compaction removed, gets a batch that moves the consumer on.
            data = plog.read(offset, 1)
            assert data and max(h.last_offset for _, h in iter_batches(data)) >= offset
        if result is not None:
            cleaned_keys = [r.key for r in after if r.offset < cleaned_end]
            assert len(cleaned_keys) == len(set(cleaned_keys))  # one record per key below the active segment
            assert plog.cleaner_checkpoint == result.end_offset

        # Past the delete horizon the next clean drops tombstones below the active segment.
        _clean(plog, NOW + 2 * DAY_MS)
        final = _all_records(plog)
        for rec in final:
            if rec.offset < cleaned_end:
                assert rec.value is not None
        assert {r.offset for r in final if r.value is not None} == {r.offset for r in after if r.value is not None}
        plog.close()

        reopened = PartitionLog.open(Path(tmp), _config())
        assert [(r.offset, r.key, r.value) for r in _all_records(reopened)] == [
            (r.offset, r.key, r.value) for r in final]
        assert reopened.log_end_offset == plog.log_end_offset
        reopened.close()


def _filled_log(tmp: Path) -> PartitionLog:
    plog = PartitionLog.open(tmp, _config())
    _append(plog, [([(i % 5, b"v%d" % i)], NONE) for i in range(40)])
    return plog


def _snapshot(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in _all_records(plog)]


def test_a_crash_after_the_swap_file_is_committed_finishes_the_swap(tmp_path: Path) -> None:
    plog = _filled_log(tmp_path)
    plan = plan_clean(plog, NOW, 1 << 20)
    assert plan is not None
    result = clean(plan)
    assert result.groups and all(g.swap_path.name.endswith(SWAP_SUFFIX) for g in result.groups)
    # kill -9 here: the old segments are intact, the swap files committed. A second, in-memory copy
    # shows what the swap would have produced.
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    expected_log = _filled_log(twin_dir)
    _clean(expected_log, NOW)
    expected = _snapshot(expected_log)
    # Half-way through replace_segments: one old segment already gone.
    os.unlink(result.groups[0].old[-1].log_path)
    reopened = PartitionLog.open(tmp_path, _config())
    assert _snapshot(reopened) == expected
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((SWAP_SUFFIX, CLEANED_SUFFIX))]
    reopened.close()


def test_a_crash_before_the_commit_keeps_the_old_segments(tmp_path: Path) -> None:
    plog = _filled_log(tmp_path)
    before = _snapshot(plog)
    plan = plan_clean(plog, NOW, 1 << 20)
    assert plan is not None
    result = clean(plan)
    for group in result.groups:  # as if killed between writing `.cleaned` and renaming it
        os.replace(group.swap_path, tmp_path / (group.swap_path.name.split(".")[0] + CLEANED_SUFFIX))
    reopened = PartitionLog.open(tmp_path, _config())
    assert _snapshot(reopened) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((SWAP_SUFFIX, CLEANED_SUFFIX))]
    reopened.close()


def test_a_swap_is_dropped_when_retention_removed_its_segments(tmp_path: Path) -> None:
    plog = _filled_log(tmp_path)
    plan = plan_clean(plog, NOW, 1 << 20)
    assert plan is not None
    result = clean(plan)
    plog.delete_records_before(plog.segments[1].base_offset)
    assert not swap_in(plog, result)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(SWAP_SUFFIX)]
    # Later groups did go in; nothing below the new log start came back.
    assert all(not seg.deleted for seg in plog.segments)
    assert min(r.offset for r in _all_records(plog)) >= plog.log_start_offset
    plog.close()


def test_dirty_ratio_and_compaction_lags_choose_what_is_cleaned(tmp_path: Path) -> None:
    plog = _filled_log(tmp_path)
    assert grab_filthiest([plog], NOW, set()) is plog
    plog.config = _config(min_cleanable_dirty_ratio=1.0)
    assert grab_filthiest([plog], NOW, set()) is plog  # everything is dirty: ratio 1.0
    _clean(plog, NOW)
    assert grab_filthiest([plog], NOW, set()) is None  # nothing dirty and no tombstones waiting
    _append(plog, [([(1, b"x")], NONE)] * 8)
    assert grab_filthiest([plog], NOW, set()) is None  # a little dirt, below the ratio
    plog.config = _config(min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=1000)
    assert grab_filthiest([plog], NOW, set()) is plog  # overdue by max.compaction.lag.ms
    plog.config = _config(min_compaction_lag_ms=2 * DAY_MS)
    assert dirty_ratio(plog, NOW)[1] == 0  # every new record is younger than the minimum lag
    assert grab_filthiest([plog], NOW, set()) is None
    plog.config = _config(compact=False)
    assert grab_filthiest([plog], NOW, set()) is None
    plog.close()


@pytest.mark.parametrize("codec", [NONE, GZIP])
def test_a_producers_last_batch_stays_even_when_emptied(tmp_path: Path, codec: int) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    for seq in range(3):
        buf = bytearray(encode_batch([RecordInput(b"k", b"v%d" % seq, (), NOW), RecordInput(b"j", b"w", (), NOW)],
                                     producer_id=7, producer_epoch=2, base_sequence=seq * 2, compression=codec))
        plog.append(buf, list(iter_batches(buf)))
    for i in range(20):  # another producer's later records supersede both keys
        buf = bytearray(encode_batch([RecordInput(b"k" if i % 2 else b"j", b"z%d" % i, (), NOW)]))
        plog.append(buf, list(iter_batches(buf)))
    plog.flush_sync()
    _clean(plog, NOW)
    headers = [h for seg in plog.segments for _, h in iter_batches(seg.read(0, seg.size))]
    mine = [h for h in headers if h.producer_id == 7]
    assert len(mine) == 1
    last = mine[0]
    assert (last.base_offset, last.last_offset_delta, last.producer_epoch, last.base_sequence,
            last.records_count) == (4, 1, 2, 4, 0)
    plog.close()


def test_max_compaction_lag_rolls_the_active_segment(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config(segment_bytes=1 << 20, max_compaction_lag_ms=1000))
    for ts in (NOW, NOW + 500, NOW + 1500):
        buf = bytearray(encode_batch([RecordInput(b"k", b"v", (), ts)]))
        plog.append(buf, list(iter_batches(buf)))
    # The third batch is more than the lag after the segment's first: a new active segment, and the
    # first one becomes cleanable.
    assert [seg.base_offset for seg in plog.segments] == [0, 2]
    plog.config = _config(segment_bytes=1 << 20)  # no max lag: size alone rolls
    buf = bytearray(encode_batch([RecordInput(b"k", b"v", (), NOW + 99_999)]))
    plog.append(buf, list(iter_batches(buf)))
    assert len(plog.segments) == 2
    plog.close()


def test_a_clean_never_commits_into_a_recreated_partition(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    plog = _filled_log(directory)
    plan = plan_clean(plog, NOW, 1 << 20)
    assert plan is not None
    plog.delete()
    directory.mkdir()  # the topic is created again under the same name while the cleaner runs
    with pytest.raises(CleanAborted):
        clean(plan)
    assert list(directory.iterdir()) == []


def test_the_throttler_holds_cleaner_io_to_its_rate() -> None:
    now = [100.0]
    slept: list[float] = []
    throttler = Throttler(1000.0, clock=lambda: now[0], sleep=slept.append)
    throttler.throttle(500)  # half a second's worth, at once
    assert slept == [0.5]
    now[0] += 0.75
    throttler.throttle(250)  # 750 bytes in 0.75 s: on the rate
    assert slept == [0.5]
    now[0] += 5.0  # a new window after an idle spell: no burst allowance, no debt
    throttler.throttle(2000)
    assert slept == [0.5, 2.0]
    Throttler(float("inf"), sleep=slept.append).throttle(10**9)
    assert slept == [0.5, 2.0]


def test_reads_go_on_while_the_cleaner_thread_works(tmp_path: Path) -> None:
    plog = _filled_log(tmp_path)
    before = _snapshot(plog)
    plan = plan_clean(plog, NOW, 1 << 20)
    assert plan is not None
    done: list[CleanResult] = []
    worker = threading.Thread(target=lambda: done.append(clean(plan)))
    worker.start()
    while worker.is_alive():
        assert _snapshot(plog) == before  # the old segments stay readable until the swap
    worker.join()
    swap_in(plog, done[0])
    after = _snapshot(plog)
    assert {k: (o, v) for o, k, v in before} == {k: (o, v) for o, k, v in after}
    assert len(after) < len(before)
    plog.close()


# -- transactions ----------------------------------------------------------------------------------


class _TxnWriter:
    """Appends plain and transactional batches and markers, keeping each producer's sequence."""

    def __init__(self, plog: PartitionLog, ts: int = NOW - DAY_MS) -> None:
        self.plog = plog
        self.ts = ts
        self.seq: dict[int, int] = {}

    def write(self, key: bytes, value: bytes | None, pid: int | None = None) -> None:
        kw: dict[str, object] = {}
        if pid is not None:
            kw = dict(producer_id=pid, producer_epoch=0, base_sequence=self.seq.get(pid, 0), is_transactional=True)
            self.seq[pid] = self.seq.get(pid, 0) + 1
        buf = bytearray(encode_batch([RecordInput(key, value, (), self.ts)], **kw))  # type: ignore[arg-type]
        self.plog.append(buf, list(iter_batches(buf)))

    def end(self, pid: int, commit: bool) -> None:
        self.plog.append_marker(producer_id=pid, producer_epoch=0, commit=commit, coordinator_epoch=0,
                                timestamp_ms=self.ts)


def _read_committed(plog: PartitionLog) -> dict[bytes, bytes]:
    """The latest value per key a read_committed consumer reading the whole log ends with (as the Java
    consumer filters: the fetch's aborted transactions plus the ABORT markers in the data)."""
    pending = sorted(plog.aborted_transactions(plog.log_start_offset, plog.log_end_offset),
                     key=lambda t: t.first_offset)
    aborted_pids: set[int] = set()
    latest: dict[bytes, bytes | None] = {}
    data = plog.read(plog.log_start_offset, 1 << 24, max_offset=plog.last_stable_offset)
    for pos, header in iter_batches(data):
        while pending and pending[0].first_offset <= header.last_offset:
            aborted_pids.add(pending.pop(0).producer_id)
        records = decode_records(memoryview(data)[pos : pos + header.size], 0, header)
        if header.is_control:
            if records and control_record_type(records[0]) == CONTROL_ABORT:
                aborted_pids.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborted_pids:
            continue
        for rec in records:
            assert rec.key is not None
            latest[rec.key] = rec.value
    return {k: v for k, v in latest.items() if v is not None}


def _batch_headers(plog: PartitionLog) -> list[BatchHeader]:
    return [h for seg in plog.segments for _, h in iter_batches(seg.read(0, seg.size))]


def test_an_aborted_value_never_replaces_the_committed_one(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _TxnWriter(plog)
    w.write(b"k", b"v1")
    w.write(b"k", b"v2", pid=5)
    w.end(5, commit=False)
    for i in range(12):  # roll a few segments so the above becomes cleanable
        w.write(b"other%d" % (i % 3), b"x%d" % i)
    plog.flush_sync()
    assert _read_committed(plog)[b"k"] == b"v1"
    _clean(plog, NOW)
    assert _read_committed(plog)[b"k"] == b"v1"
    headers = _batch_headers(plog)
    # The aborted batch is gone; its marker stays until a clean past delete.retention.ms.
    assert not [h for h in headers if h.producer_id == 5 and not h.is_control and h.records_count]
    assert [h for h in headers if h.producer_id == 5 and h.is_control]
    _clean(plog, NOW + 2 * DAY_MS)
    assert _read_committed(plog)[b"k"] == b"v1"
    plog.close()


def test_a_producers_old_aborted_transaction_does_not_hide_its_later_committed_tombstone(tmp_path: Path) -> None:
    """An aborted transaction whose ABORT marker lies below the first dirty offset ended there: it must
    not make the same producer's later committed batches look aborted when the offset map is built over
    the dirty part, or the committed tombstone never supersedes the key's older value, and once the
    tombstone reaches its delete horizon read_committed consumers see that older value again."""
    plog = PartitionLog.open(tmp_path, _config())
    w = _TxnWriter(plog)
    w.write(b"k", b"v1", pid=1)
    w.end(1, commit=False)
    for i in range(8):  # roll segments so the aborted transaction is cleaned below the checkpoint
        w.write(b"other%d" % (i % 3), b"x%d" % i)
    plog.flush_sync()
    _clean(plog, NOW)
    checkpoint = plog.cleaner_checkpoint
    assert checkpoint > 0
    w.write(b"k", b"v2")
    w.write(b"k", None, pid=1)  # the same producer, a new transaction: a committed tombstone
    w.end(1, commit=True)
    for i in range(8):
        w.write(b"other%d" % (i % 3), b"y%d" % i)
    plog.flush_sync()
    assert b"k" not in _read_committed(plog)
    _clean(plog, NOW)
    assert plog.cleaner_checkpoint > checkpoint
    assert b"k" not in _read_committed(plog)
    # The committed tombstone superseded v2 in the clean above, so dropping it after delete.retention.ms
    # leaves nothing of the key.
    _clean(plog, NOW + 2 * DAY_MS)
    assert b"k" not in _read_committed(plog)
    assert not [r for r in _all_records(plog) if r.key == b"k" and r.value is not None]
    plog.close()


def test_markers_go_after_delete_retention_and_their_aborted_entry_with_them(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _TxnWriter(plog)
    w.write(b"a", b"1", pid=5)
    w.write(b"b", b"1", pid=5)
    w.end(5, commit=False)
    w.write(b"c", b"1", pid=6)
    w.end(6, commit=True)
    w.write(b"c", b"2", pid=6)  # a later committed value supersedes the first transaction's record
    w.end(6, commit=True)
    w.write(b"d", b"1", pid=5)  # pid 5's last data batch: committed, it must stay visible
    w.end(5, commit=True)
    for i in range(12):
        w.write(b"other%d" % (i % 3), b"x%d" % i)
    plog.flush_sync()
    expected = _read_committed(plog)
    assert expected[b"c"] == b"2" and b"a" not in expected and expected[b"d"] == b"1"
    marker_count = len([h for h in _batch_headers(plog) if h.is_control])
    _clean(plog, NOW)  # the aborted and superseded batches go; their markers stay for now
    assert _read_committed(plog) == expected
    assert len([h for h in _batch_headers(plog) if h.is_control]) == marker_count
    assert plog.tombstone_horizon_ms is None
    # The next clean finds no batch of those transactions: their markers get a delete horizon...
    _clean(plog, NOW + DAY_MS)
    assert _read_committed(plog) == expected
    assert len([h for h in _batch_headers(plog) if h.is_control]) == marker_count
    assert plog.tombstone_horizon_ms == NOW + 2 * DAY_MS  # so the cleaner comes back for them
    # ...and a clean after it removes them.
    _clean(plog, NOW + 3 * DAY_MS)
    assert _read_committed(plog) == expected
    left = [h for h in _batch_headers(plog) if h.is_control]
    # The ABORT marker and the first COMMIT marker of pid 6 are gone; the markers of transactions
    # with a batch left stay.
    assert len(left) == marker_count - 2
    assert plog.aborted_transactions(0, plog.log_end_offset) == []
    plog.close()
    reopened = PartitionLog.open(tmp_path, _config())
    assert _read_committed(reopened) == expected
    assert reopened.last_stable_offset == reopened.log_end_offset
    reopened.close()


_txn_op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from([None, 1, 2]), st.integers(0, 5),
              st.one_of(st.none(), st.binary(min_size=1, max_size=4))),
    st.tuples(st.just("end"), st.sampled_from([1, 2]), st.booleans(), st.just(None)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_txn_op, min_size=1, max_size=40))
def test_compaction_keeps_what_read_committed_consumers_see(
    ops: list[tuple[str, int | None, object, bytes | None]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(Path(tmp), _config())
        w = _TxnWriter(plog)
        open_txns: set[int] = set()
        for op, pid, arg, value in ops:
            if op == "write":
                assert isinstance(arg, int)
                w.write(b"k%d" % arg, value, pid)
                if pid is not None:
                    open_txns.add(pid)
            elif pid in open_txns:
                assert pid is not None
                w.end(pid, commit=bool(arg))
                open_txns.discard(pid)
        for pid in sorted(open_txns):
            w.end(pid, commit=False)
        w.write(b"tail", b"t")  # the active segment
        plog.flush_sync()
        expected = _read_committed(plog)
        for now in (NOW, NOW + 2 * DAY_MS, NOW + 4 * DAY_MS, NOW + 6 * DAY_MS):
            _clean(plog, now)
            assert _read_committed(plog) == expected
        plog.close()
        reopened = PartitionLog.open(Path(tmp), _config())
        assert _read_committed(reopened) == expected
        assert reopened.last_stable_offset == reopened.log_end_offset
        reopened.close()


_txn_or_crash_op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from([None, 1, 2]), st.integers(0, 5),
              st.one_of(st.none(), st.binary(min_size=1, max_size=4))),
    # Ends one of the open transactions (whichever the index picks), committing or aborting it.
    st.tuples(st.just("end"), st.integers(0, 1), st.booleans(), st.none()),
    # A whole transaction of producer 3: its records, then its marker.
    st.tuples(st.just("txn"), st.just(3), st.lists(st.integers(0, 5), min_size=1, max_size=3), st.booleans()),
    st.tuples(st.just("clean"), st.none(), st.integers(0, 3), st.none()),
    st.tuples(st.just("crash"), st.none(), st.booleans(), st.none()),
)


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(_txn_or_crash_op, min_size=10, max_size=50))
def test_cleaning_and_crashes_keep_what_read_committed_consumers_see(
    ops: list[tuple[str, int | None, object, object]],
) -> None:
    """Cleans at any time (days apart, so markers reach their delete horizon) and kill -9 after any of
    them, even before the swapped-in segments' indexes were flushed: reopening always shows
    read_committed consumers the same values and the same last stable offset."""
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(Path(tmp), _config())
        w = _TxnWriter(plog)
        open_txns: set[int] = set()
        day = 0
        for op, pid, arg, value in ops:
            if op == "write":
                assert isinstance(arg, int) and (value is None or isinstance(value, bytes))
                w.write(b"k%d" % arg, value, pid)
                if pid is not None:
                    open_txns.add(pid)
            elif op == "txn":
                assert pid is not None and isinstance(arg, list)
                for key in arg:
                    w.write(b"k%d" % key, b"t", pid)
                w.end(pid, commit=bool(value))
            elif op == "end":
                if open_txns:
                    assert pid is not None
                    chosen = sorted(open_txns)[pid % len(open_txns)]
                    w.end(chosen, commit=bool(arg))
                    open_txns.discard(chosen)
            elif op == "clean":
                plog.flush_sync()
                before = (_read_committed(plog), plog.last_stable_offset)
                assert isinstance(arg, int)
                day += arg  # the cleaner's clock only moves on
                plan = plan_clean(plog, NOW + day * DAY_MS, 1 << 20)
                if plan is not None:
                    result = clean(plan)
                    if swap_in(plog, result):
                        plog.write_cleaner_checkpoint(result.end_offset)
                assert (_read_committed(plog), plog.last_stable_offset) == before
            else:
                # kill -9: no flush of what the swap left (indexes, directory), files just closed.
                before = (_read_committed(plog), plog.last_stable_offset)
                if arg:
                    plog.flush_sync()
                else:
                    for task in list(plog._scheduled):
                        task.cancel()
                for seg in plog.segments:
                    seg.close()
                plog = PartitionLog.open(Path(tmp), _config())
                w.plog = plog
                assert (_read_committed(plog), plog.last_stable_offset) == before
        expected = _read_committed(plog)
        plog.close()
        reopened = PartitionLog.open(Path(tmp), _config())
        assert _read_committed(reopened) == expected
        reopened.close()
