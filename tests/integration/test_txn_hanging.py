"""Hanging transactions: a transactional write the coordinator knows nothing of (a late retry after an
abort) is refused with INVALID_TXN_STATE while partition verification is on (KIP-890 part 1); with it
off, the write opens a transaction no one ends, and kafka-python's admin client repairs it the way
`kafka-transactions.sh abort` does (DescribeProducers, then WriteTxnMarkers). A marker carries its
coordinator's epoch, and a partition refuses one older than the last it took (TRANSACTION_COORDINATOR_FENCED)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import AbortTransactionSpec

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient, lso_and_end, produce, write_txn_marker
from .names import unique_name
from .partition_reader import read_partition


def _create(bootstrap: str) -> str:
    topic = unique_name("hang")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def _produce(wire: WireClient, txn_id: str | None, topic: str, value: bytes, *, pid: int = -1, epoch: int = -1,
             seq: int = -1, transactional: bool = False) -> int:
    batch = encode_batch([RecordInput(value=value)], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                         is_transactional=transactional)
    resp = produce(wire, topic, batch, transactional_id=txn_id)
    return int(resp.responses[0].partition_responses[0].error_code)


def _aborted_transaction(wire: WireClient, topic: str, txn_id: str) -> tuple[int, int]:
    """A transaction with one record on partition 0, aborted through the coordinator."""
    init = wire.request(ApiKey.INIT_PRODUCER_ID, 4, messages.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout_ms=30_000, producer_id=-1, producer_epoch=-1))
    assert init.error_code == ErrorCode.NONE
    pid, epoch = init.producer_id, init.producer_epoch
    ap = messages.AddPartitionsToTxnRequest
    added = wire.request(ApiKey.ADD_PARTITIONS_TO_TXN, 3, ap(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[ap.AddPartitionsToTxnTopic(name=topic, partitions=[0])]))
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    assert _produce(wire, txn_id, topic, b"aborted", pid=pid, epoch=epoch, seq=0, transactional=True) == 0
    end = wire.request(ApiKey.END_TXN, 3, messages.EndTxnRequest(
        transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=False))
    assert end.error_code == ErrorCode.NONE
    deadline = time.monotonic() + 30
    while (state := wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, messages.DescribeTransactionsRequest(
            transactional_ids=[txn_id])).transaction_states[0].transaction_state) != "CompleteAbort":
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    return pid, epoch


def _coordinator_epoch(wire: WireClient, topic: str, pid: int) -> int:
    dp = messages.DescribeProducersRequest
    resp = wire.request(ApiKey.DESCRIBE_PRODUCERS, 0, dp(topics=[dp.TopicRequest(name=topic, partition_indexes=[0])]))
    [state] = [p for p in resp.topics[0].partitions[0].active_producers if p.producer_id == pid]
    return int(state.coordinator_epoch)


def test_a_late_transactional_write_after_an_abort_is_refused(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        topic = _create(proc.bootstrap)
        txn_id = unique_name("late")
        with WireClient.connect(proc.bootstrap) as wire:
            pid, epoch = _aborted_transaction(wire, topic, txn_id)
            # The producer's retry of a batch of the aborted transaction arrives late.
            assert _produce(wire, txn_id, topic, b"late", pid=pid, epoch=epoch, seq=1,
                            transactional=True) == ErrorCode.INVALID_TXN_STATE
            # A fenced incarnation's write is refused too.
            assert _produce(wire, txn_id, topic, b"old", pid=pid, epoch=epoch - 1 if epoch else 0, seq=1,
                            transactional=True) in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE)
            # Transactional records without a transactional id, as Kafka answers them.
            assert _produce(wire, None, topic, b"anon", pid=pid, epoch=epoch, seq=1,
                            transactional=True) == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert _produce(wire, None, topic, b"plain") == ErrorCode.NONE
            lso, end = lso_and_end(wire, topic)
            assert lso == end  # nothing hangs
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == [b"plain"]
    finally:
        proc.stop()


def test_a_hanging_transaction_is_repaired_through_the_admin_api(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", overrides=["transaction.partition.verification.enable=false"]).start()
    try:
        topic = _create(proc.bootstrap)
        txn_id = unique_name("hanging")
        with WireClient.connect(proc.bootstrap) as wire:
            pid, epoch = _aborted_transaction(wire, topic, txn_id)
            # Without verification the late retry is appended and opens a transaction no one will end.
            assert _produce(wire, txn_id, topic, b"late", pid=pid, epoch=epoch, seq=1, transactional=True) == 0
            assert _produce(wire, None, topic, b"after") == 0
            lso, end = lso_and_end(wire, topic)
            assert lso < end  # the LSO is stuck at the hanging transaction's first offset
            # The coordinator's ABORT marker carried its coordinator epoch (0 on one broker); the partition
            # keeps it, and refuses markers of an older coordinator epoch or producer epoch, as Kafka does.
            assert _coordinator_epoch(wire, topic, pid) == 0
            assert write_txn_marker(wire, topic, pid, epoch, -1) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
            if epoch > 0:
                assert write_txn_marker(wire, topic, pid, epoch - 1, 0) == ErrorCode.INVALID_PRODUCER_EPOCH
            assert lso_and_end(wire, topic)[0] == lso  # nothing was written
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == []

        admin: Any = KafkaAdminClient(bootstrap_servers=proc.bootstrap)
        try:
            tp = KpTopicPartition(topic, 0)
            [producer] = [p for p in admin.describe_producers([tp])[tp].active_producers
                          if p.current_transaction_start_offset >= 0]
            assert producer.producer_id == pid
            admin.abort_transaction(AbortTransactionSpec(
                topic_partition=tp, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                coordinator_epoch=producer.coordinator_epoch))
            assert not [p for p in admin.describe_producers([tp])[tp].active_producers
                        if p.current_transaction_start_offset >= 0]
        finally:
            admin.close()
        with WireClient.connect(proc.bootstrap) as wire:
            lso, end = lso_and_end(wire, topic)
            assert lso == end
            # A marker from a newer coordinator epoch is taken and remembered; the older one is then fenced.
            assert write_txn_marker(wire, topic, pid, epoch, 7) == ErrorCode.NONE
            assert _coordinator_epoch(wire, topic, pid) == 7
            assert write_txn_marker(wire, topic, pid, epoch, 5) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == [b"after"]
        # The partition's producer state is rebuilt from the log after a restart, coordinator epoch included.
        proc.stop()
        proc.start()
        with WireClient.connect(proc.bootstrap) as wire:
            assert write_txn_marker(wire, topic, pid, epoch, 5) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
            assert _coordinator_epoch(wire, topic, pid) == 7
    finally:
        proc.stop()
