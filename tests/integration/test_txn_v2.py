"""transaction.version 2 (KIP-890 part 2) at the wire level, since no Python client speaks it yet: the broker
advertises the finalized feature, adds a producer's partitions on its first transactional Produce (v12) and
its group's offsets partition on TxnOffsetCommit (v5), and every EndTxn (v5) bumps the producer epoch and
answers with the producer id and epoch to use next, so a late write of an ended transaction is fenced
rather than left hanging."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient, lso_and_end, produce, write_txn_marker
from .names import unique_name
from .partition_reader import read_partition


@pytest.fixture(scope="module")
def tv2_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("tv2") / "data").start()
    yield proc
    proc.stop()


def _topic(bootstrap: str) -> str:
    topic = unique_name("tv2")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def _init(wire: WireClient, txn_id: str) -> tuple[int, int]:
    init = wire.request(ApiKey.INIT_PRODUCER_ID, 5, messages.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout_ms=30_000, producer_id=-1, producer_epoch=-1))
    assert init.error_code == ErrorCode.NONE
    return init.producer_id, init.producer_epoch


def _send(wire: WireClient, txn_id: str, topic: str, value: bytes, pid: int, epoch: int, seq: int) -> int:
    batch = encode_batch([RecordInput(value=value)], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                         is_transactional=True)
    resp = produce(wire, topic, batch, transactional_id=txn_id, version=12)
    return int(resp.responses[0].partition_responses[0].error_code)


def _end(wire: WireClient, txn_id: str, pid: int, epoch: int, commit: bool) -> Any:
    return wire.request(ApiKey.END_TXN, 5, messages.EndTxnRequest(
        transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit))


def _describe(wire: WireClient, txn_id: str) -> Any:
    return wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, messages.DescribeTransactionsRequest(
        transactional_ids=[txn_id])).transaction_states[0]


def _wait_state(wire: WireClient, txn_id: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while (current := _describe(wire, txn_id).transaction_state) != state:
        assert time.monotonic() < deadline, current
        time.sleep(0.05)


def test_transaction_version_2_is_finalized(tv2_broker: BrokerProcess) -> None:
    with WireClient.connect(tv2_broker.bootstrap) as wire:
        resp = wire.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
            client_software_name="shoal-tests", client_software_version="1"))
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in resp.finalized_features}
    supported = {f.name: (f.min_version, f.max_version) for f in resp.supported_features}
    assert finalized["transaction.version"] == (2, 2)
    assert supported["transaction.version"] == (0, 2)
    offered = {a.api_key: a.max_version for a in resp.api_keys}
    assert offered[ApiKey.END_TXN] >= 5 and offered[ApiKey.PRODUCE] >= 12 and offered[ApiKey.TXN_OFFSET_COMMIT] >= 5


def test_every_end_bumps_the_epoch_and_fences_a_late_write(tv2_broker: BrokerProcess) -> None:
    topic = _topic(tv2_broker.bootstrap)
    txn_id = unique_name("tv2")
    with WireClient.connect(tv2_broker.bootstrap) as wire:
        pid, epoch = _init(wire, txn_id)
        # No AddPartitionsToTxn: the Produce adds the partition to the transaction.
        assert _send(wire, txn_id, topic, b"committed", pid, epoch, 0) == ErrorCode.NONE
        state = _describe(wire, txn_id)
        assert state.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in state.topics] == [(topic, [0])]
        lso, end = lso_and_end(wire, topic)
        assert lso < end
        ended = _end(wire, txn_id, pid, epoch, True)
        assert (ended.error_code, ended.producer_id, ended.producer_epoch) == (ErrorCode.NONE, pid, epoch + 1)
        _wait_state(wire, txn_id, "CompleteCommit")
        # The markers carried the bumped epoch; a version 2 marker (WriteTxnMarkers v2) at the old one is
        # refused, where a version 1 marker at it would still be taken (KIP-1228).
        assert write_txn_marker(wire, topic, pid, epoch, 0, version=2,
                                transaction_version=2) == ErrorCode.INVALID_PRODUCER_EPOCH
        # A retry of that EndTxn (its answer lost) gets the same answer.
        again = _end(wire, txn_id, pid, epoch, True)
        assert (again.error_code, again.producer_id, again.producer_epoch) == (ErrorCode.NONE, pid, epoch + 1)

        epoch += 1
        assert _send(wire, txn_id, topic, b"aborted", pid, epoch, 0) == ErrorCode.NONE
        ended = _end(wire, txn_id, pid, epoch, False)
        assert (ended.error_code, ended.producer_epoch) == (ErrorCode.NONE, epoch + 1)
        _wait_state(wire, txn_id, "CompleteAbort")
        # The aborted transaction's late retry carries the old epoch: fenced, and nothing is left open.
        assert _send(wire, txn_id, topic, b"late", pid, epoch, 1) == ErrorCode.INVALID_PRODUCER_EPOCH
        assert _end(wire, txn_id, pid, epoch - 1, True).error_code == ErrorCode.PRODUCER_FENCED
        lso, end = lso_and_end(wire, topic)
        assert lso == end
    assert [v for _o, _k, v in read_partition(tv2_broker.bootstrap, topic, "read_committed")] == [b"committed"]


def test_txn_offset_commit_adds_the_group_to_the_transaction(tv2_broker: BrokerProcess) -> None:
    topic = _topic(tv2_broker.bootstrap)
    txn_id, group = unique_name("tv2-offsets"), unique_name("tv2-group")
    toc = messages.TxnOffsetCommitRequest
    with WireClient.connect(tv2_broker.bootstrap) as wire:
        pid, epoch = _init(wire, txn_id)
        assert _send(wire, txn_id, topic, b"out", pid, epoch, 0) == ErrorCode.NONE

        def commit(version: int, offset: int) -> int:
            resp = wire.request(ApiKey.TXN_OFFSET_COMMIT, version, toc(
                transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch,
                generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                topics=[toc.TxnOffsetCommitRequestTopic(name=topic, partitions=[toc.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])]))
            return int(resp.topics[0].partitions[0].error_code)

        # A transaction.version 1 client must have sent AddOffsetsToTxn first (told TRANSACTION_ABORTABLE from
        # v4, which knows that error, INVALID_TXN_STATE before); a v5 one need not.
        assert commit(3, 7) == ErrorCode.INVALID_TXN_STATE
        assert commit(4, 7) == ErrorCode.TRANSACTION_ABORTABLE
        assert commit(5, 7) == ErrorCode.NONE
        assert _end(wire, txn_id, pid, epoch, True).error_code == ErrorCode.NONE
        _wait_state(wire, txn_id, "CompleteCommit")
    # The markers (the offsets partition's included) are durable before CompleteCommit is written.
    consumer = Consumer({"bootstrap.servers": tv2_broker.bootstrap, "group.id": group})
    try:
        [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        assert committed.offset == 7
    finally:
        consumer.close()


def test_a_new_incarnation_fences_an_open_version_2_transaction(tv2_broker: BrokerProcess) -> None:
    topic = _topic(tv2_broker.bootstrap)
    txn_id = unique_name("tv2-fence")
    with WireClient.connect(tv2_broker.bootstrap) as wire:
        pid, epoch = _init(wire, txn_id)
        assert _send(wire, txn_id, topic, b"zombie", pid, epoch, 0) == ErrorCode.NONE
        # The next incarnation's InitProducerId aborts the open transaction first (answering
        # CONCURRENT_TRANSACTIONS meanwhile), then gets an epoch past every one the old one could use.
        deadline = time.monotonic() + 30
        while True:
            init = wire.request(ApiKey.INIT_PRODUCER_ID, 5, messages.InitProducerIdRequest(
                transactional_id=txn_id, transaction_timeout_ms=30_000, producer_id=-1, producer_epoch=-1))
            if init.error_code != ErrorCode.CONCURRENT_TRANSACTIONS:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert init.error_code == ErrorCode.NONE and init.producer_id == pid and init.producer_epoch > epoch + 1
        assert _end(wire, txn_id, pid, epoch, True).error_code == ErrorCode.PRODUCER_FENCED
        assert _send(wire, txn_id, topic, b"late", pid, epoch, 1) == ErrorCode.INVALID_PRODUCER_EPOCH
        lso, end = lso_and_end(wire, topic)
        assert lso == end
    assert read_partition(tv2_broker.bootstrap, topic, "read_committed") == []


def _send_retrying(wire: WireClient, txn_id: str, topic: str, value: bytes, pid: int, epoch: int) -> int:
    """A transaction's first Produce, sent again while the broker answers CONCURRENT_TRANSACTIONS (the last
    transaction's markers took longer than it waits for them), as a client does."""
    deadline = time.monotonic() + 30
    while (code := _send(wire, txn_id, topic, value, pid, epoch, 0)) == ErrorCode.CONCURRENT_TRANSACTIONS:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return code


