"""Transactions through the real broker with real clients.

confluent-kafka's transactional producer commits one transaction and aborts another; read_committed
consumers of confluent-kafka, kafka-python and aiokafka see only the committed records, a
read_uncommitted one sees both; zombie fencing; the broker killed between prepare and markers (a marker
write failing on a swapped-out partition directory); OffsetFetch with RequireStable; bad
input over the wire; a share group with share.isolation.level=read_committed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from shoal.client import Producer as ShoalProducer
from shoal.client.errors import KafkaError as ShoalKafkaError
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT
from .kafka_wire import WireClient
from .share_clients import Consumed, poll_until, set_group_config, share_consumer
from .test_share_admin import describe_offsets, offsets_by_partition

TXN_OVERRIDES = [*FAST_HEARTBEAT, "transaction.max.timeout.ms=60000",
                 "transaction.abort.timed.out.transaction.cleanup.interval.ms=500",
                 "transaction.state.log.num.partitions=3", "offsets.topic.num.partitions=3"]


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("txn") / "data", overrides=TXN_OVERRIDES).start()
    yield proc
    proc.stop()


def _topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _producer(bootstrap: str, txn_id: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                     "transaction.timeout.ms": 30000, **extra})


def _write_commit_and_abort(bootstrap: str, topic: str, partitions: int) -> tuple[set[bytes], set[bytes]]:
    p = _producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    p.init_transactions(30)
    committed = {f"c{i}".encode() for i in range(20)}
    aborted = {f"a{i}".encode() for i in range(20)}
    p.begin_transaction()
    for i, v in enumerate(sorted(committed)):
        p.produce(topic, v, partition=i % partitions)
    p.commit_transaction(30)
    p.begin_transaction()
    for i, v in enumerate(sorted(aborted)):
        p.produce(topic, v, partition=i % partitions)
    p.flush(30)
    p.abort_transaction(30)
    # One more committed record after the aborted ones, so a read_committed reader must skip past them.
    p.begin_transaction()
    for part in range(partitions):
        p.produce(topic, b"tail", partition=part)
    p.commit_transaction(30)
    committed.add(b"tail")
    return committed, aborted


def _latest(bootstrap: str, topic: str, *, read_committed: bool) -> int:
    """ListOffsets latest of partition 0: the LSO with read_committed, else the high watermark."""
    lo = messages.ListOffsetsRequest
    topic_req = lo.ListOffsetsTopic(name=topic, partitions=[lo.ListOffsetsPartition(
        partition_index=0, timestamp=-1, current_leader_epoch=-1)])
    with WireClient.connect(bootstrap) as wire:
        resp = wire.request(ApiKey.LIST_OFFSETS, 7, lo(replica_id=-1, isolation_level=int(read_committed),
                                                       topics=[topic_req]))
    return int(resp.topics[0].partitions[0].offset)


def _confluent_read(bootstrap: str, topic: str, partitions: int, isolation: str, want: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(100, 0.5):
                if m.error() is None:
                    got.append(m.value())
        # Nothing further arrives (an aborted record would come before the tail we already have).
        got += [m.value() for m in c.consume(100, 1.0) if m.error() is None]
        return got
    finally:
        c.close()


def _kafka_python_read(bootstrap: str, topic: str, partitions: int, want: int) -> list[bytes]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level="read_committed")
    try:
        c.assign([KpTopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                got += [r.value for r in recs]
        return got
    finally:
        c.close()


async def _aiokafka_read(bootstrap: str, topic: str, partitions: int, want: int) -> list[bytes]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         isolation_level="read_committed")
    await c.start()
    try:
        c.assign([AioTopicPartition(topic, p) for p in range(partitions)])
        await c.seek_to_beginning()
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for recs in (await c.getmany(timeout_ms=500)).values():
                got += [r.value for r in recs]
        return got
    finally:
        await c.stop()


def test_commit_and_abort_read_committed_vs_uncommitted(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap)
    committed, aborted = _write_commit_and_abort(bootstrap, topic, 2)
    want = len(committed) + 1  # "tail" went to both partitions
    rc = _confluent_read(bootstrap, topic, 2, "read_committed", want)
    assert sorted(rc) == sorted([*committed, b"tail"])
    ru = _confluent_read(bootstrap, topic, 2, "read_uncommitted", want + len(aborted))
    assert sorted(ru) == sorted([*committed, b"tail", *aborted])
    assert sorted(_kafka_python_read(bootstrap, topic, 2, want)) == sorted(rc)
    assert sorted(asyncio.run(_aiokafka_read(bootstrap, topic, 2, want))) == sorted(rc)
    # ListOffsets read_committed answers the LSO; with no open transaction it is the end of the log.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-lo", "isolation.level": "read_committed"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), 10)
        assert high > low
    finally:
        c.close()


def test_open_transaction_holds_the_lso(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 1)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"before", partition=0)
    plain.flush(10)
    p = _producer(bootstrap, f"open-{uuid.uuid4().hex[:6]}")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"pending", partition=0)
    p.flush(10)
    plain.produce(topic, b"after", partition=0)
    plain.flush(10)
    assert _latest(bootstrap, topic, read_committed=True) == 1  # stops at the open transaction's first record
    assert _latest(bootstrap, topic, read_committed=False) == 3
    assert _confluent_read(bootstrap, topic, 1, "read_committed", 1) == [b"before"]
    p.commit_transaction(30)
    assert _confluent_read(bootstrap, topic, 1, "read_committed", 3) == [b"before", b"pending", b"after"]


def test_send_offsets_to_transaction(txn_broker: BrokerProcess) -> None:
    """confluent-kafka's send_offsets_to_transaction: AddOffsetsToTxn and TxnOffsetCommit inside the
    transaction, whose markers then go to the group's __consumer_offsets partition too."""
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 1)
    txn_id = f"ctp-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ctp-group-{txn_id}",
                         "enable.auto.commit": False})
    p = _producer(bootstrap, txn_id)
    try:
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, b"out", partition=0)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], consumer.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        _wait_for_state(bootstrap, txn_id, "CompleteCommit")  # the markers are written after EndTxn answers
    finally:
        consumer.close()
    assert _confluent_read(bootstrap, topic, 1, "read_committed", 1) == [b"out"]


