"""The transaction coordinator over real partition logs: transitions, replay, and completion at load of a
transaction a crash left between its prepare record and its markers; the LSO and aborted-transaction
bookkeeping of producer state."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.storage.internal_topic_log import InternalTopicLog
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.producer_state import PartitionProducerState
from shoal.broker.storage.topic_registry import Topic
from shoal.coordinator.placement import Placement
from shoal.coordinator.transaction_coordinator import TransactionCoordinator
from shoal.coordinator.transaction_log import TxnMetadata, TxnState, from_record, to_record
from shoal.protocol.coordinator_records import (
    SHARE_GROUP_STATE,
    SHARE_SNAPSHOT,
    TRANSACTION_STATE,
    CoordinatorRecord,
    decode_record,
    encode_record,
    key_class,
)
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch

MAX_TIMEOUT = 60_000


class LogMarkers:
    """Writes markers to real partition logs; `fail_after` makes it stop part-way, like a crash."""

    def __init__(self, logs: dict[tuple[str, int], PartitionLog], fail_after: int | None = None):
        self.logs = logs
        self.fail_after = fail_after
        self.written: list[tuple[str, int]] = []

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[tuple[str, int]], coordinator_epoch: int = 0,
                            transaction_version: int = 0) -> set[tuple[str, int]]:
        for tp in sorted(partitions):
            if self.fail_after is not None and len(self.written) >= self.fail_after:
                await asyncio.Event().wait()  # hangs here until the "crash" cancels it
            plog = self.logs[tp]
            result = plog.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch, timestamp_ms=0,
                                        transaction_version=transaction_version)
            await plog.flush(result.last_offset + 1)
            self.written.append(tp)
        return set()


class Cluster:
    def __init__(self, base: Path):
        self.base = base
        self.pid = 0
        self.open()

    def open(self) -> None:
        self.state_topic = Topic("__transaction_state", b"\x02" * 16,
                                 [PartitionLog.open(self.base / f"ts-{i}", LogConfig()) for i in range(3)])
        self.logs = {("t", i): PartitionLog.open(self.base / f"t-{i}", LogConfig()) for i in range(2)}

    def close(self) -> None:
        for plog in [*self.state_topic.partitions, *self.logs.values()]:
            plog.close()

    def allocate(self) -> int:
        self.pid += 1
        return self.pid

    async def coordinator(self, markers: LogMarkers) -> TransactionCoordinator:
        coord = TransactionCoordinator(InternalTopicLog(self.state_topic), markers, self.allocate,
                                       max_timeout_ms=MAX_TIMEOUT, offsets_placement=Placement(3))
        await coord.load()
        return coord

    def produce_txn(self, tp: tuple[str, int], producer_id: int, epoch: int, seq: int) -> None:
        batch = bytearray(encode_batch([RecordInput(value=b"x")], producer_id=producer_id, producer_epoch=epoch,
                                       base_sequence=seq, is_transactional=True))
        self.logs[tp].append(batch, list(iter_batches(batch)))


async def _settle(coord: TransactionCoordinator) -> None:
    while coord._completing:
        await asyncio.gather(*coord._completing.values(), return_exceptions=True)


def test_crash_at_each_point_of_the_two_phase_end(tmp_path: Path) -> None:
    """Crash after PrepareCommit with 0, 1 or 2 of 2 markers written: reopening completes the commit."""
    for written_before_crash in (0, 1, 2):
        base = tmp_path / str(written_before_crash)

        async def run(written: int = written_before_crash, base: Path = base) -> None:
            cluster = Cluster(base)
            crashing = LogMarkers(cluster.logs, fail_after=written)
            coord = await cluster.coordinator(crashing)
            init = await coord.init_producer_id("app", 30_000)
            assert init.error == ErrorCode.NONE
            assert await coord.add_partitions("app", init.producer_id, init.producer_epoch, list(cluster.logs)) == 0
            for tp in cluster.logs:
                cluster.produce_txn(tp, init.producer_id, init.producer_epoch, 0)
            assert all(plog.last_stable_offset == 0 for plog in cluster.logs.values())
            assert await coord.end_txn("app", init.producer_id, init.producer_epoch, True) == ErrorCode.NONE
            if written < 2:
                while len(crashing.written) < written:
                    await asyncio.sleep(0.01)
                await coord.stop()  # the crash: the completion never finishes
            else:
                await _settle(coord)
            cluster.close()

            cluster.open()
            markers = LogMarkers(cluster.logs)
            coord = await cluster.coordinator(markers)
            expected = TxnState.COMPLETE_COMMIT if written == 2 else TxnState.PREPARE_COMMIT
            assert coord.txns["app"].state == expected
            coord.start()
            await _settle(coord)
            assert coord.txns["app"].state == TxnState.COMPLETE_COMMIT
            assert coord.txns["app"].partitions == frozenset()
            for plog in cluster.logs.values():
                assert plog.last_stable_offset == plog.log_end_offset
                assert plog.producer_state.aborted == []
            cluster.close()

        asyncio.run(run())


def test_fencing_and_bad_input_leave_state_unchanged(tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path)
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        assert (await coord.init_producer_id("app", MAX_TIMEOUT + 1)).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert (await coord.init_producer_id("app", 0)).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert "app" not in coord.txns
        first = await coord.init_producer_id("app", 30_000)
        pid, epoch = first.producer_id, first.producer_epoch
        assert await coord.add_partitions("app", pid + 1, epoch, [("t", 0)]) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert await coord.add_partitions("nobody", pid, epoch, [("t", 0)]) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert coord.txns["app"].state == TxnState.EMPTY
        assert await coord.add_partitions("app", pid, epoch, [("t", 0)]) == ErrorCode.NONE
        cluster.produce_txn(("t", 0), pid, epoch, 0)
        # A new incarnation fences the old one and aborts its open transaction.
        assert (await coord.init_producer_id("app", 30_000)).error == ErrorCode.CONCURRENT_TRANSACTIONS
        await _settle(coord)
        second = await coord.init_producer_id("app", 30_000)
        assert (second.producer_id, second.producer_epoch) == (pid, epoch + 2)
        before = coord.txns["app"]
        assert await coord.end_txn("app", pid, epoch, True) == ErrorCode.PRODUCER_FENCED
        assert await coord.add_partitions("app", pid, epoch, [("t", 1)]) == ErrorCode.PRODUCER_FENCED
        assert coord.check_offset_commit("app", pid, epoch, "g") == ErrorCode.PRODUCER_FENCED
        assert coord.check_offset_commit("app", pid, second.producer_epoch, "g") == ErrorCode.TRANSACTION_ABORTABLE
        assert coord.txns["app"] == before
        assert await coord.end_txn("app", pid, second.producer_epoch, True) == ErrorCode.INVALID_TXN_STATE
        plog = cluster.logs[("t", 0)]
        assert [(t.producer_id, t.first_offset) for t in plog.producer_state.aborted] == [(pid, 0)]
        assert plog.last_stable_offset == plog.log_end_offset
        cluster.close()
        # Replay gives the same state.
        cluster.open()
        assert (await cluster.coordinator(LogMarkers(cluster.logs))).txns["app"] == before
        assert [(t.producer_id, t.first_offset) for t in cluster.logs[("t", 0)].producer_state.aborted] == [(pid, 0)]
        cluster.close()

    asyncio.run(run())


def test_timed_out_transaction_is_aborted_and_producer_fenced(tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path)
        now = [1_000_000]
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        coord.clock = lambda: now[0]
        init = await coord.init_producer_id("slow", 1_000)
        await coord.add_partitions("slow", init.producer_id, init.producer_epoch, [("t", 1)])
        now[0] += 1_000
        assert await coord.abort_timed_out() == []
        now[0] += 1
        assert await coord.abort_timed_out() == ["slow"]
        await _settle(coord)
        assert coord.txns["slow"].state == TxnState.COMPLETE_ABORT
        assert await coord.end_txn("slow", init.producer_id, init.producer_epoch, True) == ErrorCode.PRODUCER_FENCED
        cluster.close()

    asyncio.run(run())


def test_completion_retries_whatever_fails_until_every_marker_is_written(tmp_path: Path) -> None:
    """A marker write failing with something other than an OSError (here a partition log closed under
    it) must not end the completion: it retries until the partition is back, then completes."""

    async def run() -> None:
        cluster = Cluster(tmp_path)
        markers = LogMarkers(cluster.logs)
        coord = await cluster.coordinator(markers)
        init = await coord.init_producer_id("app", 30_000)
        pid, epoch = init.producer_id, init.producer_epoch
        assert await coord.add_partitions("app", pid, epoch, list(cluster.logs)) == ErrorCode.NONE
        for tp in cluster.logs:
            cluster.produce_txn(tp, pid, epoch, 0)
        cluster.logs[("t", 1)].close()  # its next append raises LogClosed
        assert await coord.end_txn("app", pid, epoch, True) == ErrorCode.NONE
        while ("t", 0) not in markers.written:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the failed attempt is behind us
        assert coord.txns["app"].state == TxnState.PREPARE_COMMIT
        assert "app" in coord._completing  # still retrying, not dead
        cluster.logs[("t", 1)] = PartitionLog.open(tmp_path / "t-1", LogConfig())
        await asyncio.wait_for(_settle(coord), 60)
        assert coord.txns["app"].state == TxnState.COMPLETE_COMMIT
        for plog in cluster.logs.values():
            assert plog.last_stable_offset == plog.log_end_offset
        cluster.close()

    asyncio.run(run())


def test_a_retried_kip360_init_producer_id_gets_the_same_answer(tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path)
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        first = await coord.init_producer_id("app", 30_000)
        pid, epoch = first.producer_id, first.producer_epoch
        bumped = await coord.init_producer_id("app", 30_000, pid, epoch)
        assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (ErrorCode.NONE, pid, epoch + 1)
        # The response was lost; the producer sends the same request again.
        retried = await coord.init_producer_id("app", 30_000, pid, epoch)
        assert (retried.error, retried.producer_id, retried.producer_epoch) == (ErrorCode.NONE, pid, epoch + 1)
        assert coord.txns["app"].producer_epoch == epoch + 1  # no second bump
        # Once the producer moved on, the old epoch is a zombie's.
        again = await coord.init_producer_id("app", 30_000, pid, epoch + 1)
        assert again.producer_epoch == epoch + 2
        assert (await coord.init_producer_id("app", 30_000, pid, epoch)).error == ErrorCode.PRODUCER_FENCED
        assert (await coord.init_producer_id("app", 30_000, pid + 7, epoch + 2)).error == ErrorCode.PRODUCER_FENCED
        cluster.close()

    asyncio.run(run())


def test_idle_transactional_ids_expire(tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path)
        now = [1_000_000]
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        coord.clock = lambda: now[0]
        coord.transactional_id_expiration_ms = 10_000
        idle = await coord.init_producer_id("idle", 30_000)
        busy = await coord.init_producer_id("busy", 30_000)
        assert await coord.add_partitions("busy", busy.producer_id, busy.producer_epoch, [("t", 0)]) == 0
        now[0] += 10_000
        assert sorted(await coord.expire_transactional_ids()) == ["idle"]  # an open transaction never expires
        assert "idle" not in coord.txns and "busy" in coord.txns
        cluster.close()
        cluster.open()
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        assert "idle" not in coord.txns and "busy" in coord.txns  # the tombstone replays
        fresh = await coord.init_producer_id("idle", 30_000)
        assert fresh.error == ErrorCode.NONE and fresh.producer_id != idle.producer_id
        cluster.close()

    asyncio.run(run())


def test_idle_producers_expire_from_a_partition() -> None:
    state = PartitionProducerState()
    state.record(1, 0, 0, 1, 0, max_timestamp=1_000)
    state.record(2, 0, 0, 1, 1, max_timestamp=1_000)
    state.on_transactional_batch(2, 1)
    state.record(3, 0, 0, 1, 2, max_timestamp=5_000)
    assert state.expire_producers(now_ms=6_000, expiration_ms=5_000) == 1
    # Producer 2 has an open transaction; producer 3 wrote recently.
    assert sorted(state.producers) == [2, 3]


# ---- producer state: LSO and aborted transactions ------------------------------------------------

_events = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["data", "commit", "abort"])), max_size=40)


@settings(max_examples=200, deadline=None)
@given(_events)
def test_lso_is_the_first_offset_of_the_oldest_open_transaction(events: list[tuple[int, str]]) -> None:
    state = PartitionProducerState()
    open_at: dict[int, int] = {}
    aborted: list[tuple[int, int, int]] = []
    for offset, (pid, kind) in enumerate(events):
        if kind == "data":
            state.on_transactional_batch(pid, offset)
            open_at.setdefault(pid, offset)
        else:
            state.on_marker(pid, 0, kind == "commit", offset)
            first = open_at.pop(pid, None)
            if kind == "abort" and first is not None:
                aborted.append((pid, first, offset))
        hw = offset + 1
        assert state.last_stable_offset(hw) == min([*open_at.values(), hw])
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in state.aborted] == aborted
    for pid, first, last in aborted:
        assert state.is_aborted(pid, first) and state.is_aborted(pid, last)
        assert any(t.producer_id == pid for t in state.aborted_between(first, first + 1))


def test_prune_keeps_every_latest_state(tmp_path: Path, monkeypatch: Any) -> None:
    from shoal.coordinator import transaction_coordinator

    monkeypatch.setattr(transaction_coordinator, "_PRUNE_SLACK", 5)

    async def run() -> None:
        cluster = Cluster(tmp_path)
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        for round_ in range(8):
            for i in range(3):
                init = await coord.init_producer_id(f"id-{i}", 30_000)
                assert init.error == ErrorCode.NONE and init.producer_epoch == round_
        before = dict(coord.txns)
        assert await coord.prune() >= 1
        starts = [p.log_start_offset for p in cluster.state_topic.partitions]
        assert any(s > 0 for s in starts)
        cluster.close()
        cluster.open()
        assert (await cluster.coordinator(LogMarkers(cluster.logs))).txns == before
        cluster.close()

    asyncio.run(run())


def test_log_cleaner_stops_at_the_last_stable_offset(tmp_path: Path) -> None:
    from shoal.broker.storage.log_cleaner import cleanable_segments

    plog = PartitionLog.open(tmp_path / "c-0", LogConfig(segment_bytes=200))

    def put(batch: bytes) -> None:
        buf = bytearray(batch)
        plog.append(buf, list(iter_batches(buf)))

    put(encode_batch([RecordInput(key=b"k", value=b"plain")]))
    put(encode_batch([RecordInput(key=b"k", value=b"open")], producer_id=3, producer_epoch=0, base_sequence=0,
                     is_transactional=True))
    for i in range(6):
        put(encode_batch([RecordInput(key=b"k", value=b"later-%d" % i)]))
    plog.flush_sync()
    assert plog.last_stable_offset == 1
    assert all(seg.next_offset <= 1 for seg in cleanable_segments(plog, 0))
    plog.append_marker(producer_id=3, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=0)
    plog.flush_sync()
    assert any(seg.next_offset > 1 for seg in cleanable_segments(plog, 0))
    plog.close()


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=40), st.sampled_from(list(TxnState)),
       st.frozensets(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)), max_size=4))
def test_transaction_log_records_round_trip_on_their_own_topic(txn_id: str, state: TxnState,
                                                               partitions: frozenset[tuple[str, int]]) -> None:
    """TransactionLog records are type 0 on `__transaction_state`, where `__share_group_state` has its
    ShareSnapshot and `__consumer_offsets` its offset commit: each topic decodes type 0 its own way."""
    meta = TxnMetadata(txn_id, 7, 3, 60_000, state, partitions, 11, 12)
    key, value = encode_record(to_record(meta))
    assert from_record(decode_record(key, value, topic=TRANSACTION_STATE)) == (txn_id, meta)
    assert from_record(decode_record(key, None, topic=TRANSACTION_STATE)) == (txn_id, None)
    assert type(decode_record(key, None, topic=TRANSACTION_STATE).key) is not type(
        decode_record(*encode_record(CoordinatorRecord(SHARE_SNAPSHOT, key_class(SHARE_SNAPSHOT, topic=SHARE_GROUP_STATE)(
            group_id="g", topic_id=b"\x01" * 16, partition=0), None)), topic=SHARE_GROUP_STATE).key)


def test_transaction_version_2_bumps_the_epoch_and_moves_to_a_new_producer_id_when_it_runs_out(tmp_path: Path) -> None:
    """KIP-890 part 2: EndTxn v5 ends each transaction with the epoch bumped (markers included); at the
    last epoch the Prepare record names a new producer id, the Complete record switches to it at epoch 0,
    a retry of that EndTxn gets the same answer, and the state survives a reload of __transaction_state."""
    async def run() -> None:
        cluster = Cluster(tmp_path)
        coord = await cluster.coordinator(LogMarkers(cluster.logs))
        init = await coord.init_producer_id("app", 30_000)
        pid = init.producer_id
        tp = ("t", 0)
        assert await coord.add_partitions("app", pid, 0, [tp], transaction_version=2) == ErrorCode.NONE
        cluster.produce_txn(tp, pid, 0, 0)
        ended = await coord.end_txn_v2("app", pid, 0, commit=True)
        assert (ended.error, ended.producer_id, ended.producer_epoch) == (ErrorCode.NONE, pid, 1)
        # While the markers are written a retry is told to wait, as in Kafka.
        assert (await coord.end_txn_v2("app", pid, 0, commit=True)).error in (
            ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NONE)
        await _settle(coord)
        assert coord.txns["app"].state == TxnState.COMPLETE_COMMIT
        # Then the same EndTxn again (its answer was lost) is a retry: the same answer, nothing written.
        again = await coord.end_txn_v2("app", pid, 0, commit=True)
        assert (again.error, again.producer_id, again.producer_epoch) == (ErrorCode.NONE, pid, 1)
        assert cluster.logs[tp].last_stable_offset == cluster.logs[tp].log_end_offset
        # The old epoch is fenced now, for EndTxn as for adding partitions.
        assert (await coord.end_txn_v2("app", pid, 0, commit=False)).error == ErrorCode.INVALID_TXN_STATE
        assert await coord.add_partitions("app", pid, 0, [tp], transaction_version=2) == ErrorCode.PRODUCER_FENCED

        def near_the_end() -> Any:
            yield [to_record(coord.txns["app"].but(producer_epoch=32765))]

        await coord._holding("app", near_the_end)
        for epoch in (32765, 32766):
            assert await coord.add_partitions("app", pid, epoch, [tp], transaction_version=2) == ErrorCode.NONE
            cluster.produce_txn(tp, pid, epoch, 0)
            ended = await coord.end_txn_v2("app", pid, epoch, commit=True)
            await _settle(coord)
        new_pid = ended.producer_id
        assert ended.error == ErrorCode.NONE and new_pid != pid and ended.producer_epoch == 0
        meta = coord.txns["app"]
        assert (meta.producer_id, meta.producer_epoch, meta.previous_producer_id) == (new_pid, 0, pid)
        retry = await coord.end_txn_v2("app", pid, 32766, commit=True)
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.NONE, new_pid, 0)
        assert cluster.logs[tp].last_stable_offset == cluster.logs[tp].log_end_offset
        # An abort with no partition added still bumps the epoch (it fences whoever used the last one).
        aborted = await coord.end_txn_v2("app", new_pid, 0, commit=False)
        assert (aborted.error, aborted.producer_id, aborted.producer_epoch) == (ErrorCode.NONE, new_pid, 1)
        await _settle(coord)
        await coord.stop()
        reloaded = await cluster.coordinator(LogMarkers(cluster.logs))
        assert reloaded.txns["app"] == coord.txns["app"]
        assert reloaded.txns["app"].client_transaction_version == 2
        cluster.close()

    asyncio.run(run())


def test_a_timed_out_transaction_version_2_transaction_is_fenced_past_a_retry(tmp_path: Path) -> None:
    """The timeout's abort fences the epoch and, for a version 2 transaction, bumps it again as every end
    does, so the producer's own late EndTxn is PRODUCER_FENCED rather than taken for a retry."""
    async def run() -> None:
        cluster = Cluster(tmp_path)
        now = [1_000_000]
        coord = TransactionCoordinator(InternalTopicLog(cluster.state_topic), LogMarkers(cluster.logs),
                                       cluster.allocate, max_timeout_ms=MAX_TIMEOUT, offsets_placement=Placement(3),
                                       clock=lambda: now[0])
        await coord.load()
        init = await coord.init_producer_id("app", 1000)
        pid = init.producer_id
        assert await coord.add_partitions("app", pid, 0, [("t", 0)], transaction_version=2) == ErrorCode.NONE
        cluster.produce_txn(("t", 0), pid, 0, 0)
        now[0] += 5000
        assert await coord.abort_timed_out() == ["app"]
        await _settle(coord)
        meta = coord.txns["app"]
        assert (meta.state, meta.producer_epoch) == (TxnState.COMPLETE_ABORT, 2)
        assert cluster.logs[("t", 0)].producer_state.aborted[-1].producer_id == pid
        assert (await coord.end_txn_v2("app", pid, 0, commit=True)).error == ErrorCode.PRODUCER_FENCED
        await coord.stop()
        cluster.close()

    asyncio.run(run())


