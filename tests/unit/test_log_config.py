"""Topic configs (storage/log_config.py), recompression, time-based rolls and client quotas: the pure parts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.common.config import BrokerConfig
from shoal.broker.storage.client_quotas import ClientQuotaStore, QuotaOp, QuotaRequestError
from shoal.broker.storage.log_config import (
    INTERNAL_SEGMENT_BYTES,
    LIST_TYPED,
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    TOPIC_CONFIGS,
    ProducePolicy,
    apply_list_op,
    effective_configs,
    needs_recompression,
    recompress,
    resolve,
    segment_bytes,
    validate_topic_config,
)
from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, decode_batches, encode_batch, validate_batch_for_append

# ---- validation -----------------------------------------------------------------------------------------


def test_every_key_has_a_legal_default() -> None:
    for key, spec in TOPIC_CONFIGS.items():
        if spec.default is not None:
            assert validate_topic_config(key, spec.default) is None, key


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("segment.bytes", "1048575", "Value must be at least 1048576"),
    ("segment.ms", "0", "Value must be at least 1"),
    ("segment.index.bytes", "3", "Value must be at least 4"),
    ("compression.zstd.level", "23", "Value must be no more than 22"),
    ("compression.gzip.level", "10", "Value must be no more than 9"),
    ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
    ("preallocate", "yes", "Expected value to be either true or false"),
    ("retention.ms", "9223372036854775808", "Not a number of type LONG"),
    ("max.message.bytes", "2147483648", "Not a number of type INT"),
    ("cleanup.policy", "compact,forever", "String must be one of: compact, delete"),
    ("leader.replication.throttled.replicas", "1-2", "[partitionId]:[brokerId]"),
    ("message.format.version", "3.0", "Unknown topic config name"),
])
def test_refusals_name_the_rule(key: str, value: str, reason: str) -> None:
    problem = validate_topic_config(key, value)
    assert problem is not None and reason in problem


def test_gzip_level_minus_one_is_the_codec_default() -> None:
    assert validate_topic_config("compression.gzip.level", "-1") is None
    assert ProducePolicy.of({"compression.type": "gzip"}, BrokerConfig.from_strings({})).level is None


def test_internal_segment_bytes_allows_small_segments() -> None:
    assert validate_topic_config(INTERNAL_SEGMENT_BYTES, "1024") is None
    assert validate_topic_config(INTERNAL_SEGMENT_BYTES, "13") is not None
    broker = BrokerConfig.from_strings({})
    assert segment_bytes({INTERNAL_SEGMENT_BYTES: "1024", "segment.bytes": "2097152"}, broker) == 1024
    assert INTERNAL_SEGMENT_BYTES not in TOPIC_CONFIGS  # DescribeConfigs does not list it


# ---- values, sources and synonyms -----------------------------------------------------------------------


def test_value_comes_from_topic_then_broker_file_then_default() -> None:
    broker = BrokerConfig.from_strings({"log.roll.hours": "2", "log.retention.minutes": "5"})
    roll = resolve("segment.ms", {}, broker)
    assert (roll.value, roll.source) == (str(2 * 3600 * 1000), SOURCE_STATIC_BROKER)
    assert roll.synonyms == (("log.roll.hours", "2", SOURCE_STATIC_BROKER), ("log.roll.hours", "168", SOURCE_DEFAULT))
    retention = resolve("retention.ms", {}, broker)
    assert retention.value == str(5 * 60_000)
    overridden = resolve("segment.ms", {"segment.ms": "1000"}, broker)
    assert (overridden.value, overridden.source) == ("1000", SOURCE_TOPIC)
    assert overridden.synonyms[0] == ("segment.ms", "1000", SOURCE_TOPIC)
    plain = resolve("preallocate", {}, BrokerConfig.from_strings({}))
    assert (plain.value, plain.source) == ("false", SOURCE_DEFAULT)
    no_synonym = resolve("unclean.leader.election.enable", {}, broker)
    assert (no_synonym.value, no_synonym.source) == ("false", SOURCE_DEFAULT)


def test_broker_wide_timestamp_type_reaches_the_policy() -> None:
    policy = ProducePolicy.of({}, BrokerConfig.from_strings({"log.message.timestamp.type": "LogAppendTime"}))
    assert policy.log_append_time
    assert not ProducePolicy.of({"message.timestamp.type": "CreateTime"},
                                BrokerConfig.from_strings({"log.message.timestamp.type": "LogAppendTime"})).log_append_time


# ---- APPEND / SUBTRACT ----------------------------------------------------------------------------------

_ITEMS = st.lists(st.sampled_from(["compact", "delete", "a", "b"]), max_size=4)


@given(_ITEMS, _ITEMS)
def test_append_then_subtract_are_set_operations_that_keep_order(current: list[str], change: list[str]) -> None:
    appended = apply_list_op(",".join(current), ",".join(change), True).split(",")
    appended = [a for a in appended if a]
    # Everything there before stays, in order; what is new follows once.
    assert appended[: len(current)] == current
    assert set(appended) == set(current) | set(change)
    subtracted = [a for a in apply_list_op(",".join(appended), ",".join(change), False).split(",") if a]
    assert not set(subtracted) & set(change)
    assert subtracted == [a for a in appended if a not in change]


def test_list_typed_keys_are_kafkas() -> None:
    assert LIST_TYPED == {"cleanup.policy", "leader.replication.throttled.replicas",
                          "follower.replication.throttled.replicas"}


# ---- recompression --------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    source=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]),
    target=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]),
    level=st.one_of(st.none(), st.integers(1, 9)),
    producer=st.booleans(),
)
def test_recompression_keeps_records_and_producer_fields(values: list[bytes], source: int, target: int,
                                                         level: int | None, producer: bool) -> None:
    pid = 7 if producer else -1
    batch = encode_batch([RecordInput(b"k%d" % i, v, timestamp=1000 + i) for i, v in enumerate(values)],
                         compression=source, producer_id=pid, producer_epoch=3 if producer else -1,
                         base_sequence=11 if producer else -1, is_transactional=producer)
    buf = bytearray(batch + batch)  # two batches in one produce
    headers = list(iter_batches(buf))
    policy = ProducePolicy(codec=target, level=level if target in (GZIP, ZSTD, LZ4) else None)
    assert needs_recompression(headers, policy) == (source != target)
    out, new_headers = recompress(buf, headers, policy)
    for (pos, new), (_p, old) in zip(new_headers, headers, strict=True):
        assert new.compression == target
        validate_batch_for_append(out, pos, new)  # CRC, framing and records all hold
        assert (new.producer_id, new.producer_epoch, new.base_sequence, new.is_transactional) == \
            (old.producer_id, old.producer_epoch, old.base_sequence, old.is_transactional)
        assert (new.base_timestamp, new.max_timestamp, new.records_count) == \
            (old.base_timestamp, old.max_timestamp, old.records_count)
    assert [r.value for r in decode_batches(out)] == values + values


# ---- time-based roll and retention ----------------------------------------------------------------------


def _append(plog: PartitionLog, timestamps: list[int]) -> None:
    buf = bytearray(encode_batch([RecordInput(b"k", b"v", timestamp=ts) for ts in timestamps]))
    plog.append(buf, list(iter_batches(buf)))


def test_segment_ms_rolls_by_record_time(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_ms=1000))
    _append(plog, [10_000])
    _append(plog, [10_900])
    assert len(plog.segments) == 1
    _append(plog, [11_001])  # more than segment.ms after the segment's first batch
    assert len(plog.segments) == 2 and plog.active.base_offset == 2
    plog.close()


def test_full_index_rolls(tmp_path: Path) -> None:
    # Room for one time-index entry (12 bytes each): the segment rolls once it holds one.
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_index_bytes=12, index_interval_bytes=0))
    for i in range(6):
        _append(plog, [1000 + i])
    assert len(plog.segments) > 1
    plog.close()


def test_retention_empties_a_log_smaller_than_a_segment(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(retention_ms=5000))
    now = int(time.time() * 1000)
    _append(plog, [now - 60_000, now - 59_000])
    assert plog.enforce_retention(now) == 1
    assert plog.log_start_offset == plog.log_end_offset == 2 and plog.active.size == 0
    _append(plog, [now])
    assert plog.enforce_retention(now) == 0  # a fresh record stays
    plog.close()


def test_max_timestamp_is_the_first_record_carrying_it(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
    _append(plog, [100, 200])
    _append(plog, [5000, 9000, 6000, 9000, 7000])
    _append(plog, [8000])
    assert plog.max_timestamp() == (3, 9000)
    plog.close()


# ---- client quotas --------------------------------------------------------------------------------------


def test_quota_filters_match_as_kafka(tmp_path: Path) -> None:
    store = ClientQuotaStore(tmp_path)
    assert store.alter((("user", "a"),), [QuotaOp("producer_byte_rate", 10.0, False)], False) is None
    assert store.alter((("user", "a"), ("client-id", "c")), [QuotaOp("request_percentage", 1.5, False)], False) is None
    assert store.alter((("client-id", None),), [QuotaOp("consumer_byte_rate", 5.0, False)], False) is None
    assert store.alter((("ip", "10.1.2.3"),), [QuotaOp("connection_creation_rate", 3.0, False)], False) is None
    assert store.alter((("ip", "not an ip"),), [QuotaOp("connection_creation_rate", 3.0, False)], False) is not None

    def names(components: list[tuple[str, int, str | None]], strict: bool = False) -> set[tuple[tuple[str, str | None], ...]]:
        return {entity for entity, _v in store.describe(components, strict)}

    assert names([("user", 0, "a")]) == {(("user", "a"),), (("user", "a"), ("client-id", "c"))}
    assert names([("user", 0, "a")], strict=True) == {(("user", "a"),)}
    assert names([("client-id", 2, None)]) == {(("user", "a"), ("client-id", "c")), (("client-id", None),)}
    assert names([("client-id", 1, None)]) == {(("client-id", None),)}
    assert len(names([])) == 4
    for bad in ([("user", 0, None)], [("user", 1, "x")], [("user", 0, "a"), ("user", 2, None)], [("ip", 2, None), ("user", 2, None)]):
        with pytest.raises(QuotaRequestError):
            store.describe(bad, False)
    with pytest.raises(QuotaRequestError) as info:
        store.describe([("group", 2, None)], False)
    assert info.value.unsupported
    # validate_only changes nothing; the file survives a reload.
    assert store.alter((("user", "b"),), [QuotaOp("producer_byte_rate", 1.0, False)], True) is None
    assert names([("user", 0, "b")]) == set()
    assert len(ClientQuotaStore(tmp_path).describe([], False)) == 4


async def test_file_delete_delay_keeps_retired_files_for_a_while(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(retention_ms=1000, file_delete_delay_ms=50))
    now = int(time.time() * 1000)
    _append(plog, [now - 60_000])
    assert plog.enforce_retention(now) == 1
    # Renamed at once (the segment is gone from the log), removed only after the delay.
    assert sorted(p.name for p in (tmp_path / "t-0").glob("*.deleted")) == ["00000000000000000000.log.deleted"]
    assert plog.log_start_offset == 1
    deadline = time.monotonic() + 30
    while list((tmp_path / "t-0").glob("*.deleted")) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    plog.close()


def test_leftover_deleted_files_are_removed_on_open(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    plog = PartitionLog.open(directory, LogConfig())
    _append(plog, [1000])
    plog.close()
    (directory / "00000000000000000000.log.deleted").write_bytes(b"old")
    PartitionLog.open(directory, LogConfig()).close()
    assert not list(directory.glob("*.deleted"))


def test_flush_ms_default_is_kafkas_not_the_brokers_unset_marker() -> None:
    value = resolve("flush.ms", {}, BrokerConfig.from_strings({}))
    assert (value.value, value.source) == (str((1 << 63) - 1), SOURCE_DEFAULT)
    assert validate_topic_config("flush.ms", value.value) is None  # a described value can be set back
    static = resolve("flush.ms", {}, BrokerConfig.from_strings({"log.flush.interval.ms": "1000"}))
    assert (static.value, static.source) == ("1000", SOURCE_STATIC_BROKER)


def test_every_described_default_can_be_set_back() -> None:
    # Tools copy a topic's described configs onto another topic: each value must pass validation.
    for key, value in effective_configs({}, BrokerConfig.from_strings({})).items():
        assert value.value is not None and validate_topic_config(key, value.value) is None, (key, value)