def _fetch_offset(wire: WireClient, group: str, topic: str, version: int, require_stable: bool) -> tuple[int, int, int]:
    """OffsetFetch of partitions 0 and 1: (partition 0's error, its offset, partition 1's error)."""
    of = messages.OffsetFetchRequest
    if version >= 8:
        resp = wire.request(ApiKey.OFFSET_FETCH, version, of(groups=[of.OffsetFetchRequestGroup(
            group_id=group, member_id=None, member_epoch=-1,
            topics=[of.OffsetFetchRequestTopics(name=topic, partition_indexes=[0, 1])])], require_stable=require_stable))
        assert resp.groups[0].error_code == ErrorCode.NONE
        parts = resp.groups[0].topics[0].partitions
    else:
        resp = wire.request(ApiKey.OFFSET_FETCH, version, of(
            group_id=group, topics=[of.OffsetFetchRequestTopic(name=topic, partition_indexes=[0, 1])],
            require_stable=require_stable))
        assert resp.error_code == ErrorCode.NONE
        parts = resp.topics[0].partitions
    return int(parts[0].error_code), int(parts[0].committed_offset), int(parts[1].error_code)


def test_offset_fetch_require_stable(txn_broker: BrokerProcess) -> None:
    """While a transaction holds an offset for a partition, OffsetFetch with RequireStable (v7+) answers
    UNSTABLE_OFFSET_COMMIT for that partition alone; without it, the last committed offset. After the
    COMMIT marker the new offset is stable; librdkafka's read_committed consumer (which sets RequireStable)
    waits for it instead of reading the old one."""
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 2)
    txn_id = f"stable-{uuid.uuid4().hex[:6]}"
    group = f"stable-group-{txn_id}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    p = _producer(bootstrap, txn_id)
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, b"out", partition=0)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], consumer.consumer_group_metadata(), 30)
        with WireClient.connect(bootstrap) as wire:
            for version in (7, 8, 9):
                assert _fetch_offset(wire, group, topic, version, True) == (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1, 0)
                assert _fetch_offset(wire, group, topic, version, False) == (0, 3, 0)
            # Before v7 there is no RequireStable: the committed offset.
            assert _fetch_offset(wire, group, topic, 6, False) == (0, 3, 0)
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(consumer.committed, [TopicPartition(topic, 0)], 30)
                p.commit_transaction(30)
                assert waiting.result()[0].offset == 7
            _wait_for_state(bootstrap, txn_id, "CompleteCommit")
            for version in (7, 8):
                assert _fetch_offset(wire, group, topic, version, True) == (0, 7, 0)
    finally:
        consumer.close()