class HeldMarkers(LogMarkers):
    """Markers written only once `release` is set: the window between EndTxn's answer and its markers."""

    def __init__(self, logs: dict[tuple[str, int], PartitionLog]):
        super().__init__(logs)
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[tuple[str, int]], coordinator_epoch: int = 0,
                            transaction_version: int = 0) -> set[tuple[str, int]]:
        self.waiting.set()
        await self.release.wait()
        return await super().write_markers(producer_id, producer_epoch, commit, partitions, coordinator_epoch,
                                           transaction_version)


def _state_batches(cluster: Cluster, coord: TransactionCoordinator, txn_id: str) -> list[list[TxnState]]:
    """The states of `txn_id` on __transaction_state, one list per batch (one batch per append)."""
    partition = coord.partition_for(txn_id)
    out = []
    for _header, records in InternalTopicLog(cluster.state_topic)._batches(partition):
        states = []
        for r in records:
            assert r.key is not None and r.value is not None
            record = decode_record(bytes(r.key), bytes(r.value), topic=TRANSACTION_STATE)
            tid, meta = from_record(record)
            if tid == txn_id and meta is not None:
                states.append(meta.state)
        out.append(states)
    return out


@given(commit=st.booleans(), version=st.sampled_from([1, 2]), next_before_markers=st.booleans())
@settings(max_examples=12, deadline=None)
def test_the_next_transaction_carries_the_complete_record_of_the_last(tmp_path_factory: Any, commit: bool,
                                                                       version: int,
                                                                       next_before_markers: bool) -> None:
    """A producer's next transaction asks to add a partition while the last one's markers are written:
    it waits for them, and the last one's Complete record goes in the same append as the new Ongoing one,
    Complete first (Kafka's order, one fsync for the two). Asked after the completion ended, it writes its
    Ongoing record alone. Either way the markers are on every partition before the Ongoing record, and a
    reload of __transaction_state gives the same state."""
    base = tmp_path_factory.mktemp("next")

    async def run() -> None:
        cluster = Cluster(base)
        markers = HeldMarkers(cluster.logs)
        coord = await cluster.coordinator(markers)
        init = await coord.init_producer_id("app", 30_000)
        pid, epoch = init.producer_id, init.producer_epoch
        assert await coord.add_partitions("app", pid, epoch, list(cluster.logs), transaction_version=version) == 0
        for tp in cluster.logs:
            cluster.produce_txn(tp, pid, epoch, 0)
        if version == 2:
            ended = await coord.end_txn_v2("app", pid, epoch, commit)
            assert ended.error == ErrorCode.NONE
            epoch = ended.producer_epoch
        else:
            assert await coord.end_txn("app", pid, epoch, commit) == ErrorCode.NONE
        await markers.waiting.wait()
        prepared = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        completed = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        assert coord.txns["app"].state == prepared
        if next_before_markers:
            adding = asyncio.ensure_future(coord.add_partitions("app", pid, epoch, [("t", 0)],
                                                                transaction_version=version))
            await asyncio.sleep(0.05)
            assert not adding.done()  # it waits for the markers
            assert coord.txns["app"].state == prepared
            markers.release.set()
            assert await adding == ErrorCode.NONE
        else:
            markers.release.set()
            await _settle(coord)
            assert coord.txns["app"].state == completed
            assert await coord.add_partitions("app", pid, epoch, [("t", 0)],
                                              transaction_version=version) == ErrorCode.NONE
        for plog in cluster.logs.values():
            assert plog.last_stable_offset == plog.log_end_offset  # every marker is in
        await _settle(coord)
        meta = coord.txns["app"]
        assert (meta.state, meta.partitions, meta.producer_epoch) == (TxnState.ONGOING, frozenset({("t", 0)}), epoch)
        last_two = [[completed, TxnState.ONGOING]] if next_before_markers else [[completed], [TxnState.ONGOING]]
        assert _state_batches(cluster, coord, "app")[-len(last_two):] == last_two
        await coord.stop()
        cluster.close()
        cluster.open()
        assert (await cluster.coordinator(LogMarkers(cluster.logs))).txns["app"] == meta
        cluster.close()

    asyncio.run(run())


