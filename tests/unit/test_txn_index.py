"""The transaction index: append-only `.txnindex` files per segment, snapshots of open transactions at
segment boundaries, and recovery after a power cut that lost whatever was not fsynced."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.storage import partition_log as partition_log_module
from shoal.broker.storage.log_segment import TXN_INDEX_SUFFIX
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.producer_state import AbortedTxn
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch

NOW = 1_700_000_000_000


def _config() -> LogConfig:
    return LogConfig(segment_bytes=400, index_interval_bytes=64)


class _Writer:
    def __init__(self, plog: PartitionLog) -> None:
        self.plog = plog
        self.seq: dict[int, int] = {}

    def write(self, pid: int | None, value: bytes = b"v") -> None:
        kw: dict[str, object] = {}
        if pid is not None:
            kw = dict(producer_id=pid, producer_epoch=0, base_sequence=self.seq.get(pid, 0), is_transactional=True)
            self.seq[pid] = self.seq.get(pid, 0) + 1
        buf = bytearray(encode_batch([RecordInput(b"k", value, (), NOW)], **kw))  # type: ignore[arg-type]
        self.plog.append(buf, list(iter_batches(buf)))

    def end(self, pid: int, commit: bool) -> None:
        self.plog.append_marker(producer_id=pid, producer_epoch=0, commit=commit, coordinator_epoch=0,
                                timestamp_ms=NOW)


def _power_cut(plog: PartitionLog, keep_txn_bytes: int = 0) -> None:
    """Everything appended was fsynced (the marker writer waits for that), but the active segment's
    transaction index lost its unsynced tail, and the process dies without closing anything. Earlier
    versions kept transactions.json, replaced without fsync: a power cut can leave it empty."""
    plog.flush_sync()
    for seg in plog.segments:
        seg.close()
    active = plog.active.txn_index_path
    if active.exists():
        os.truncate(active, min(keep_txn_bytes, active.stat().st_size))
    legacy = plog.directory / "transactions.json"
    if legacy.exists():
        os.truncate(legacy, 0)


def _txns(plog: PartitionLog) -> tuple[list[AbortedTxn], int]:
    return plog.producer_state.aborted_between(0, plog.log_end_offset + 1), plog.last_stable_offset


def test_an_old_aborted_transaction_survives_a_power_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The start-up scan for producers' sequences reads only the log's tail; the aborted transaction
    # must not depend on it.
    monkeypatch.setattr(partition_log_module, "_REBUILD_WINDOW_BYTES", 1000)
    plog = PartitionLog.open(tmp_path, _config())
    w = _Writer(plog)
    w.write(None)
    w.write(7)
    w.write(7)
    w.end(7, commit=False)
    for _ in range(40):
        w.write(None, b"x" * 50)
    w.write(8)
    w.end(8, commit=False)  # a second one in the active segment, whose index the power cut truncates
    assert len(plog.segments) > 5
    before = _txns(plog)
    assert [(t.producer_id, t.first_offset) for t in before[0]] == [(7, 1), (8, 44)]
    _power_cut(plog)
    reopened = PartitionLog.open(tmp_path, _config())
    assert _txns(reopened) == before
    reopened.close()


def test_an_abort_across_segments_is_rebuilt_from_the_snapshot(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _Writer(plog)
    w.write(5)  # opens the transaction in the first segment
    for _ in range(20):
        w.write(None, b"y" * 50)
    w.write(5)
    w.end(5, commit=False)  # in a later segment
    assert plog.segments[0].base_offset == 0 and len(plog.segments) > 3
    before = _txns(plog)
    assert before == ([AbortedTxn(5, 0, 22)], 23)
    _power_cut(plog, keep_txn_bytes=20)  # a torn append: part of the entry
    reopened = PartitionLog.open(tmp_path, _config())
    assert _txns(reopened) == before
    # The rebuilt index is whole again: one 34-byte entry.
    assert reopened.active.txn_index_path.stat().st_size == 34
    reopened.close()


def test_an_open_transaction_keeps_the_last_stable_offset_after_a_power_cut(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _Writer(plog)
    w.write(None)
    w.write(3)  # open at offset 1, never ended
    for _ in range(30):
        w.write(None, b"z" * 50)
    assert plog.last_stable_offset == 1
    _power_cut(plog)
    reopened = PartitionLog.open(tmp_path, _config())
    assert reopened.last_stable_offset == 1
    w = _Writer(reopened)
    w.end(3, commit=False)
    assert _txns(reopened) == ([AbortedTxn(3, 1, 32)], 33)
    reopened.close()


def test_the_index_is_appended_to_never_rewritten(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, LogConfig(segment_bytes=1 << 20))
    w = _Writer(plog)
    w.write(1)
    w.end(1, commit=False)
    path = plog.active.txn_index_path
    inode = path.stat().st_ino
    for i in range(50):
        w.write(1)
        w.end(1, commit=i % 2 == 0)
    assert path.stat().st_ino == inode  # the same file, never replaced
    assert path.stat().st_size == 26 * 34  # one entry per abort, nothing for commits and opens
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".json")] == []
    plog.close()


def test_a_partition_without_transactions_keeps_no_transaction_files(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _Writer(plog)
    for _ in range(20):
        w.write(None, b"q" * 50)
    plog.close()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((TXN_INDEX_SUFFIX, ".snapshot"))]
    reopened = PartitionLog.open(tmp_path, _config())
    assert reopened.last_stable_offset == reopened.log_end_offset
    assert reopened._producer_state is None  # nothing was scanned for it
    reopened.close()


def test_transactions_json_of_an_earlier_version_is_migrated(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path, _config())
    w = _Writer(plog)
    w.write(4)
    for _ in range(12):
        w.write(None, b"m" * 50)
    w.end(4, commit=False)
    w.write(6)
    before = _txns(plog)
    plog.close()
    for p in tmp_path.iterdir():
        if p.name.endswith((TXN_INDEX_SUFFIX, ".snapshot")):
            p.unlink()
    (tmp_path / "transactions.json").write_text('{"ongoing": [[6, 14]], "aborted": [[4, 0, 13]]}')
    reopened = PartitionLog.open(tmp_path, _config())
    assert _txns(reopened) == before
    assert not (tmp_path / "transactions.json").exists()
    reopened.close()


_op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from([None, 1, 2, 3]), st.integers(1, 60)),
    st.tuples(st.just("end"), st.sampled_from([1, 2, 3]), st.booleans()),
    st.tuples(st.just("cut"), st.integers(0, 70), st.booleans()),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=50))
def test_power_cuts_never_change_the_transactions(ops: list[tuple[str, object, object]]) -> None:
    """Any mix of transactions across segment rolls, with power cuts that tear the active segment's
    transaction index anywhere: after each, the same aborted transactions and last stable offset."""
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(Path(tmp), _config())
        w = _Writer(plog)
        open_txns: set[int] = set()
        for op, a, b in ops:
            if op == "write":
                pid = a if isinstance(a, int) else None
                assert isinstance(b, int)
                w.write(pid, b"w" * b)
                if pid is not None:
                    open_txns.add(pid)
            elif op == "end":
                assert isinstance(a, int)
                if a in open_txns:
                    w.end(a, commit=bool(b))
                    open_txns.discard(a)
            else:
                assert isinstance(a, int)
                before = _txns(plog)
                _power_cut(plog, keep_txn_bytes=a)
                plog = PartitionLog.open(Path(tmp), _config())
                w.plog = plog
                assert _txns(plog) == before
        plog.close()
