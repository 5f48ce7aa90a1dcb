"""Dead-lettering (KIP-1191): the ARCHIVING step of the state machine and the writer's recovery path."""

from __future__ import annotations

import asyncio
from dataclasses import astuple
from pathlib import Path

import pytest

from shoal.broker.common.config import CLUSTER_DEFAULT, BrokerConfig
from shoal.broker.share.dead_letter import DeadLetterWriter, NotDeadLettered, Source, already_dead_lettered
from shoal.broker.share.group_configs import (
    GroupConfigs,
    InvalidGroupConfig,
    ValidationContext,
    validation_context,
)
from shoal.broker.share.share_partition import (
    AckBatch,
    AcquireMode,
    FetchedBatch,
    RecordState,
    SharePartition,
)
from shoal.broker.storage.topic_registry import TopicRegistry
from shoal.persister.persister import PersistedStateBatch
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import Header, RecordInput, decode_batches, encode_batch

TOPIC_ID = bytes(range(16))
ACCEPT, RELEASE, REJECT, GAP = 1, 2, 3, 0


def _dead_lettering(limit: int = 3) -> SharePartition:
    sp = SharePartition("g", TOPIC_ID, 0, start_offset=0, state_epoch=0, state_batches=[],
                        delivery_count_limit=limit)
    sp.dead_letter = True
    return sp


def test_reject_and_the_delivery_limit_go_through_archiving_gap_does_not() -> None:
    sp = _dead_lettering(limit=1)
    sp.acquire("m", [FetchedBatch(0, 3)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(0, 3, [REJECT, RELEASE, GAP, ACCEPT])], now_ms=0)
    assert [sp.offset_state(o)[0] for o in range(4)] == [  # type: ignore[index]
        RecordState.ARCHIVING, RecordState.ARCHIVING, RecordState.ARCHIVED, RecordState.ACKNOWLEDGED]
    assert sp.start_offset == 0  # ARCHIVING holds SPSO: the state must keep it until it is written
    written = sp.write_state()
    assert (0, 1, RecordState.ARCHIVING, 1) in [astuple(b) for b in written.state_batches]
    # Offset 0 was rejected, offset 1 released at the limit: the cause is kept apart per offset.
    assert sp.archiving_runs() == [(0, 0, 1, True), (1, 1, 1, False)]
    assert sp.complete_archiving(sp.archiving_runs())
    assert sp.start_offset == 4 and sp.archiving_count == 0


def test_archiving_survives_a_reload_and_is_not_acquired_again() -> None:
    sp = SharePartition("g", TOPIC_ID, 0, start_offset=0, state_epoch=0, delivery_count_limit=3,
                        state_batches=[PersistedStateBatch(0, 1, RecordState.ARCHIVING, 2),
                                       PersistedStateBatch(2, 2, RecordState.AVAILABLE, 1)])
    # The persisted state does not keep the cause: below the limit it was a rejection (as Kafka infers it).
    assert sp.archiving_runs() == [(0, 1, 2, True)]
    got = sp.acquire("m", [FetchedBatch(0, 2)], max_records=10, batch_size=10, now_ms=0)
    assert [(r.first_offset, r.last_offset) for r in got] == [(2, 2)]


def test_the_cause_is_the_transition_s_not_the_delivery_count_s() -> None:
    """A REJECT on the last allowed delivery is a rejection; a RELEASE or a lock expiry there is the limit."""
    sp = _dead_lettering(limit=2)
    sp.acquire("m", [FetchedBatch(0, 2)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(0, 2, [RELEASE])], now_ms=0)
    sp.acquire("m", [FetchedBatch(0, 2)], max_records=10, batch_size=10, now_ms=0)
    assert [sp.offset_state(o) for o in range(3)] == [(RecordState.ACQUIRED, "m", 2)] * 3
    sp.acknowledge("m", [AckBatch(0, 1, [REJECT, RELEASE])], now_ms=0)
    assert sp.expire_locks(sp.lock_duration_ms)  # offset 2's lock lapses on its last delivery
    assert sp.archiving_runs() == [(0, 0, 2, True), (1, 2, 2, False)]
    # The member slot carries the cause; it is not shown as a member.
    assert [sp.offset_state(o) for o in range(3)] == [(RecordState.ARCHIVING, None, 2)] * 3
    # A failed write puts the rejection back to ACQUIRED; a later release at the limit is then the limit's.
    sp2 = _dead_lettering(limit=2)
    sp2.acquire("m", [FetchedBatch(0, 0)], max_records=10, batch_size=10, now_ms=0)
    rejected = sp2.acknowledge("m", [AckBatch(0, 0, [REJECT])], now_ms=0, until_written=True)
    assert sp2.rollback(rejected)
    assert sp2.offset_state(0) == (RecordState.ACQUIRED, "m", 1)
    sp2.acknowledge("m", [AckBatch(0, 0, [RELEASE])], now_ms=0)
    sp2.acquire("m", [FetchedBatch(0, 0)], max_records=10, batch_size=10, now_ms=0)
    sp2.acknowledge("m", [AckBatch(0, 0, [RELEASE])], now_ms=0)
    assert sp2.archiving_runs() == [(0, 0, 2, False)]