def test_a_refused_request_of_the_next_transaction_leaves_the_complete_record_to_the_completion(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A request that arrives during the markers and is refused (a stale epoch) writes nothing; the
    completion still writes the Complete record. One that waits past the wait limit for the markers is
    told CONCURRENT_TRANSACTIONS, as in Kafka."""
    from shoal.coordinator import transaction_coordinator

    monkeypatch.setattr(transaction_coordinator, "_COMPLETION_WAIT_S", 0.05)

    async def run() -> None:
        cluster = Cluster(tmp_path)
        markers = HeldMarkers(cluster.logs)
        coord = await cluster.coordinator(markers)
        init = await coord.init_producer_id("app", 30_000)
        pid = init.producer_id
        assert await coord.add_partitions("app", pid, 0, [("t", 1)], transaction_version=2) == ErrorCode.NONE
        cluster.produce_txn(("t", 1), pid, 0, 0)
        assert (await coord.end_txn_v2("app", pid, 0, commit=True)).producer_epoch == 1
        await markers.waiting.wait()
        assert await coord.add_partitions("app", pid, 1, [("t", 0)], transaction_version=2) == (
            ErrorCode.CONCURRENT_TRANSACTIONS)
        stale = asyncio.ensure_future(coord.add_partitions("app", pid, 0, [("t", 0)], transaction_version=2))
        await asyncio.sleep(0.01)
        markers.release.set()
        assert await stale == ErrorCode.PRODUCER_FENCED
        await _settle(coord)
        assert coord.txns["app"].state == TxnState.COMPLETE_COMMIT
        assert _state_batches(cluster, coord, "app")[-1] == [TxnState.COMPLETE_COMMIT]
        cluster.close()

    asyncio.run(run())
