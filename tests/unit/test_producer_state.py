"""Idempotent-producer sequence checks, and their recovery from the log after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.broker.storage.producer_state import PartitionProducerState, ProducerIdAllocator
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch


def test_retry_of_a_recent_batch_is_a_duplicate_with_its_offset() -> None:
    state = PartitionProducerState()
    state.record(1, 0, 0, 3, base_offset=10)
    state.record(1, 0, 3, 2, base_offset=13)
    check = state.check(1, 0, 0, 3)
    assert check.error == ErrorCode.NONE and check.duplicate_offset == 10
    assert state.check(1, 0, 5, 1).duplicate_offset == -1
    assert state.check(1, 0, 7, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_epochs_fence_and_reset_sequences() -> None:
    state = PartitionProducerState()
    state.record(1, 3, 0, 1, base_offset=0)
    assert state.check(1, 2, 1, 1).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check(1, 4, 0, 1).error == ErrorCode.NONE
    assert state.check(1, 4, 5, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_only_the_last_five_batches_are_remembered() -> None:
    state = PartitionProducerState()
    for i in range(7):
        state.record(9, 0, i, 1, base_offset=i)
    assert state.check(9, 0, 1, 1).duplicate_offset == -1  # fell out of the window
    assert state.check(9, 0, 6, 1).duplicate_offset == 6


def test_state_is_rebuilt_from_the_log_tail(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=400))
    for i in range(6):
        batch = bytearray(encode_batch([RecordInput(value=b"x" * 20)] * 2, producer_id=7, producer_epoch=0,
                                       base_sequence=2 * i))
        plog.append(batch, list(iter_batches(batch)))
    plog.close()
    reopened = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=400))
    state = reopened.producer_state
    assert state.check(7, 0, 10, 2).duplicate_offset == 10
    assert state.check(7, 0, 12, 2).error == ErrorCode.NONE
    assert state.check(7, 0, 14, 2).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_producer_ids_never_repeat_across_restarts(tmp_path: Path) -> None:
    first = ProducerIdAllocator(tmp_path / "ids")
    used = {first.allocate() for _ in range(5)}
    second = ProducerIdAllocator(tmp_path / "ids")
    assert second.allocate() not in used


def _big_transactional_log(directory: Path) -> None:
    """About 12 MiB: an open transaction first (so the partition keeps transaction files and its last
    stable offset needs the producer state), then idempotent batches of 256 KiB."""
    plog = PartitionLog.open(directory, LogConfig())
    txn = bytearray(encode_batch([RecordInput(value=b"t")], producer_id=3, producer_epoch=0, base_sequence=0,
                                 is_transactional=True))
    plog.append(txn, list(iter_batches(txn)))
    for i in range(48):
        batch = bytearray(encode_batch([RecordInput(value=bytes(256 * 1024))], producer_id=7, producer_epoch=0,
                                       base_sequence=i))
        plog.append(batch, list(iter_batches(batch)))
    plog.close()


async def test_the_first_build_after_a_restart_lets_other_work_run(tmp_path: Path) -> None:
    """The rebuild reads 4 MiB at a time and gives the event loop a turn after each chunk: work started
    after it (a request on another connection) runs before it ends. Ordering, not time, is asserted."""
    _big_transactional_log(tmp_path / "p")
    reopened = PartitionLog.open(tmp_path / "p", LogConfig())
    order: list[str] = []

    async def load() -> None:
        await reopened.load_producer_state(only_for_transactions=True)
        order.append("built")

    async def other_request() -> None:
        await asyncio.sleep(0)
        order.append("answered")

    loading = asyncio.create_task(load())
    second = asyncio.create_task(reopened.load_producer_state())  # shares the one build
    await asyncio.gather(loading, second, asyncio.create_task(other_request()))
    assert order == ["answered", "built"]
    # The same state the one-go build finds: the open transaction holds the LSO, the sequences continue.
    assert reopened.last_stable_offset == 0
    assert reopened.producer_state.check(7, 0, 48, 1).error == ErrorCode.NONE
    assert reopened.producer_state.check(7, 0, 47, 1).duplicate_offset == 48
    reopened.close()


async def test_a_partition_that_never_saw_a_transaction_is_not_built_for_its_lso(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "p", LogConfig())
    batch = bytearray(encode_batch([RecordInput(value=b"x")], producer_id=7, producer_epoch=0, base_sequence=0))
    plog.append(batch, list(iter_batches(batch)))
    plog.close()
    reopened = PartitionLog.open(tmp_path / "p", LogConfig())
    await reopened.load_producer_state(only_for_transactions=True)
    assert reopened._producer_state is None and reopened.last_stable_offset == 1
    await reopened.load_producer_state()
    assert reopened.producer_state.check(7, 0, 0, 1).duplicate_offset == 0
    reopened.close()


def test_markers_keep_the_coordinator_epoch_and_fence_older_ones() -> None:
    """Kafka's ProducerAppendInfo: a marker older than the producer's epoch or than the last marker's
    coordinator epoch is refused; a new producer epoch keeps the coordinator epoch."""
    state = PartitionProducerState()
    assert state.check_marker(1, 0, -1) is None  # unknown producer: nothing to fence against
    state.record(1, 2, 0, 1, base_offset=0)
    state.on_transactional_batch(1, 0)
    assert state.check_marker(1, 2, 3) is None
    state.on_marker(1, 2, commit=True, offset=1, coordinator_epoch=3)
    assert state.producers[1].coordinator_epoch == 3
    refused = state.check_marker(1, 2, 2)
    assert refused is not None and refused[0] == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    refused = state.check_marker(1, 1, 3)
    assert refused is not None and refused[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    state.record(1, 3, 0, 1, base_offset=2)
    assert state.producers[1].coordinator_epoch == 3
    assert state.check_marker(1, 3, 3) is None


def test_a_transaction_version_2_marker_needs_a_bumped_epoch_unless_it_repeats_the_last_one() -> None:
    """KIP-1228: a version 2 marker at the producer's own epoch is refused while its transaction is open
    (the coordinator bumps the epoch for every end), and taken again once the transaction has ended there
    (a marker retried after a coordinator restart)."""
    state = PartitionProducerState()
    state.record(1, 4, 0, 1, base_offset=0)
    state.on_transactional_batch(1, 0)
    refused = state.check_marker(1, 4, 0, transaction_version=2)
    assert refused is not None and refused[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check_marker(1, 4, 0, transaction_version=1) is None
    assert state.check_marker(1, 5, 0, transaction_version=2) is None
    state.on_marker(1, 5, commit=True, offset=1, coordinator_epoch=0)
    assert state.check_marker(1, 5, 0, transaction_version=2) is None
    assert state.check_marker(1, 4, 0, transaction_version=2) is not None