def test_back_to_back_transactions_then_a_kill_right_after_a_commit(tmp_path: Any) -> None:
    """Each transaction's Produce goes out the moment the last EndTxn is answered, while that one's markers
    are still being written (the broker holds it until they are durable, then writes the last one's
    Complete record with the new Ongoing one). A read_committed reader sees a transaction's record only
    after its commit, and after a kill -9 right behind the last commit answer and a restart every committed
    record is there, in order, and the producer carries on with the epoch it was last given."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        topic = _topic(proc.bootstrap)
        txn_id = unique_name("tv2-b2b")
        with WireClient.connect(proc.bootstrap) as wire:
            pid, epoch = _init(wire, txn_id)
            for i in range(12):
                assert _send_retrying(wire, txn_id, topic, b"v%d" % i, pid, epoch) == ErrorCode.NONE
                lso, end = lso_and_end(wire, topic)
                assert lso < end  # not readable committed before the commit
                ended = _end(wire, txn_id, pid, epoch, True)
                assert (ended.error_code, ended.producer_id) == (ErrorCode.NONE, pid)
                epoch = ended.producer_epoch
        proc.kill()
        proc.start()
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == [
            b"v%d" % i for i in range(12)]
        with WireClient.connect(proc.bootstrap) as wire:
            assert _send_retrying(wire, txn_id, topic, b"after", pid, epoch) == ErrorCode.NONE
            assert _end(wire, txn_id, pid, epoch, True).error_code == ErrorCode.NONE
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")][-1] == b"after"
    finally:
        proc.stop()
