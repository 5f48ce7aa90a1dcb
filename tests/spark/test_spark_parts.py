"""The source's pieces that need no broker: options, offsets in the log, task planning, pickling."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shoal.client.spark.options import SparkOptionError
from shoal.client.spark.ranges import (
    OffsetRange,
    OffsetSet,
    plan_tasks,
    ranges_from_json,
    ranges_to_json,
)
from shoal.client.spark.source import (
    CHECKPOINT,
    COMMIT,
    DataLossError,
    KafkaShareStreamReader,
    SourceOptions,
    report_lost,
)

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "group.id": "g", "subscribe": "a, b"}


def test_options_take_spark_kafka_names_case_insensitively() -> None:
    opts = SourceOptions.parse(
        {
            **BASE,
            "MaxOffsetsPerTrigger": "123",
            "kafkaConsumer.pollTimeoutMs": "250",
            "minPartitions": "6",
            "failOnDataLoss": "False",
            "kafka.client.id": "me",
        }
    )
    assert opts.topics == ("a", "b")
    assert (opts.max_offsets_per_trigger, opts.poll_timeout_ms, opts.min_partitions) == (123, 250, 6)
    assert opts.fail_on_data_loss is False
    assert opts.client_config == {"client.id": "me"}
    assert opts.acknowledge_mode == CHECKPOINT  # the default
    assert SourceOptions.parse({**BASE, "acknowledgeMode": "Commit"}).acknowledge_mode == COMMIT
    # This source's earlier names still work.
    assert SourceOptions.parse({**BASE, "maxRecordsPerTrigger": "9"}).max_offsets_per_trigger == 9


def test_max_partition_fetch_bytes_is_a_source_setting_with_kafkas_default() -> None:
    assert SourceOptions.parse(BASE).max_partition_fetch_bytes == 1024 * 1024
    opts = SourceOptions.parse({**BASE, "kafka.max.partition.fetch.bytes": "65536", "kafka.client.id": "me"})
    assert opts.max_partition_fetch_bytes == 65536
    assert opts.client_config == {"client.id": "me"}  # not a connection setting


def test_headers_column_only_when_asked_and_delivery_count_always() -> None:
    plain = SourceOptions.parse(BASE).schema()
    with_headers = SourceOptions.parse({**BASE, "includeHeaders": "true"}).schema()
    assert "headers" not in plain and plain.endswith("deliveryCount INT")
    assert "headers ARRAY<STRUCT<key: STRING, value: BINARY>>" in with_headers
    assert with_headers.endswith("deliveryCount INT")


def test_executors_read_from_the_upstream_only_when_the_source_names_it() -> None:
    through = SourceOptions.parse({**BASE, "kafka.client.id": "me"})
    assert through.upstream is None
    assert (through.reads_from().bootstrap_servers, through.reads_from().client_config) == (
        "127.0.0.1:9092", {"client.id": "me"})
    direct = SourceOptions.parse({**BASE, "kafka.client.id": "me", "upstream.bootstrap.servers": "up:9092",
                                  "upstream.security.protocol": "SSL", "upstream.client.id": "exec"})
    assert (direct.reads_from().bootstrap_servers, direct.reads_from().client_config) == (
        "up:9092", {"security.protocol": "SSL", "client.id": "exec"})
    # The driver keeps acquiring through the sidecar with its own settings.
    assert (direct.bootstrap_servers, direct.client_config) == ("127.0.0.1:9092", {"client.id": "me"})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"upstream.security.protocol": "SSL"}, "upstream.security.protocol.*needs 'upstream.bootstrap.servers'"),
        ({"upstream.bootstrap.servers": "up:9092", "upstream.no.such.setting": "1"}, "upstream.*no.such.setting"),
        ({"group.id": ""}, "group.id"),
        ({"subscribe": " , "}, "subscribe"),
        ({"subscribePattern": "a.*"}, "subscribe"),
        ({"startingOffsets": "earliest"}, "share.auto.offset.reset"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"minPartitions": "x"}, "minPartitions"),
        ({"acknowledgeMode": "sometimes"}, "acknowledgeMode.*checkpoint, commit"),
        ({"failOnDataLoss": "yes"}, "failOnDataLoss"),
        ({"kafka.no.such.setting": "1"}, "no.such.setting"),
        ({"kafka.max.partition.fetch.bytes": "0"}, "kafka.max.partition.fetch.bytes.*>= 1"),
        ({"maxOffsetPerTrigger": "5"}, "unknown option 'maxoffsetpertrigger'.*did you mean 'maxOffsetsPerTrigger'"),
        ({"includeHeader": "true"}, "unknown option 'includeheader'.*'includeHeaders'"),
        ({"colour": "blue"}, "unknown option 'colour' for the kafka-share source$"),
    ],
)
def test_bad_options_fail_naming_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(SparkOptionError, match=message):
        SourceOptions.parse({**BASE, **extra})


def test_lost_offsets_fail_or_warn_naming_the_range(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(DataLossError, match="orders-2 offsets 10..19 .*failOnDataLoss=false"):
        report_lost("orders", 2, 10, 19, fail=True)
    with caplog.at_level(logging.WARNING, logger="shoal.client.spark.source"):
        report_lost("orders", 2, 10, 19, fail=False)
    assert "skipping orders-2 offsets 10..19" in caplog.text


ranges_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 400), st.integers(1, 5), st.integers(0, 50_000)),
    min_size=0,
    max_size=12,
)


def _batch(spec: list[tuple[int, int, int, int]]) -> dict[tuple[str, int], list[OffsetRange]]:
    """Disjoint ranges per partition from (partition, length, delivery count, bytes) tuples."""
    out: dict[tuple[str, int], list[OffsetRange]] = {}
    next_offset: dict[int, int] = {}
    for partition, length, count, size in spec:
        first = next_offset.get(partition, 0) + 3  # leave a gap: other consumers own those offsets
        out.setdefault(("t", partition), []).append(OffsetRange(first, first + length - 1, count, size))
        next_offset[partition] = first + length
    return out


@given(ranges_strategy, st.integers(1, 60_000), st.integers(1, 40))
# An offset over the cap, then offsets of no size: they must not join its task.
@example(spec=[(0, 1, 1, 2), (0, 2, 1, 0)], max_bytes=1, min_partitions=1)
def test_planning_covers_each_offset_once_in_order_within_the_byte_cap(
    spec: list[tuple[int, int, int, int]], max_bytes: int, min_partitions: int
) -> None:
    batch = _batch(spec)
    tasks = plan_tasks(batch, max_bytes, min_partitions)
    for tp, ranges in batch.items():
        want = [(o, r.delivery_count) for r in ranges for o in range(r.first, r.last + 1)]
        got = [(o, r.delivery_count) for t in tasks for p in t.parts if (p.topic, p.partition) == tp
               for r in p.ranges for o in range(r.first, r.last + 1)]
        assert got == want  # every offset once, in offset order, with its delivery count
    for task in tasks:
        assert task.count > 0 and all(p.ranges for p in task.parts)
        assert len({(p.topic, p.partition) for p in task.parts}) == len(task.parts)  # a partition's run stays whole
        assert task.size <= max_bytes or task.count == 1
    offsets = sum(r.count for rs in batch.values() for r in rs)
    assert len(tasks) >= min(min_partitions, offsets)


def test_planning_cuts_a_partition_into_even_tasks() -> None:
    # 100k offsets of ~107 bytes in gappy ranges: 1.28 x the cap is two tasks of about half each, not a
    # full task and a small one.
    ranges = [OffsetRange(first, first + 9_999, 1, 1_070_000) for first in range(0, 200_000, 20_000)]
    tasks = plan_tasks({("t", 0): ranges}, 8 * 1024 * 1024)
    assert len(tasks) == 2
    assert abs(tasks[0].count - tasks[1].count) <= 100
    assert all(t.size <= 8 * 1024 * 1024 for t in tasks)


def test_planning_cuts_by_bytes_not_by_partition() -> None:
    # A batch of 100k offsets over three partitions (about 3.6 MB each) is two tasks of about half the
    # batch, the middle partition split between them at an offset, not three tasks, one per partition.
    batch = {("t", p): [OffsetRange(1000 * p, 1000 * p + 33_332, 1, 3_600_000)] for p in range(3)}
    tasks = plan_tasks(batch, 8 * 1024 * 1024)
    assert len(tasks) == 2
    assert abs(tasks[0].count - tasks[1].count) <= 100
    assert [(p.topic, p.partition) for p in tasks[0].parts] == [("t", 0), ("t", 1)]
    assert [(p.topic, p.partition) for p in tasks[1].parts] == [("t", 1), ("t", 2)]
    assert tasks[0].parts[1].ranges[-1].last + 1 == tasks[1].parts[0].ranges[0].first
    # minPartitions asks for more tasks: still even shares of the batch, not halves and quarters.
    spread = plan_tasks(batch, 8 * 1024 * 1024, min_partitions=4)
    assert len(spread) == 4
    assert max(t.count for t in spread) - min(t.count for t in spread) <= 100
    # Small batches over many partitions are one task: each Spark task has a fixed cost.
    small = {("t", p): [OffsetRange(0, 99, 1, 10_000)] for p in range(12)}
    assert len(plan_tasks(small, 8 * 1024 * 1024)) == 1
    assert len(plan_tasks(small, 8 * 1024 * 1024, min_partitions=12)) == 12


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=12))
def test_spans_join_ranges_that_follow_on_and_keep_each_offsets_delivery_count(
    spec: list[tuple[int, int, int]],
) -> None:
    """A partition's ranges (gap before, length - 1, delivery count) in offset order: the spans cover the
    same offsets in the same order, each without a gap and with one between spans, and every offset keeps
    its range's count."""
    from shoal.client.spark.source import _read_spans

    ranges, at = [], 0
    for gap, extra, count in spec:
        ranges.append((at + gap, at + gap + extra, count))
        at += gap + extra + 1
    count_at = {o: count for first, last, count in ranges for o in range(first, last + 1)}
    spans = _read_spans(ranges)
    assert [o for s in spans for o in range(s.first, s.last + 1)] == list(count_at)
    assert all(a.last + 1 < b.first for a, b in zip(spans, spans[1:], strict=False))
    for s in spans:
        offsets = np.arange(s.first, s.last + 1, dtype=np.int64)
        assert s.delivery_counts(offsets).to_pylist() == [count_at[o] for o in offsets.tolist()]