def test_zombie_is_fenced(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 1)
    txn_id = f"zombie-{uuid.uuid4().hex[:6]}"
    old = _producer(bootstrap, txn_id)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, b"zombie", partition=0)
    old.flush(10)
    new = _producer(bootstrap, txn_id)
    new.init_transactions(30)  # aborts the old incarnation's open transaction
    new.begin_transaction()
    new.produce(topic, b"fresh", partition=0)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as info:
        old.produce(topic, b"late", partition=0)
        old.commit_transaction(10)
    assert info.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                         KafkaError.INVALID_PRODUCER_EPOCH)
    assert _confluent_read(bootstrap, topic, 1, "read_committed", 1) == [b"fresh"]


def _wire_init(wire: WireClient, txn_id: str, timeout_ms: int = 30000) -> Any:
    req = messages.InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                                         producer_id=-1, producer_epoch=-1)
    return wire.request(ApiKey.INIT_PRODUCER_ID, 4, req)


def _find_txn_coordinator(wire: WireClient, txn_id: str) -> Any:
    req = messages.FindCoordinatorRequest(key_type=1, coordinator_keys=[txn_id])
    return wire.request(ApiKey.FIND_COORDINATOR, 4, req).coordinators[0]


def _add_partitions(wire: WireClient, txn_id: str, pid: int, epoch: int, topic: str) -> Any:
    ap = messages.AddPartitionsToTxnRequest
    req = ap(v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
             v3_and_below_topics=[ap.AddPartitionsToTxnTopic(name=topic, partitions=[0])])
    return wire.request(ApiKey.ADD_PARTITIONS_TO_TXN, 3, req).results_by_topic_v3_and_below[0]


def _wait_for_state(bootstrap: str, txn_id: str, wanted: str) -> None:
    with WireClient.connect(bootstrap) as wire:
        deadline = time.monotonic() + 30
        while (state := _describe(wire, txn_id).transaction_state) != wanted:
            assert time.monotonic() < deadline, state
            time.sleep(0.05)


def _txn_offset_commit(wire: WireClient, txn_id: str, pid: int, epoch: int, topic: str) -> int:
    tc = messages.TxnOffsetCommitRequest
    req = tc(transactional_id=txn_id, group_id="bad-group", producer_id=pid, producer_epoch=epoch,
             generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
             topics=[tc.TxnOffsetCommitRequestTopic(
                 name=topic, partitions=[tc.TxnOffsetCommitRequestPartition(
                     partition_index=0, committed_offset=5, committed_leader_epoch=-1, committed_metadata="")])])
    return int(wire.request(ApiKey.TXN_OFFSET_COMMIT, 3, req).topics[0].partitions[0].error_code)


def _describe(wire: WireClient, txn_id: str) -> Any:
    req = messages.DescribeTransactionsRequest(transactional_ids=[txn_id])
    return wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, req).transaction_states[0]