def test_a_member_release_rolled_back_restores_records_it_sent_to_archiving() -> None:
    sp = _dead_lettering(limit=1)
    sp.acquire("m", [FetchedBatch(0, 1)], max_records=10, batch_size=10, now_ms=0)
    outcome = sp.release_member("m", now_ms=0, until_written=True)
    assert outcome is not None and sp.archiving_runs() == [(0, 1, 1, False)]
    assert sp.rollback(outcome)
    assert [sp.offset_state(o) for o in range(2)] == [(RecordState.ACQUIRED, "m", 1)] * 2


def test_available_records_over_a_lowered_limit_go_through_archiving() -> None:
    """Kafka sends a record at the limit to ARCHIVING whenever it would otherwise be archived, so a limit
    lowered at run time dead-letters the AVAILABLE records already over it (whole batches and parts)."""
    sp = _dead_lettering(limit=5)
    sp.acquire("m", [FetchedBatch(0, 3)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(0, 3, [RELEASE])], now_ms=0)  # delivery count 1, AVAILABLE
    sp.acquire("m", [FetchedBatch(0, 3)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(0, 3, [RELEASE, RELEASE, ACCEPT, RELEASE])], now_ms=0)  # split batch
    sp.acquire("m", [FetchedBatch(4, 5)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(4, 5, [RELEASE])], now_ms=0)  # a whole batch at delivery count 1
    sp.delivery_count_limit = 1
    got = sp.acquire("m", [FetchedBatch(0, 5)], max_records=10, batch_size=10, now_ms=0)
    assert got == []
    assert sp.archiving_runs() == [(0, 1, 2, False), (3, 3, 2, False), (4, 5, 1, False)]
    assert sp.archived_count == 0
    snapshot = sp.write_state()
    assert (0, 1, RecordState.ARCHIVING, 2) in [astuple(b) for b in snapshot.state_batches]


def test_a_load_under_a_lowered_limit_sends_available_records_over_it_to_archiving() -> None:
    """Released under a higher limit, loaded again under a lower one: ARCHIVING, to be written."""
    batches = [PersistedStateBatch(0, 1, RecordState.AVAILABLE, 2), PersistedStateBatch(2, 2, RecordState.AVAILABLE, 1)]
    sp = SharePartition("g", TOPIC_ID, 0, start_offset=0, state_epoch=0, delivery_count_limit=2,
                        state_batches=batches, dead_letter=True)
    assert sp.archiving_runs() == [(0, 1, 2, False)]
    assert sp.unwritten
    assert [astuple(b) for b in sp.write_state().state_batches] == [(0, 1, RecordState.ARCHIVING, 2)]
    assert not sp.unwritten
    # Without a dead-letter topic they are archived, as before, and nothing is left to write.
    plain = SharePartition("g", TOPIC_ID, 0, start_offset=0, state_epoch=0, delivery_count_limit=2,
                           state_batches=batches)
    assert plain.archiving_runs() == [] and plain.start_offset == 2 and not plain.unwritten


def test_without_a_dead_letter_topic_records_are_archived_at_once() -> None:
    sp = SharePartition("g", TOPIC_ID, 0, start_offset=0, state_epoch=0, state_batches=[])
    sp.acquire("m", [FetchedBatch(0, 0)], max_records=10, batch_size=10, now_ms=0)
    sp.acknowledge("m", [AckBatch(0, 0, [REJECT])], now_ms=0)
    assert sp.offset_state(0) is None and sp.start_offset == 1


def _setup(tmp_path: Path, **broker: str
           ) -> tuple[TopicRegistry, GroupConfigs, DeadLetterWriter, ValidationContext]:
    cfg = BrokerConfig.from_strings({"log.dirs": str(tmp_path), **broker})
    topics = TopicRegistry(tmp_path, cfg)
    topics.load()
    groups = GroupConfigs(tmp_path, cfg)
    created: list[str] = []
    return topics, groups, DeadLetterWriter(topics, cfg, groups, lambda t: created.append(t.name)), \
        validation_context(cfg, topics)