@given(ranges_strategy, st.integers(1, 10**9))
def test_journal_entries_round_trip(spec: list[tuple[int, int, int, int]], seq: int) -> None:
    from shoal.client.spark.journal import decode_entry, encode_entry

    batch = _batch(spec)
    entry = decode_entry(encode_entry(seq, batch))
    assert (entry.seq, entry.ranges) == (seq, {tp: rs for tp, rs in batch.items() if rs})


@given(ranges_strategy)
def test_ranges_survive_the_offset_log(spec: list[tuple[int, int, int, int]]) -> None:
    batch = _batch(spec)
    assert ranges_from_json(ranges_to_json(batch)) == {tp: rs for tp, rs in batch.items() if rs}


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 60))), st.integers(0, 60), st.integers(0, 60))
def test_offset_set_matches_a_plain_set(ops: list[tuple[bool, int, int]], lo: int, hi: int) -> None:
    tp = ("t", 0)
    s, model = OffsetSet(), set()
    for add, a, b in ops:
        a, b = min(a, b), max(a, b)
        if add:
            s.add(tp, a, b)
            model |= set(range(a, b + 1))
        else:
            s.remove(tp, a, b)
            model -= set(range(a, b + 1))
    spans = s.intervals.get(tp, [])
    assert {o for a, b in spans for o in range(a, b + 1)} == model
    assert all(b1 + 1 < a2 for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False))  # merged, sorted
    assert OffsetSet.from_json(s.to_json()).intervals.get(tp, []) == spans
    lo, hi = min(lo, hi), max(lo, hi)
    inside, outside = s.split(tp, lo, hi)
    assert {o for a, b in inside for o in range(a, b + 1)} == model & set(range(lo, hi + 1))
    assert {o for a, b in outside for o in range(a, b + 1)} == set(range(lo, hi + 1)) - model