def test_bad_input_gets_kafka_errors_and_changes_nothing(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 1)
    txn_id = f"bad-{uuid.uuid4().hex[:6]}"
    with WireClient.connect(bootstrap) as wire:
        coord = _find_txn_coordinator(wire, txn_id)
        assert coord.error_code == ErrorCode.NONE and coord.node_id >= 0
        # A timeout above transaction.max.timeout.ms.
        assert _wire_init(wire, txn_id, 60001).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert _describe(wire, txn_id).error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        first = _wire_init(wire, txn_id)
        assert first.error_code == ErrorCode.NONE
        pid, epoch = first.producer_id, first.producer_epoch
        # An unknown topic: that partition UNKNOWN_TOPIC_OR_PARTITION, and nothing is added.
        res = _add_partitions(wire, txn_id, pid, epoch, f"missing-{uuid.uuid4().hex[:6]}")
        assert res.results_by_partition[0].partition_error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert _describe(wire, txn_id).transaction_state == "Empty"
        assert _add_partitions(wire, txn_id, pid, epoch, topic).results_by_partition[0].partition_error_code == 0
        # A second InitProducerId bumps the epoch: EndTxn from the old epoch is fenced, the state stays.
        assert _wire_init(wire, txn_id).error_code == ErrorCode.CONCURRENT_TRANSACTIONS  # aborting the open one
        deadline = time.monotonic() + 30
        while (second := _wire_init(wire, txn_id)).error_code == ErrorCode.CONCURRENT_TRANSACTIONS:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert second.error_code == ErrorCode.NONE and second.producer_id == pid and second.producer_epoch > epoch
        before = _describe(wire, txn_id)
        end = messages.EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=True)
        assert wire.request(ApiKey.END_TXN, 3, end).error_code == ErrorCode.PRODUCER_FENCED
        assert wire.request(ApiKey.END_TXN, 1, end).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        after = _describe(wire, txn_id)
        assert (after.transaction_state, after.producer_epoch) == (before.transaction_state, before.producer_epoch)
        # An unknown producer id.
        end = messages.EndTxnRequest(transactional_id=txn_id, producer_id=pid + 10_000, producer_epoch=0,
                                     committed=False)
        assert wire.request(ApiKey.END_TXN, 3, end).error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        # TxnOffsetCommit from an unknown producer id, and from the right producer before AddOffsetsToTxn.
        assert _txn_offset_commit(wire, txn_id, pid + 10_000, 0, topic) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert _txn_offset_commit(wire, txn_id, pid, second.producer_epoch, topic) == ErrorCode.INVALID_TXN_STATE
        assert _describe(wire, txn_id).transaction_state == after.transaction_state
        # ListTransactions sees it; an unknown state filter is reported back.
        lt = wire.request(ApiKey.LIST_TRANSACTIONS, 1, messages.ListTransactionsRequest(
            state_filters=["Empty", "Bogus"], producer_id_filters=[], duration_filter=-1))
        assert lt.unknown_state_filters == ["Bogus"]
        assert txn_id in {s.transactional_id for s in lt.transaction_states}


def test_timed_out_transaction_is_aborted(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 1)
    p = _producer(bootstrap, f"slow-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 1000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"never", partition=0)
    p.flush(10)
    # The coordinator aborts it (fencing the producer); its records never reach read_committed readers.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with WireClient.connect(bootstrap) as wire:
            lt = wire.request(ApiKey.LIST_TRANSACTIONS, 1, messages.ListTransactionsRequest(
                state_filters=["CompleteAbort"], producer_id_filters=[], duration_filter=-1))
        if lt.transaction_states and any(s.transactional_id.startswith("slow-") for s in lt.transaction_states):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the timed-out transaction was not aborted")
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"later", partition=0)
    plain.flush(10)
    assert _confluent_read(bootstrap, topic, 1, "read_committed", 1) == [b"later"]