def test_a_write_after_a_crash_skips_what_is_already_in_the_dead_letter_topic(tmp_path: Path) -> None:
    topics, groups, writer, check = _setup(tmp_path)
    source_topic = topics.create("src", 1)
    values = [RecordInput(key=b"k%d" % i, value=b"v%d" % i) for i in range(5)]
    buf = bytearray(encode_batch(values))
    source_topic.partitions[0].append(buf, list(iter_batches(buf)))
    topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true"})
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.src"),
                       ("errors.deadletterqueue.copy.record.enable", "true")], check)
    source = Source("g", "src", 0, source_topic.partitions[0])

    async def run() -> tuple[int, int, set[int]]:
        first = await writer.write(source, [(1, 2, 1, True)], skip_existing=False)
        # The broker died before ARCHIVED was persisted: the loaded state still says ARCHIVING for 1..3.
        again = await writer.write(source, [(1, 3, 3, False)], skip_existing=True)
        return first, again, await already_dead_lettered(dlq_log, source)

    dlq_log = topics.get("dlq.src").partitions[0]  # type: ignore[union-attr]
    assert asyncio.run(run()) == (2, 1, {1, 2, 3})
    records = decode_batches(dlq_log.read(0, 1 << 20))
    assert [(r.key, r.value) for r in records] == [(b"k1", b"v1"), (b"k2", b"v2"), (b"k3", b"v3")]
    reasons = [{h.key: h.value for h in r.headers}["__dlq.errors.message"] for r in records]
    assert reasons == [b"Offset rejected by client."] * 2 + [b"Offset delivery count exceeded the threshold."]
    topics.close()


def test_missing_topic_is_created_only_with_auto_create(tmp_path: Path) -> None:
    topics, groups, writer, check = _setup(tmp_path)
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.auto")], check)
    with pytest.raises(NotDeadLettered, match="auto create is disabled"):
        writer.target("g")
    topics.close()
    topics, groups, writer, check = _setup(tmp_path / "b", **{"errors.deadletterqueue.auto.create.topics.enable": "true"})
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.auto")], check)
    topic = writer.target("g")
    assert topic.configs["errors.deadletterqueue.group.enable"] == "true"
    topics.close()


def test_group_config_validation(tmp_path: Path) -> None:
    _topics, groups, _writer, check = _setup(tmp_path)
    with pytest.raises(InvalidGroupConfig, match="^errors.deadletterqueue.topic.name: DLQ topic name must not"):
        groups.validate("errors.deadletterqueue.topic.name", "__x", check)
    with pytest.raises(InvalidGroupConfig, match="^The dead-letter topic name 'no-prefix' must start with"):
        groups.validate("errors.deadletterqueue.topic.name", "no-prefix", check)
    assert groups.get("g", "share.renew.acknowledge.enable") == "true"
    assert groups.get("g", "share.assignment.interval.ms") == "1000"
    with pytest.raises(InvalidGroupConfig):
        groups.validate("share.assignment.interval.ms", "15001", check)


def test_a_topic_that_changes_after_the_group_config_is_checked_again_when_writing(tmp_path: Path) -> None:
    """The config-time checks passed; the opt-in turned off, or the prefix changed, later."""
    topics, groups, writer, check = _setup(tmp_path)
    dlq = topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true"})
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.src")], check)
    assert writer.target("g") is dlq
    topics.alter_configs(dlq, [("errors.deadletterqueue.group.enable", "false")])
    with pytest.raises(NotDeadLettered, match="DLQ is not enabled on configured DLQ topic"):
        writer.target("g")
    topics.alter_configs(dlq, [("errors.deadletterqueue.group.enable", "true")])
    check.broker.apply_dynamic(CLUSTER_DEFAULT, [("errors.deadletterqueue.topic.name.prefix", "other.")])
    with pytest.raises(NotDeadLettered, match="does not comply with the DLQ topic prefix"):
        writer.target("g")
    topics.close()