def test_reader_pickles_without_its_driver_state() -> None:
    reader = KafkaShareStreamReader(SourceOptions.parse(BASE))
    reader._acq = object()  # type: ignore[assignment]  # stands in for the live consumer and its thread
    reader._logged.add(("a", 0), 1, 5)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._acq is None and not copy._logged and copy.options == reader.options


def test_offsets_carry_one_member_id_and_a_checkpointed_one_wins() -> None:
    reader = KafkaShareStreamReader(SourceOptions.parse(BASE))
    first = reader.initialOffset()
    assert first["seq"] == 0 and first["member"] and first["acknowledgeMode"] == CHECKPOINT
    assert reader.initialOffset() == first  # one member id for the life of the reader
    restarted = KafkaShareStreamReader(SourceOptions.parse(BASE))
    assert restarted.initialOffset()["member"] != first["member"]
    # Before its consumer exists, a restarted reader adopts the id recorded in the checkpoint's offset.
    restarted._adopt_member({"seq": 7, "member": first["member"]})
    assert restarted._offset(8)["member"] == first["member"]
    restarted._adopt_member({"seq": 7})
    assert restarted._offset(8)["member"] == first["member"]


def test_a_replayed_batch_plans_the_same_tasks_without_a_consumer() -> None:
    """partitions() of a batch from the offset log needs nothing but the offset: no broker, no payloads."""
    reader = KafkaShareStreamReader(SourceOptions.parse({**BASE, "maxBytesPerPartition": "1000"}))
    ranges = {("a", 0): [OffsetRange(10, 29, 2, 2000)], ("b", 1): [OffsetRange(5, 5, 1, 100)]}
    end = {"seq": 3, "member": "m", "acknowledgeMode": CHECKPOINT, "ranges": ranges_to_json(ranges)}
    tasks = reader.partitions({"seq": 2, "member": "m", "acknowledgeMode": CHECKPOINT}, end)
    # 2100 bytes, at most 1000 a task: three tasks of about 700, the last with the ranges of two partitions.
    assert [t.parts for t in tasks] == [
        [("a", 0, [(10, 17, 2)])],
        [("a", 0, [(18, 25, 2)])],
        [("a", 0, [(26, 29, 2)]), ("b", 1, [(5, 5, 1)])],
    ]
    assert reader.partitions(end, end) == []
    # The replayed ranges are now known to be in the offset log: if they come back, they are dropped.
    assert reader._logged.split(("a", 0), 0, 40)[0] == [(10, 29)]
    # Commit mode replays nothing: the batch's records were never accepted and come back by themselves.
    commit_reader = KafkaShareStreamReader(SourceOptions.parse({**BASE, "acknowledgeMode": "commit"}))
    assert commit_reader.partitions({"seq": 2}, {**end, "acknowledgeMode": COMMIT}) == []