def test_open_transaction_survives_kill_and_is_aborted_by_next_incarnation(tmp_path: Path) -> None:
    """kill -9 with a transaction open: the LSO still holds after restart, and the producer's next
    incarnation aborts what its previous one left open."""
    proc = BrokerProcess(tmp_path / "data", overrides=TXN_OVERRIDES).start()
    try:
        topic = _topic(proc.bootstrap, 1)
        # The first incarnation speaks over a raw socket, so no client library tidies up after the kill.
        with WireClient.connect(proc.bootstrap) as wire:
            init = _wire_init(wire, "left-open")
            assert _add_partitions(wire, "left-open", init.producer_id, init.producer_epoch, topic) \
                .results_by_partition[0].partition_error_code == ErrorCode.NONE
            batch = encode_batch([RecordInput(value=b"orphan")], producer_id=init.producer_id,
                                 producer_epoch=init.producer_epoch, base_sequence=0, is_transactional=True)
            req = messages.ProduceRequest
            data = req.TopicProduceData(name=topic, partition_data=[
                req.PartitionProduceData(index=0, records=batch)])
            resp = wire.request(ApiKey.PRODUCE, 9, req(transactional_id="left-open", acks=-1, timeout_ms=10_000,
                                                       topic_data=[data]))
            assert resp.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        proc.kill()
        proc.start()
        plain = Producer({"bootstrap.servers": proc.bootstrap})
        plain.produce(topic, b"after", partition=0)
        plain.flush(10)
        # The open transaction's first record still bounds what read_committed readers get.
        assert (_latest(proc.bootstrap, topic, read_committed=True), _latest(proc.bootstrap, topic,
                                                                             read_committed=False)) == (0, 2)
        again = _producer(proc.bootstrap, "left-open")
        again.init_transactions(30)
        assert _confluent_read(proc.bootstrap, topic, 1, "read_committed", 1) == [b"after"]
    finally:
        proc.stop()


def test_broker_killed_right_after_commit(tmp_path: Path) -> None:
    """EndTxn is answered once PrepareCommit is durable; a kill -9 then (markers written or not) and a
    restart leave the transaction committed on every partition."""
    proc = BrokerProcess(tmp_path / "data", overrides=TXN_OVERRIDES).start()
    try:
        topic = _topic(proc.bootstrap, 3)
        p = _producer(proc.bootstrap, "crashy")
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, b"v%d" % i, partition=i % 3)
        p.commit_transaction(30)
        proc.kill()
        proc.start()
        got = _confluent_read(proc.bootstrap, topic, 3, "read_committed", 30)
        assert sorted(got) == sorted(b"v%d" % i for i in range(30))
        _wait_for_state(proc.bootstrap, "crashy", "CompleteCommit")
    finally:
        proc.stop()


def test_broker_killed_between_prepare_and_markers(tmp_path: Path) -> None:
    """kill -9 while PrepareCommit is durable and a marker could not be written: one partition's
    directory is swapped for a plain file, so its marker (which rolls a segment: segment.bytes is tiny)
    fails and the coordinator keeps retrying. After the kill and the directory put back, the next
    incarnation completes the transaction: every record and the group's offset are committed."""
    data = tmp_path / "data"
    proc = BrokerProcess(data, overrides=TXN_OVERRIDES).start()
    try:
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1, config={"internal.segment.bytes": "14"})])[topic].result(30)
        group = f"stalled-{topic}"
        consumer = Consumer({"bootstrap.servers": proc.bootstrap, "group.id": group, "enable.auto.commit": False})
        p = _producer(proc.bootstrap, "stalled")
        try:
            p.init_transactions(30)
            p.begin_transaction()
            for i in range(4):
                p.produce(topic, b"v%d" % i, partition=i % 2)
            p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], consumer.consumer_group_metadata(), 30)
            p.flush(30)
            stalled = data / f"{topic}-0"
            stalled.rename(tmp_path / "away")
            stalled.write_bytes(b"")
            p.commit_transaction(30)  # answered once PrepareCommit is durable
            deadline = time.monotonic() + 30
            while "txn.markers_failed" not in proc.log_text():
                assert time.monotonic() < deadline and proc.alive()
                time.sleep(0.05)
            with WireClient.connect(proc.bootstrap) as wire:
                assert _describe(wire, "stalled").transaction_state == "PrepareCommit"
        finally:
            consumer.close()
        proc.kill()
        stalled.unlink()
        (tmp_path / "away").rename(stalled)
        proc.start()
        got = _confluent_read(proc.bootstrap, topic, 2, "read_committed", 4)
        assert sorted(got) == [b"v0", b"v1", b"v2", b"v3"]
        _wait_for_state(proc.bootstrap, "stalled", "CompleteCommit")
        with WireClient.connect(proc.bootstrap) as wire:
            assert _fetch_offset(wire, group, topic, 8, True) == (0, 5, 0)
    finally:
        proc.stop()


