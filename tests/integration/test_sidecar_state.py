"""The sidecar's share state lives on the upstream: a standalone Shoal process is the upstream, sidecar
processes keep the share coordinator's and group coordinator's records in `__shoal_*` topics there.

A sidecar that starts with an empty data directory rebuilds the groups, SPSO, delivery counts and
acknowledged state from the upstream; a second writer of a state partition fences the first through the
upstream's transactions; an upstream that cannot take acks=all writes on the state topics stops start-up."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from shoal.broker.storage.internal_topic_log import CoordinatorLogError
from shoal.broker.storage.partition_source import LATEST
from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS
from shoal.broker.upstream.cluster import UpstreamCluster
from shoal.broker.upstream.partition_reader import BatchCache, UpstreamPartitionSource
from shoal.broker.upstream.settings import parse_upstream
from shoal.broker.upstream.state_log import UpstreamStateLog, transactional_id
from shoal.broker.upstream.state_topics import ensure_state_topics
from shoal.coordinator.offset_metadata_manager import CommittedOffset, offset_commit_record
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .kafka_wire import WireClient
from .names import unique_name
from .share_clients import create_topic, produce, set_group_config
from .test_share_admin import describe_offsets, offsets_by_partition

POLL_DEADLINE_S = 45.0


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("state-upstream") / "data", overrides=NO_JOIN_DELAY).start()
    yield proc
    proc.stop()


def _sidecar(data_dir: Path, upstream: BrokerProcess, *extra: str) -> BrokerProcess:
    return BrokerProcess(data_dir, overrides=[
        "node.id=7", f"upstream.bootstrap.servers={upstream.bootstrap}", *FAST_HEARTBEAT, *extra])


def _consumer(sidecar: BrokerProcess, group: str, topic: str) -> ShareConsumer:
    consumer = ShareConsumer({"bootstrap.servers": sidecar.bootstrap, "group.id": group,
                              "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([topic])
    return consumer


def _start_offset(sidecar: BrokerProcess, group: str, topic: str) -> int:
    """The group's start offset (SPSO) of partition 0, once the sidecar serves the group (a state partition
    being taken again answers NOT_COORDINATOR meanwhile)."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while True:
        described = describe_offsets(sidecar.bootstrap, group)
        if described.error_code == ErrorCode.NONE or time.monotonic() >= deadline:
            break
        assert described.error_code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        time.sleep(0.1)
    start, _lag, error = offsets_by_partition(described)[(topic, 0)]
    assert error == ErrorCode.NONE
    return int(start)