async def test_a_restart_between_the_steps_writes_each_dead_letter_once(tmp_path: Path) -> None:
    """A broker that stopped after ARCHIVING was durable: one record already dead-lettered, one not.

    The first broker's dead-letter task is kept from running (as if it died right after the state
    write), one dead-letter record is appended by hand with the real writer (as if it died right after
    that append), and a second broker on the same data directory must finish the job: each record once.
    """
    from shoal.broker.server.server import Broker
    from shoal.persister.persister import SharePartitionKey

    config = BrokerConfig.from_strings({
        "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "metrics.port": "-1",
        "offsets.topic.num.partitions": "1", "share.coordinator.state.topic.num.partitions": "1",
    })
    first = Broker(config)
    await first.start()
    topic = first.topics.create("src", 1)
    first.on_topic_created(topic)
    first.topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true"})
    first.group_configs.apply("g", [("share.auto.offset.reset", "earliest"),
                                    ("errors.deadletterqueue.topic.name", "dlq.src")],
                              validation_context(first.config, first.topics))
    buf = bytearray(encode_batch([RecordInput(value=b"v%d" % i) for i in range(3)]))
    topic.partitions[0].append(buf, list(iter_batches(buf)))
    key = SharePartitionKey("g", topic.topic_id, 0)
    assert await first.persister.initialize_state(key, 0, -1) == 0  # as the group coordinator does
    leaders = first.share_partitions
    assert leaders is not None and leaders.dead_letters is not None
    leader = leaders.get_or_create(key, topic.partitions[0])
    acquired = await leader.acquire("m", max_records=10, batch_size=10, max_bytes=1 << 20, mode=AcquireMode.BATCH_OPTIMIZED)
    assert [(r.first_offset, r.last_offset) for r in acquired.acquired] == [(0, 2)]
    leader._dead_letter_task = asyncio.get_running_loop().create_future()  # the crash: it never runs
    assert await leader.acknowledge("m", [AckBatch(0, 2, [REJECT, REJECT, ACCEPT])]) == 0
    # Dead-lettering is pending: the group going idle must not drop the share partition from memory.
    assert not leader.idle
    leaders.drop_idle_group("g")
    assert leaders.get(key) is leader
    source = Source("g", "src", 0, topic.partitions[0])
    assert await leaders.dead_letters.write(source, [(0, 0, 1, True)], skip_existing=False) == 1
    await first.stop()

    second = Broker(config)
    await second.start()
    try:
        dlq_log = second.topics.get("dlq.src").partitions[0]  # type: ignore[union-attr]
        src = second.topics.get("src")
        assert src is not None and second.share_partitions is not None
        again = second.share_partitions.get_or_create(key, src.partitions[0])
        assert await again.ensure_loaded() == 0
        for _ in range(2000):
            if again.state is not None and again.state.archiving_count == 0:
                break
            await asyncio.sleep(0.005)
        assert again.state is not None and again.state.start_offset == 3
        records = decode_batches(dlq_log.read(0, 1 << 20))
        assert sorted(int({h.key: h.value for h in r.headers}["__dlq.errors.offset"] or b"") for r in records) == [0, 1]
    finally:
        await second.stop()


def test_many_dead_letters_are_split_within_max_message_bytes(tmp_path: Path) -> None:
    topics, groups, writer, check = _setup(tmp_path)
    source_topic = topics.create("src", 1)
    buf = bytearray(encode_batch([RecordInput(value=bytes(300)) for _ in range(40)]))
    source_topic.partitions[0].append(buf, list(iter_batches(buf)))
    topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true", "max.message.bytes": "4000"})
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.src"),
                       ("errors.deadletterqueue.copy.record.enable", "true")], check)
    source = Source("g", "src", 0, source_topic.partitions[0])
    assert asyncio.run(writer.write(source, [(0, 39, 1, True)], skip_existing=False)) == 40
    dlq_log = topics.get("dlq.src").partitions[0]  # type: ignore[union-attr]
    data = dlq_log.read(0, 1 << 20)
    sizes = [h.size for _pos, h in iter_batches(data)]
    assert len(sizes) > 1 and max(sizes) <= 4000
    assert len(decode_batches(data)) == 40
    topics.close()


async def test_the_recovery_scan_gives_the_event_loop_a_turn_between_slices(tmp_path: Path) -> None:
    """Scanning a large dead-letter partition after a crash reads it a slice at a time: work started
    after the scan runs before the scan ends (ordering, not time)."""
    topics, _groups, _writer, _check = _setup(tmp_path)
    dlq = topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true"})
    dlq_log = dlq.partitions[0]
    for i in range(12):  # 12 batches of 512 KiB: several slices
        headers = [Header("__dlq.errors.group", b"g"), Header("__dlq.errors.topic", b"src"),
                   Header("__dlq.errors.partition", b"0"), Header("__dlq.errors.offset", str(i).encode())]
        buf = bytearray(encode_batch([RecordInput(value=bytes(512 * 1024), headers=headers)]))
        dlq_log.append(buf, list(iter_batches(buf)))
    source = Source("g", "src", 0, dlq_log)
    order: list[str] = []

    async def scan() -> set[int]:
        found = await already_dead_lettered(dlq_log, source)
        order.append("scanned")
        return found

    async def other_request() -> None:
        await asyncio.sleep(0)
        order.append("answered")

    found, _ = await asyncio.gather(asyncio.create_task(scan()), asyncio.create_task(other_request()))
    assert found == set(range(12))
    assert order == ["answered", "scanned"]
    topics.close()