def test_share_group_read_committed(txn_broker: BrokerProcess) -> None:
    """Aborted records never reach a read_committed share group and markers are never delivered; every
    committed record is delivered once and the lag reaches 0. read_uncommitted gets every data record."""
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 2)
    committed_group, uncommitted_group = f"rc-{uuid.uuid4().hex[:6]}", f"ru-{uuid.uuid4().hex[:6]}"
    set_group_config(bootstrap, committed_group, share_auto_offset_reset="earliest",
                     share_isolation_level="read_committed")
    set_group_config(bootstrap, uncommitted_group, share_auto_offset_reset="earliest")
    committed, aborted = _write_commit_and_abort(bootstrap, topic, 2)
    want = sorted([*committed, b"tail"])
    for group, expected in ((committed_group, want), (uncommitted_group, sorted([*want, *aborted]))):
        consumer = share_consumer(bootstrap, group, [topic])
        sink = Consumed()
        try:
            count = len(expected)
            poll_until(consumer, lambda s=sink, n=count: len(s) >= n, sink, 60)  # type: ignore[misc]
            # Ask for more: nothing else may come (an aborted record would sort before the tail already read).
            poll_until(consumer, lambda: False, sink, 2)
        finally:
            consumer.close()
        assert sorted(v for _p, _o, v, _d in sink.records) == expected
        assert {d for _p, _o, _v, d in sink.records} == {1}
    described = describe_offsets(bootstrap, committed_group, {topic: [0, 1]})
    deadline = time.monotonic() + 30
    while any(lag != 0 for _start, lag, _e in offsets_by_partition(described).values()):
        assert time.monotonic() < deadline, offsets_by_partition(described)
        time.sleep(0.2)
        described = describe_offsets(bootstrap, committed_group, {topic: [0, 1]})


def test_bundled_client_transactions(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = _topic(bootstrap, 2)
    txn_id = f"bundled-{uuid.uuid4().hex[:6]}"
    producer = ShoalProducer(bootstrap, transactional_id=txn_id, transaction_timeout_ms=30_000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, b"keep-%d" % i, partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, b"drop-%d" % i, partition=i % 2)
        producer.abort_transaction()
        # A second producer with the same id fences this one.
        newer = ShoalProducer(bootstrap, transactional_id=txn_id, transaction_timeout_ms=30_000)
        try:
            newer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"zombie", partition=0)
            with pytest.raises(ShoalKafkaError) as info:
                producer.commit_transaction()
            assert info.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                                       ErrorCode.INVALID_TXN_STATE)
            newer.begin_transaction()
            newer.send(topic, b"newer", partition=1)
            newer.commit_transaction()
        finally:
            newer.close()
    finally:
        producer.close()
    got = _confluent_read(bootstrap, topic, 2, "read_committed", 7)
    assert sorted(got) == sorted([*(b"keep-%d" % i for i in range(6)), b"newer"])


def test_consume_transform_produce_survives_worker_kill(txn_broker: BrokerProcess) -> None:
    """kill -9 of the worker with a transaction open, then a restart: the output, read with
    read_committed, holds each input exactly once, and the group's committed offsets cover the input."""
    bootstrap = txn_broker.bootstrap
    source, sink = _topic(bootstrap, 2), _topic(bootstrap, 2)
    group, txn_id = f"ctp-{uuid.uuid4().hex[:6]}", f"ctp-worker-{uuid.uuid4().hex[:6]}"
    total = 300
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(total):
        plain.produce(source, b"in-%d" % i, partition=i % 2)
    assert plain.flush(30) == 0
    args = [sys.executable, "-m", "tests.integration.ctp_worker", bootstrap, source, sink, group, txn_id, str(total)]
    worker = subprocess.Popen([*args, "--pause-at", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "open 2"  # records and offsets of transaction 2 sent
        worker.kill()
        worker.wait(10)
        worker = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "done"
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
    got = _confluent_read(bootstrap, sink, 2, "read_committed", total)
    assert sorted(got) == sorted(b"IN-%d" % i for i in range(total))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = c.committed([TopicPartition(source, p) for p in range(2)], 10)
    finally:
        c.close()
    assert sum(tp.offset for tp in committed) == total