def _deliveries(consumer: ShareConsumer, want: int, ack: dict[int, AcknowledgeType], *,
                deadline_s: float = POLL_DEADLINE_S) -> list[tuple[int, int]]:
    """(offset, delivery count) of what arrives until `want` records came (or the deadline passed), each
    acknowledged as `ack` says (ACCEPT by default) and committed."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < deadline:
        msgs = [m for m in consumer.poll(0.5) if m.error() is None]
        for m in msgs:
            got.append((m.offset(), m.delivery_count()))
            consumer.acknowledge(m, ack.get(m.offset(), AcknowledgeType.ACCEPT))
        if msgs:
            assert all(err is None for err in consumer.commit_sync(30).values())
    return got


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_sidecar_with_an_empty_directory_rebuilds_share_state_from_the_upstream(
        tmp_path: Path, upstream: BrokerProcess, how: str) -> None:
    topic, group = unique_name("state-t"), unique_name("state-g")
    create_topic(upstream.bootstrap, topic, 1)
    produce(upstream.bootstrap, topic, 10)
    data_dir = tmp_path / "sidecar"
    sidecar = _sidecar(data_dir, upstream).start()
    try:
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest")
        consumer = _consumer(sidecar, group, topic)
        try:
            # 0-5 accepted, 6-9 released: the SPSO moves to 6, and 6-9 wait for their second delivery.
            release = {o: AcknowledgeType.RELEASE for o in range(6, 10)}
            first = _deliveries(consumer, 10, release)
        finally:
            consumer.close()
        assert sorted(first) == [(o, 1) for o in range(10)]
    finally:
        if how == "kill":
            sidecar.kill()
        else:
            sidecar.stop()
    shutil.rmtree(data_dir)

    sidecar = _sidecar(data_dir, upstream).start()
    try:
        # The group's share state came back from the upstream: its start offset, with nothing below acquirable.
        described = offsets_by_partition(describe_offsets(sidecar.bootstrap, group))
        assert described[(topic, 0)][0] == 6
        assert described[(topic, 0)][2] == ErrorCode.NONE
        consumer = _consumer(sidecar, group, topic)
        try:
            again = _deliveries(consumer, 4, {})
            # Nothing accepted is delivered again; the released records come back counted a second time.
            assert sorted(again) == [(o, 2) for o in range(6, 10)]
            assert _deliveries(consumer, 1, {}, deadline_s=3) == []
        finally:
            consumer.close()
    finally:
        sidecar.stop()


def test_a_second_sidecar_taking_the_state_fences_the_first(tmp_path: Path, upstream: BrokerProcess) -> None:
    topic, group = unique_name("fence-t"), unique_name("fence-g")
    create_topic(upstream.bootstrap, topic, 1)
    produce(upstream.bootstrap, topic, 2)
    membership = f"upstream.membership.group.id={unique_name('fence-m')}"
    first = _sidecar(tmp_path / "a", upstream, membership).start()
    second: BrokerProcess | None = None
    try:
        set_group_config(first.bootstrap, group, share_auto_offset_reset="earliest")
        consumer = _consumer(first, group, topic)
        try:
            assert sorted(_deliveries(consumer, 2, {})) == [(0, 1), (1, 1)]
        finally:
            consumer.close()
        # The same membership group: the second sidecar joins it and the group hands it half the state
        # partitions, each taken with a new producer epoch, which fences the first's writer of it. The first
        # writes with transaction.version 2 (the upstream finalizes it), the second is held to 1: fencing
        # does not depend on the protocol either side speaks.
        assert re.search(r"state partition taken .*transaction_version=2", first.log_text())
        second = _sidecar(tmp_path / "b", upstream, membership, "node.id=8",
                          "upstream.state.transaction.version=1").start()
        assert re.search(r"state partition taken .*producer_epoch=[1-9].*transaction_version=1", second.log_text())
        # What the first sidecar acknowledged before counts, whichever sidecar now holds its state (asked of
        # the group's coordinator, as an admin client would find it; the other answers NOT_COORDINATOR).
        described = [describe_offsets(s.bootstrap, group) for s in (first, second)]
        assert sorted(d.error_code for d in described) == [ErrorCode.NONE, ErrorCode.NOT_COORDINATOR]
        [coordinated] = [d for d in described if d.error_code == ErrorCode.NONE]
        assert offsets_by_partition(coordinated)[(topic, 0)][0] == 2
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize("transaction_version", [1, 2])
def test_two_writers_of_a_state_partition_the_later_one_fences_the_earlier(upstream: BrokerProcess,
                                                                         transaction_version: int) -> None:
    """At the log level, against the real upstream: take() bumps the partition's producer epoch, so the
    earlier owner's next write fails with NOT_COORDINATOR and never reports success; the later owner read
    every committed write of the earlier one. On both transaction protocols: the standalone upstream
    finalizes transaction.version 2 (no AddPartitionsToTxn, EndTxn v5 bumps the epoch), and a cap of 1
    forces AddPartitionsToTxn against it."""
    topic, membership = unique_name("__shoal_fence"), unique_name("fence-log")

    def record(offset: int) -> object:
        return offset_commit_record("g", "t", 0, CommittedOffset(offset, -1, "", 0))

    async def run() -> None:
        clusters = [UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap})) for _ in range(2)]
        try:
            for cluster in clusters:
                await cluster.start()
            await ensure_state_topics(clusters[0], {topic: 1}, None)
            logs = [UpstreamStateLog(c, topic, CONSUMER_OFFSETS, 1, membership,
                                     max_transaction_version=transaction_version) for c in clusters]
            await logs[0].take(0)
            assert logs[0]._writers[0].transaction_version == transaction_version
            epoch = logs[0]._writers[0].producer_epoch
            await logs[0].append(0, [record(1)])  # type: ignore[list-item]
            await logs[0].append(0, [record(2), record(3)])  # type: ignore[list-item]
            # TV2: each EndTxn v5 bumped the epoch, and the writer adopted it; TV1 keeps its epoch.
            assert logs[0]._writers[0].producer_epoch == epoch + (2 if transaction_version == 2 else 0)
            await logs[1].take(0)
            replayed = [r.value.offset for _o, r in logs[1].replay(0) if r.value is not None]
            assert replayed == [1, 2, 3]
            with pytest.raises(CoordinatorLogError) as refused:
                await logs[0].append(0, [record(4)])  # type: ignore[list-item]
            assert refused.value.error_code == ErrorCode.NOT_COORDINATOR
            assert not logs[0].owns(0)
            with pytest.raises(CoordinatorLogError):
                logs[0].append_nowait(0, [record(5)])  # type: ignore[list-item]
            await logs[1].append(0, [record(6)])  # type: ignore[list-item]
            # A third reader sees exactly what committed: never the fenced write.
            logs.append(UpstreamStateLog(clusters[0], topic, CONSUMER_OFFSETS, 1, membership))
            await logs[2].take(0)
            assert [r.value.offset for _o, r in logs[2].replay(0) if r.value is not None] == [1, 2, 3, 6]
        finally:
            for cluster in clusters:
                await cluster.close()

    asyncio.run(run())


def test_a_tv1_writer_opens_its_next_transaction_ahead_and_commits_it_if_left_empty(upstream: BrokerProcess) -> None:
    """Transaction version 1: once a state transaction committed, the writer sends the next one's
    AddPartitionsToTxn at once, so the next write starts with its Produce (two round trips on the
    acknowledgement's path, not three). One opened longer ago than `opened_ahead_fresh_s` is added to
    again first (the coordinator checks the epoch then). A transaction opened ahead and left empty is
    committed after `idle_end_s`, before the upstream's transaction timeout could abort it, and writes go
    on after it."""
    topic = unique_name("__shoal_ahead")

    def record(offset: int) -> object:
        return offset_commit_record("g", "t", 0, CommittedOffset(offset, -1, "", 0))

    async def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)

    async def run() -> None:
        cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}))
        sent: list[int] = []
        send = cluster.send

        async def recorded_send(node: int, api_key: int, body: Any, version: int, **kwargs: Any) -> Any:
            sent.append(api_key)
            return await send(node, api_key, body, version, **kwargs)

        cluster.send = recorded_send  # type: ignore[method-assign]
        try:
            await cluster.start()
            await ensure_state_topics(cluster, {topic: 1}, None)
            state_log = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, 1, unique_name("ahead"),
                                         max_transaction_version=1)
            await state_log.take(0)
            writer = state_log._writers[0]
            await state_log.append(0, [record(1)])  # type: ignore[list-item]
            await until(lambda: writer.opened_ahead)
            sent.clear()
            await state_log.append(0, [record(2)])  # type: ignore[list-item]
            assert sent[:2] == [ApiKey.PRODUCE, ApiKey.END_TXN]
            await until(lambda: writer.opened_ahead)
            writer.opened_ahead_fresh_s = 0.0  # as after a pause: asked again, and the upstream says yes
            writer.idle_end_s = 0.2  # for the transaction the next write opens ahead
            sent.clear()
            await state_log.append(0, [record(3)])  # type: ignore[list-item]
            assert sent[:3] == [ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE, ApiKey.END_TXN]
            # The next one opened ahead, left empty, then committed: one AddPartitionsToTxn, one EndTxn more.
            await until(lambda: sent.count(ApiKey.END_TXN) == 2 and not writer.opened_ahead
                        and writer._task is not None and writer._task.done())
            assert sent.count(ApiKey.ADD_PARTITIONS_TO_TXN) == 2
            assert writer.lost is None
            await state_log.append(0, [record(4)])  # type: ignore[list-item]
            reader = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, 1, unique_name("ahead-reader"))
            await reader.take(0)
            assert [r.value.offset for _o, r in reader.replay(0) if r.value is not None] == [1, 2, 3, 4]
        finally:
            await cluster.close()

    asyncio.run(run())


def test_state_topics_that_cannot_take_acks_all_stop_start_up(tmp_path: Path) -> None:
    upstream = BrokerProcess(tmp_path / "upstream").start()
    try:
        admin = AdminClient({"bootstrap.servers": upstream.bootstrap})
        created = admin.create_topics([NewTopic("__shoal_share_group_state", 3, 1,
                                                config={"cleanup.policy": "compact", "min.insync.replicas": "2"})])
        for future in created.values():
            future.result(30)
        sidecar = _sidecar(tmp_path / "sidecar", upstream)
        with pytest.raises(RuntimeError):
            sidecar.start()
        assert "min.insync.replicas=2" in sidecar.log_text()
        assert "NOT_ENOUGH_REPLICAS" in sidecar.log_text()
    finally:
        upstream.stop()


def test_a_state_write_the_upstream_refuses_is_a_retriable_error_and_loses_nothing(
        tmp_path: Path, upstream: BrokerProcess) -> None:
    """min.insync.replicas raised on the upstream after start-up: acknowledgements fail with a retriable
    error and are not reported done; once the upstream takes acks=all writes again they go through, and
    nothing acknowledged before is lost."""
    topic, group = unique_name("nisr-t"), unique_name("nisr-g")
    create_topic(upstream.bootstrap, topic, 1)
    produce(upstream.bootstrap, topic, 1)
    sidecar = _sidecar(tmp_path / "sidecar", upstream).start()
    admin = AdminClient({"bootstrap.servers": upstream.bootstrap})

    def set_min_isr(value: str) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, "__shoal_share_group_state", incremental_configs=[
            ConfigEntry("min.insync.replicas", value, incremental_operation=AlterConfigOpType.SET)])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

    try:
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest")
        consumer = _consumer(sidecar, group, topic)
        try:
            assert _deliveries(consumer, 1, {}) == [(0, 1)]
            set_min_isr("2")
            produce(upstream.bootstrap, topic, 3, prefix="after")
            failed = False
            deadline = time.monotonic() + POLL_DEADLINE_S
            while not failed and time.monotonic() < deadline:
                msgs = [m for m in consumer.poll(0.5) if m.error() is None]
                for m in msgs:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                if msgs:
                    failed = any(err is not None for err in consumer.commit_sync(30).values())
            assert failed
            assert sidecar.alive()
            assert "NOT_ENOUGH_REPLICAS" in sidecar.log_text()
        finally:
            consumer.close()
        set_min_isr("1")
        start = offsets_by_partition(describe_offsets(sidecar.bootstrap, group))[(topic, 0)][0]
        assert start == 1  # the refused acknowledgement did not count; the one before it did
        consumer = _consumer(sidecar, group, topic)
        try:
            again = _deliveries(consumer, 3, {})
            assert sorted(o for o, _d in again) == [1, 2, 3]
        finally:
            consumer.close()
        assert offsets_by_partition(describe_offsets(sidecar.bootstrap, group))[(topic, 0)][0] == 4
    finally:
        sidecar.stop()


def test_appends_waiting_together_are_committed_in_one_upstream_transaction(upstream: BrokerProcess) -> None:
    """Group commit: appends made while no transaction is running go into one (one marker on the upstream),
    and each flush returns once that transaction committed."""
    topic = unique_name("__shoal_group_commit")

    async def run() -> None:
        cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}))
        try:
            await cluster.start()
            await ensure_state_topics(cluster, {topic: 1}, None)
            state_log = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, 1, unique_name("group-commit"))
            await state_log.take(0)
            records = [offset_commit_record("g", "t", i, CommittedOffset(i, -1, "", 0)) for i in range(40)]
            source = UpstreamPartitionSource(cluster, BatchCache(0), topic, 0)
            # Twice: the second transaction's producer is one the upstream knows (new epoch under TV2), so it
            # checks the sequences; the appends go as one batch, since a Produce carries one per partition.
            for round_ in range(2):
                ends = [state_log.append_nowait(0, [r]) + 1 for r in records[20 * round_:20 * (round_ + 1)]]
                await asyncio.gather(*(state_log.flush(0, end) for end in ends))
                # 20 records and one COMMIT marker: a single transaction.
                assert await source.list_offset(LATEST) == 21 * (round_ + 1)
            reader = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, 1, unique_name("group-commit-reader"))
            await reader.take(0)
            assert [r.key.partition for _o, r in reader.replay(0)] == list(range(40))
        finally:
            await cluster.close()

    asyncio.run(run())


def test_an_upstream_that_goes_away_and_comes_back_loses_no_state(tmp_path: Path) -> None:
    """The upstream stops while records are acquired through the sidecar: their acknowledgement fails (it is
    not reported done) and the sidecar keeps running; once the upstream is back the records are delivered
    again and acknowledged, and what was acknowledged before is never delivered again."""
    upstream = BrokerProcess(tmp_path / "upstream", overrides=NO_JOIN_DELAY).start()
    sidecar: BrokerProcess | None = None
    topic, group = unique_name("away-t"), unique_name("away-g")
    try:
        create_topic(upstream.bootstrap, topic, 1)
        produce(upstream.bootstrap, topic, 1)
        sidecar = _sidecar(tmp_path / "sidecar", upstream, "upstream.request.timeout.ms=2000",
                           "group.share.min.record.lock.duration.ms=1000").start()
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest",
                         share_record_lock_duration_ms="1000")
        consumer = _consumer(sidecar, group, topic)
        try:
            assert _deliveries(consumer, 1, {}) == [(0, 1)]
            produce(upstream.bootstrap, topic, 3, prefix="later")
            held: list[object] = []
            deadline = time.monotonic() + POLL_DEADLINE_S
            while len(held) < 3 and time.monotonic() < deadline:
                held += [m for m in consumer.poll(0.5) if m.error() is None]
            assert sorted(m.offset() for m in held) == [1, 2, 3]  # type: ignore[attr-defined]
            upstream.stop()
            for m in held:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            assert any(err is not None for err in consumer.commit_sync(30).values())
            assert sidecar.alive()
        finally:
            consumer.close()
        upstream.start()
        consumer = _consumer(sidecar, group, topic)
        try:
            again = _deliveries(consumer, 3, {})
            # Their acquisition was never written (as in Kafka, only acknowledgements and releases are), so
            # the delivery counts they come back with are not asserted.
            assert sorted(o for o, _d in again) == [1, 2, 3]
            assert _deliveries(consumer, 1, {}, deadline_s=3) == []
        finally:
            consumer.close()
        assert offsets_by_partition(describe_offsets(sidecar.bootstrap, group))[(topic, 0)][0] == 4
    finally:
        if sidecar is not None:
            sidecar.stop()
        upstream.stop()


def test_the_standalone_upstream_refuses_acks_all_below_min_insync_replicas(upstream: BrokerProcess) -> None:
    """What the check above relies on: standalone Shoal is the only in-sync replica of its partitions, so a
    topic's min.insync.replicas of 2 refuses acks=all with NOT_ENOUGH_REPLICAS (nothing appended), as Kafka
    does, while acks=1 still writes."""
    topic = unique_name("min-isr")
    create_topic(upstream.bootstrap, topic, 1, {"min.insync.replicas": "2"})
    produce_req = messages.ProduceRequest

    def send(acks: int) -> tuple[int, int]:
        body = produce_req(acks=acks, timeout_ms=10_000, topic_data=[produce_req.TopicProduceData(
            name=topic, partition_data=[produce_req.PartitionProduceData(
                index=0, records=encode_batch([RecordInput(b"k", b"v")]))])])
        with WireClient.connect(upstream.bootstrap) as client:
            response = client.request(ApiKey.PRODUCE, 9, body)
        part = response.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    assert send(-1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
    assert send(1) == (ErrorCode.NONE, 0)  # the refused batch was not appended


def test_a_transactional_id_the_upstream_forgot_is_taken_again(tmp_path: Path) -> None:
    """A state partition quiet for longer than the upstream's transactional.id.expiration.ms: its next write
    fails (not reported done) and loses the partition without it being fenced, and taking it again goes on
    from what committed."""
    upstream = BrokerProcess(tmp_path / "upstream", overrides=[
        "transactional.id.expiration.ms=1000", "transaction.remove.expired.transaction.cleanup.interval.ms=100"]).start()
    topic, membership = unique_name("__shoal_expiry"), unique_name("expiry")
    lost: list[tuple[int, bool]] = []

    def listed() -> set[str]:
        with WireClient.connect(upstream.bootstrap) as client:
            response = client.request(ApiKey.LIST_TRANSACTIONS, 0, messages.ListTransactionsRequest(
                state_filters=[], producer_id_filters=[]))
        return {t.transactional_id for t in response.transaction_states}

    async def run() -> None:
        cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": upstream.bootstrap}))
        try:
            await cluster.start()
            await ensure_state_topics(cluster, {topic: 1}, None)
            state_log = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, 1, membership,
                                         on_lost=lambda p, fenced: lost.append((p, fenced)))
            await state_log.take(0)
            await state_log.append(0, [offset_commit_record("g", "t", 0, CommittedOffset(1, -1, "", 0))])
            txn_id = transactional_id(membership, topic, 0)
            deadline = time.monotonic() + 30
            while txn_id in await asyncio.to_thread(listed) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert txn_id not in await asyncio.to_thread(listed)
            with pytest.raises(CoordinatorLogError) as refused:
                await state_log.append(0, [offset_commit_record("g", "t", 0, CommittedOffset(2, -1, "", 0))])
            assert refused.value.error_code == ErrorCode.NOT_COORDINATOR
            assert lost == [(0, False)]
            # Taken again, it goes on from what committed. The new transactional id expires as quickly, so on
            # a loaded machine it may be gone again before the append: then it is taken once more.
            for attempt in range(3):
                await state_log.take(0)
                assert [r.value.offset for _o, r in state_log.replay(0) if r.value is not None] == [1]
                try:
                    await state_log.append(0, [offset_commit_record("g", "t", 0, CommittedOffset(3, -1, "", 0))])
                    break
                except CoordinatorLogError as exc:
                    if "no longer knows" not in str(exc) or attempt == 2:
                        raise
        finally:
            await cluster.close()

    try:
        asyncio.run(run())
    finally:
        upstream.stop()


def test_clients_cannot_produce_to_the_state_topics_through_the_sidecar(tmp_path: Path,
                                                                        upstream: BrokerProcess) -> None:
    sidecar = _sidecar(tmp_path / "sidecar", upstream).start()
    try:
        for topic in ("__shoal_share_group_state", "__shoal_consumer_offsets"):
            body = messages.ProduceRequest(acks=-1, timeout_ms=10_000, topic_data=[
                messages.ProduceRequest.TopicProduceData(name=topic, partition_data=[
                    messages.ProduceRequest.PartitionProduceData(index=0, records=encode_batch(
                        [RecordInput(b"k", b"not a coordinator record")]))])])
            with WireClient.connect(sidecar.bootstrap) as client:
                response = client.request(ApiKey.PRODUCE, 9, body)
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    finally:
        sidecar.stop()


def test_a_sidecar_whose_transactional_ids_expired_takes_its_state_partitions_again(tmp_path: Path) -> None:
    """The sidecar's state partitions are quiet past the upstream's transactional.id.expiration.ms: the next
    acknowledgement or group change fails once (not reported done), the partition is taken again from what
    committed, and then everything goes on with no state lost."""
    upstream = BrokerProcess(tmp_path / "upstream", overrides=[
        *NO_JOIN_DELAY, "transactional.id.expiration.ms=1500",
        "transaction.remove.expired.transaction.cleanup.interval.ms=100"]).start()
    sidecar: BrokerProcess | None = None
    topic, group = unique_name("expired-t"), unique_name("expired-g")

    def sidecar_ids() -> set[str]:
        with WireClient.connect(upstream.bootstrap) as client:
            response = client.request(ApiKey.LIST_TRANSACTIONS, 0, messages.ListTransactionsRequest(
                state_filters=[], producer_id_filters=[]))
        return {t.transactional_id for t in response.transaction_states if t.transactional_id.startswith("shoal-")}

    def until_forgotten() -> None:
        deadline = time.monotonic() + 30
        while sidecar_ids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not sidecar_ids()

    def accept_until_done(consumer: ShareConsumer, offset: int) -> None:
        """Poll and accept until the acknowledgement of `offset` is reported done; nothing else comes."""
        deadline = time.monotonic() + POLL_DEADLINE_S
        while time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(0.5) if m.error() is None]
            for m in msgs:
                assert m.offset() == offset
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            if msgs and all(err is None for err in consumer.commit_sync(30).values()):
                return
        raise AssertionError(f"offset {offset} was never acknowledged")

    try:
        create_topic(upstream.bootstrap, topic, 1)
        produce(upstream.bootstrap, topic, 1)
        sidecar = _sidecar(tmp_path / "sidecar", upstream, "group.share.min.record.lock.duration.ms=1000").start()
        set_group_config(sidecar.bootstrap, group, share_auto_offset_reset="earliest",
                         share_record_lock_duration_ms="1000")
        consumer = _consumer(sidecar, group, topic)
        try:
            accept_until_done(consumer, 0)
            until_forgotten()
            produce(upstream.bootstrap, topic, 1, prefix="later")
            accept_until_done(consumer, 1)
        finally:
            consumer.close()
        assert "state partition lost" in sidecar.log_text()
        assert _start_offset(sidecar, group, topic) == 2
        until_forgotten()
        produce(upstream.bootstrap, topic, 1, prefix="last")
        consumer = _consumer(sidecar, group, topic)  # its join changes the group: a write on an expired id
        try:
            accept_until_done(consumer, 2)
            assert _deliveries(consumer, 1, {}, deadline_s=2) == []
        finally:
            consumer.close()
        assert _start_offset(sidecar, group, topic) == 3
        assert sidecar.alive()
    finally:
        if sidecar is not None:
            sidecar.stop()
        upstream.stop()
