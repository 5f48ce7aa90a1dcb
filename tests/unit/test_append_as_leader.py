"""`PartitionLog.append_as_leader`, the one entry every writer appends through: what each origin checks,
the producer state it keeps, the long polls it wakes and what it counts; and the dead-letter writer's
records going through the same rules as a produce."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.broker.common.config import BrokerConfig
from shoal.broker.common.metrics import BrokerMetrics
from shoal.broker.common.purgatory import LogKey, Purgatory
from shoal.broker.share.dead_letter import DeadLetterWriter, Source
from shoal.broker.share.group_configs import GroupConfigs, validation_context
from shoal.broker.storage.partition_log import AppendOrigin, AppendRefused, PartitionLog
from shoal.broker.storage.topic_registry import TopicRegistry
from shoal.protocol.compression import NONE, ZSTD
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, decode_batches, encode_batch, encode_txn_marker

CLIENT, COORDINATOR, REPLICATION = AppendOrigin.CLIENT, AppendOrigin.COORDINATOR, AppendOrigin.REPLICATION


def _registry(tmp_path: Path, **broker: str) -> tuple[TopicRegistry, Purgatory, BrokerMetrics]:
    cfg = BrokerConfig.from_strings({"log.dirs": str(tmp_path), **broker})
    purgatory, metrics = Purgatory(), BrokerMetrics()
    topics = TopicRegistry(tmp_path, cfg, purgatory=purgatory, metrics=metrics)
    topics.load()
    return topics, purgatory, metrics


def _log(topics: TopicRegistry, name: str, configs: dict[str, str] | None = None) -> PartitionLog:
    return topics.create(name, 1, configs).partitions[0]


def _batch(n: int = 2, **kw: int | bool) -> bytes:
    return encode_batch([RecordInput(key=b"k%d" % i, value=b"v%d" % i) for i in range(n)], **kw)  # type: ignore[arg-type]


def _stored(plog: PartitionLog) -> list[tuple[int, int, bool]]:
    """(base offset, codec, control) of every batch the log holds."""
    data = plog.read(plog.log_start_offset, 1 << 20)
    return [(h.base_offset, h.compression, h.is_control) for _p, h in iter_batches(data)]


def _refused(plog: PartitionLog, records: bytes, **kw: object) -> AppendRefused:
    end = plog.log_end_offset
    with pytest.raises(AppendRefused) as info:
        plog.append_as_leader(records, **kw)  # type: ignore[arg-type]
    assert plog.log_end_offset == end  # nothing appended
    return info.value


# ---- CLIENT ----------------------------------------------------------------------------------------


def test_a_client_append_is_validated_and_answered_with_kafka_codes(tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    plog = _log(topics, "t", {"max.message.bytes": "200"})
    assert plog.append_as_leader(_batch(), origin=CLIENT).base_offset == 0
    marker = encode_txn_marker(commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=0)
    assert _refused(plog, marker, origin=CLIENT, transactional_id="tx").error_code == ErrorCode.INVALID_RECORD
    assert _refused(plog, _batch(20), origin=CLIENT).error_code == ErrorCode.MESSAGE_TOO_LARGE
    damaged = bytearray(_batch())
    damaged[-1] ^= 0xFF
    assert _refused(plog, bytes(damaged), origin=CLIENT).error_code == ErrorCode.CORRUPT_MESSAGE
    assert _refused(plog, b"", origin=CLIENT).error_code == ErrorCode.CORRUPT_MESSAGE
    # A transactional batch carries no sequence only when the coordinator writes it.
    txn = _batch(producer_id=5, producer_epoch=0, is_transactional=True)
    assert _refused(plog, txn, origin=CLIENT, transactional_id="tx").error_code == ErrorCode.INVALID_RECORD


def test_a_client_s_sequences_are_checked_and_a_retry_is_answered_with_its_first_offset(tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    plog = _log(topics, "t")
    plog.append_as_leader(_batch(1), origin=CLIENT)
    first = _batch(2, producer_id=9, producer_epoch=0, base_sequence=0)
    result = plog.append_as_leader(first, origin=CLIENT)
    assert (result.base_offset, result.last_offset, result.duplicate) == (1, 2, False)
    retry = plog.append_as_leader(first, origin=CLIENT)
    assert (retry.base_offset, retry.duplicate, plog.log_end_offset) == (1, True, 3)
    gap = _batch(1, producer_id=9, producer_epoch=0, base_sequence=5)
    refused = _refused(plog, gap, origin=CLIENT)
    assert (refused.error_code, refused.log_start_offset) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 0)
    assert plog.producer_state.producers[9].last_seq == 1


def test_clients_reach_internal_topics_only_when_allowed_and_transactions_need_an_id(tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    internal = _log(topics, "__consumer_offsets")
    refused = _refused(internal, _batch(), origin=CLIENT)
    assert refused.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert refused.message == "Cannot append to internal topic __consumer_offsets"
    assert internal.append_as_leader(_batch(), origin=CLIENT, internal_topics_allowed=True).base_offset == 0
    assert internal.append_as_leader(_batch(), origin=COORDINATOR).base_offset == 2
    plog = _log(topics, "t")
    txn = _batch(producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    assert _refused(plog, txn, origin=CLIENT).error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    plog.append_as_leader(txn, origin=CLIENT, transactional_id="tx")  # verification off: the id suffices
    assert plog.last_stable_offset == 0


# ---- COORDINATOR -----------------------------------------------------------------------------------


def test_the_coordinator_writes_markers_and_sequence_less_transactions_under_the_topic_s_rules(
        tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    plog = _log(topics, "t", {"compression.type": "zstd", "cleanup.policy": "compact"})
    txn = _batch(producer_id=5, producer_epoch=0, is_transactional=True)
    plog.append_as_leader(txn, origin=COORDINATOR)
    assert plog.last_stable_offset == 0  # the transaction is open
    plog.append_marker(producer_id=5, producer_epoch=0, commit=False, coordinator_epoch=0, timestamp_ms=0)
    assert plog.last_stable_offset == plog.log_end_offset == 3
    assert [a.producer_id for a in plog.aborted_transactions(0, 3)] == [5]
    # The data batch took the topic's codec; the marker stays as written, as Kafka keeps control batches.
    assert _stored(plog) == [(0, ZSTD, False), (2, NONE, True)]
    keyless = encode_batch([RecordInput(key=None, value=b"v")])
    assert _refused(plog, keyless, origin=COORDINATOR).error_code == ErrorCode.INVALID_RECORD


# ---- REPLICATION -----------------------------------------------------------------------------------


def test_a_replicated_batch_is_taken_as_it_is_and_its_producer_remembered(tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    plog = _log(topics, "t", {"compression.type": "zstd", "max.message.bytes": "100"})
    copied = _batch(3, base_offset=40, producer_id=8, producer_epoch=2, base_sequence=7)
    result = plog.append_as_leader(copied, origin=REPLICATION)
    assert (result.base_offset, result.last_offset) == (0, 2)  # offsets are still this log's
    assert _stored(plog) == [(0, NONE, False)]  # neither recompressed nor held to max.message.bytes
    assert plog.producer_state.producers[8].last_seq == 9
    # An older epoch is refused to a client but recorded from a copy, as Kafka's follower does.
    older = _batch(1, producer_id=8, producer_epoch=1, base_sequence=0)
    plog.append_as_leader(older, origin=REPLICATION)
    assert plog.log_end_offset == 4
    damaged = bytearray(_batch())
    damaged[-1] ^= 0xFF
    assert _refused(plog, bytes(damaged), origin=REPLICATION).error_code == ErrorCode.CORRUPT_MESSAGE


# ---- reporting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", list(AppendOrigin))
async def test_an_append_wakes_a_long_poll_on_its_partition_and_is_counted(tmp_path: Path,
                                                                            origin: AppendOrigin) -> None:
    topics, purgatory, metrics = _registry(tmp_path)
    topic = topics.create("t", 2)
    other = purgatory.watch([LogKey(topic.topic_id, 1)])
    waiter = asyncio.create_task(purgatory.wait([LogKey(topic.topic_id, 0)], 30))
    await asyncio.sleep(0)
    topic.partitions[0].append_as_leader(_batch(3), origin=origin)
    assert await waiter
    assert not other.notified
    other.close()
    assert metrics.registry.get_sample_value("shoal_messages_in_total", {"topic": "t"}) == 3
    assert metrics.registry.get_sample_value("shoal_log_bytes_in_total", {"topic": "t"}) == len(_batch(3))


async def test_a_refused_append_wakes_no_one_and_counts_nothing(tmp_path: Path) -> None:
    topics, purgatory, metrics = _registry(tmp_path)
    topic = topics.create("t", 1)
    with purgatory.watch([LogKey(topic.topic_id, 0)]) as watch:
        with pytest.raises(AppendRefused):
            topic.partitions[0].append_as_leader(b"", origin=CLIENT)
        assert not watch.notified
    assert metrics.registry.get_sample_value("shoal_messages_in_total", {"topic": "t"}) is None


# ---- the dead-letter writer ------------------------------------------------------------------------


async def test_dead_letters_take_the_dead_letter_topic_s_codec_and_wake_its_long_polls(tmp_path: Path) -> None:
    topics, purgatory, _m = _registry(tmp_path)
    cfg = topics.broker_config
    groups = GroupConfigs(tmp_path, cfg)
    writer = DeadLetterWriter(topics, cfg, groups, lambda _t: None)
    source_topic = topics.create("src", 1)
    source_topic.partitions[0].append_as_leader(_batch(4), origin=CLIENT)
    dlq = topics.create("dlq.src", 1, {"errors.deadletterqueue.group.enable": "true", "compression.type": "zstd"})
    groups.apply("g", [("errors.deadletterqueue.topic.name", "dlq.src")], validation_context(cfg, topics))
    with purgatory.watch([LogKey(dlq.topic_id, 0)]) as watch:
        written = await writer.write(Source("g", "src", 0, source_topic.partitions[0]), [(1, 2, 1, True)],
                                     skip_existing=False)
        assert watch.notified
    assert written == 2
    dlq_log = dlq.partitions[0]
    assert [codec for _o, codec, _c in _stored(dlq_log)] == [ZSTD]
    assert [r.offset for r in decode_batches(dlq_log.read(0, 1 << 20))] == [0, 1]
    assert dlq_log.flushed_offset == 2


# ---- records handed over (Produce: views into the request's own frame) -------------------------------

_handed_over_batches = st.lists(
    st.tuples(st.integers(1, 5), st.sampled_from([NONE, ZSTD]), st.booleans()), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_handed_over_batches, log_append_time=st.booleans(), fail_one=st.booleans())
def test_records_handed_over_are_patched_in_place_and_stored_as_a_copy_would_be(
        tmp_path_factory: pytest.TempPathFactory, batches: list[tuple[int, int, bool]], log_append_time: bool,
        fail_one: bool) -> None:
    # Two partitions alike, one given copies of the batches, the other writable views it may patch: the
    # same answers, the same stored bytes, and a refusal leaves the handed-over bytes untouched.
    topics, _p, _m = _registry(tmp_path_factory.mktemp("handed"))
    configs = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
    copied, handed = _log(topics, "copied", configs), _log(topics, "handed", configs)
    for n, codec, corrupt in batches:
        data = bytearray(_batch(n, compression=codec))
        if fail_one and corrupt:
            data[-1] ^= 0xFF  # the CRC no longer matches
        frame = bytearray(b"\x00" * 7 + data + b"\x00" * 3)  # the records sit inside a larger frame
        view = memoryview(frame)[7 : 7 + len(data)]
        if fail_one and corrupt:
            a, b = _refused(copied, bytes(data)), _refused(handed, view, handed_over=True)
            assert (a.error_code, a.message) == (b.error_code, b.message)
            assert view == data  # refused: not patched
            continue
        first = copied.append_as_leader(bytes(data))
        second = handed.append_as_leader(view, handed_over=True)
        assert (first.base_offset, first.last_offset) == (second.base_offset, second.last_offset)
        # The view itself was patched (its base offset), and only its own bytes.
        assert frame[:7] == b"\x00" * 7 and frame[-3:] == b"\x00" * 3
        assert int.from_bytes(view[0:8], "big") == second.base_offset
    assert copied.log_end_offset == handed.log_end_offset
    stored_copied = copied.read(0, 1 << 20)
    stored_handed = handed.read(0, 1 << 20)
    if log_append_time:
        # Stamped with each append's own clock: compare the batches with the stamp (and CRC) left out.
        assert [(h.base_offset, h.records_count, h.timestamp_type) for _p, h in iter_batches(stored_copied)] == \
               [(h.base_offset, h.records_count, h.timestamp_type) for _p, h in iter_batches(stored_handed)]
    else:
        assert stored_copied == stored_handed
    topics.close()


def test_read_only_records_handed_over_are_copied_not_patched(tmp_path: Path) -> None:
    topics, _p, _m = _registry(tmp_path)
    plog = _log(topics, "t")
    plog.append_as_leader(_batch(1))
    data = _batch(2)
    before = bytearray(data)  # a copy (encoding again could stamp another millisecond)
    view = memoryview(data)  # over bytes: read-only
    result = plog.append_as_leader(view, handed_over=True)
    assert result.base_offset == 1 and data == before
    topics.close()
