"""The kafka-share Spark source against a real broker: completeness, accepted offsets, queue semantics."""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

import pytest

from shoal.client.admin import Admin
from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import (
    Consumed,
    create_topic,
    poll_until,
    produce,
    set_group_config,
    share_consumer,
)

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from shoal.client.spark.source import SourceOptions


def _prepare(broker: BrokerProcess, topic: str, group: str, partitions: int) -> None:
    create_topic(broker.bootstrap, topic, partitions)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")


def _one_partition_of(broker: BrokerProcess, topic: str, group: str, records: int) -> SourceOptions:
    """Source options for `group` reading a new one-partition topic holding `records` records."""
    from shoal.client.spark.source import SourceOptions

    _prepare(broker, topic, group, 1)
    produce(broker.bootstrap, topic, records)
    return SourceOptions.parse({"kafka.bootstrap.servers": broker.bootstrap, "group.id": group, "subscribe": topic})


def _first_batch(reader: Any, start: dict[str, Any], limit: Any) -> dict[str, Any]:
    """The first trigger's end offset, once a trigger holds records. On a loaded machine a new member's
    first fetch can come back empty (its assignment, or its partition's first load, came after the source's
    wait): that trigger holds nothing, and Spark's next trigger asks again from the same start, as this does."""
    offset: dict[str, Any] = reader.latestOffset(start, limit)
    deadline = time.monotonic() + 60
    while "ranges" not in offset and time.monotonic() < deadline:
        time.sleep(0.2)
        offset = reader.latestOffset(start, limit)
    return offset


def _rows(spark: SparkSession, table: str) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in spark.sql(f"SELECT partition, offset FROM {table}").collect()]


def _source(spark: SparkSession, broker: BrokerProcess, topic: str, group: str, **options: object) -> DataFrame:
    reader = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_stream_reads_every_record_by_offset_and_accepts_them(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    from shoal.client.producer import Producer

    topic, group = "spark-orders", "spark-all"
    _prepare(broker, topic, group, 3)
    with Producer(broker.bootstrap) as producer:
        rows = [(topic, f"v{i}".encode(), str(i).encode(), [("n", str(i).encode())], i % 3) for i in range(6000)]
        assert producer.send_many(rows).result(60) == 6000
    df = _source(spark, broker, topic, group, maxOffsetsPerTrigger=2000, minPartitions=4, includeHeaders="true")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"),
        ("value", "binary"),
        ("topic", "string"),
        ("partition", "int"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>"),
        ("deliveryCount", "int"),
    ]
    query = (
        df.writeStream.format("memory")
        .queryName("all_orders")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    got = spark.sql("SELECT key, value, topic, partition, offset, headers, deliveryCount, timestamp FROM all_orders").collect()

    assert len(got) == 6000
    assert sorted(int(r.key) for r in got) == list(range(6000))  # every record, once
    for r in got:
        i = int(r.key)
        assert (bytes(r.value), r.partition, r.topic) == (f"v{i}".encode(), i % 3, topic)
        assert [(h.key, bytes(h.value)) for h in r.headers] == [("n", str(i).encode())]
    assert {r.offset for r in got if r.partition == 0} == set(range(2000))
    assert {r.deliveryCount for r in got} == {1}
    assert all(r.timestamp is not None for r in got)
    # maxOffsetsPerTrigger caps each micro-batch.
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 6000 and max(sizes) <= 2000

    # After the drain the group has accepted everything: lag 0 through DescribeShareGroupOffsets.
    with Admin(broker.bootstrap) as admin:
        offsets = admin.list_share_group_offsets(group, [topic])
    assert {tp[1]: o.start_offset for tp, o in offsets.items()} == {0: 2000, 1: 2000, 2: 2000}
    assert {o.lag for o in offsets.values()} == {0}


def test_a_task_failing_once_is_retried_and_the_output_is_exactly_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, udf

    topic, group = "spark-retry", "spark-retry-group"
    _prepare(broker, topic, group, 2)
    produced = produce(broker.bootstrap, topic, 2000, partitions=2)

    def fail_first_attempt(offset):  # type: ignore[no-untyped-def]  # (hints would make it a pandas UDF)
        from pyspark import TaskContext

        # Each task's first attempt fails: Spark retries it, and the retry reads the same ranges again.
        if TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("first attempt fails")
        return offset

    flaky = udf(fail_first_attempt, "long")

    out = tmp_path / "out"
    query = (
        _source(spark, broker, topic, group, maxOffsetsPerTrigger=700)
        .select("partition", flaky(col("offset")).alias("offset"))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted((p, o) for p, o, _ in produced)


def test_replay_after_delete_records_fails_or_skips_by_fail_on_data_loss(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, group = "spark-loss", "spark-loss-group"
    _prepare(broker, topic, group, 1)
    produce(broker.bootstrap, topic, 300)

    def fail(batch: DataFrame, batch_id: int) -> None:
        if batch.count():
            raise RuntimeError("sink down")

    # The first batch (offsets 0..99) reaches the offset log, then the sink fails: it is left to replay.
    query = (
        _source(spark, broker, topic, group, maxOffsetsPerTrigger=100)
        .writeStream.foreachBatch(fail)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    with pytest.raises(Exception, match="sink down"):
        query.awaitTermination(120)
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-skip")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        future.result(30)

    kept: list[int] = []

    def keep(batch: DataFrame, batch_id: int) -> None:
        kept.extend(r.offset for r in batch.select("offset").collect())

    strict = (
        _source(spark, broker, topic, group)
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=f"{topic}-0 offsets 0..39 of this micro-batch were removed"):
        strict.awaitTermination(120)
    assert kept == []

    lenient = (
        _source(spark, broker, topic, group, failOnDataLoss="false")
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "ckpt-skip"))
        .trigger(availableNow=True)
        .start()
    )
    lenient.awaitTermination(120)
    assert lenient.exception() is None
    # The replayed batch keeps what is left of it (40..99); the rest of the topic follows.
    assert sorted(kept) == list(range(40, 300))


def test_bad_options_fail_when_the_query_is_defined(spark: SparkSession, broker: BrokerProcess) -> None:
    with pytest.raises(Exception, match="unknown option 'maxoffsetpertrigger'.*did you mean 'maxOffsetsPerTrigger'"):
        _source(spark, broker, "t", "g", maxOffsetPerTrigger=10)
    with pytest.raises(Exception, match="acknowledgeMode"):
        _source(spark, broker, "t", "g", acknowledgeMode="later")


def test_two_queries_in_one_share_group_split_the_queue(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = "spark-split", "spark-split-group"
    _prepare(broker, topic, group, 3)
    queries = []
    for name in ("split_a", "split_b"):
        df = (
            spark.readStream.format("kafka-share")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("group.id", group)
            .option("subscribe", topic)
            .option("maxOffsetsPerTrigger", 200)
            .load()
        )
        queries.append(
            df.writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
    try:
        with Admin(broker.bootstrap) as admin:
            # Produce only once both queries' consumers are members with partitions, so neither can take
            # the whole topic before the other has joined.
            deadline = time.monotonic() + 90
            while True:
                members = admin.describe_share_groups([group])[group].members
                if len(members) == 2 and all(m.assignment for m in members):
                    break
                assert time.monotonic() < deadline, f"members: {members}"
                time.sleep(0.3)
        produced = produce(broker.bootstrap, topic, 3000, partitions=3)

        deadline = time.monotonic() + 120
        while len(_rows(spark, "split_a")) + len(_rows(spark, "split_b")) < len(produced):
            for q in queries:
                assert q.exception() is None
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        for q in queries:
            q.stop()
    a, b = _rows(spark, "split_a"), _rows(spark, "split_b")
    assert a and b, "one query got all the work"
    assert sorted(a + b) == sorted((p, o) for p, o, _ in produced)  # together: each record exactly once


def test_commit_mode_stopping_a_query_releases_what_it_holds(spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "spark-stop", "spark-stop-group"
    _prepare(broker, topic, group, 1)
    # A lock far longer than the test: records come back only if the stopped query hands them back.
    set_group_config(broker.bootstrap, group, share_record_lock_duration_ms="3600000")
    produced = produce(broker.bootstrap, topic, 300)
    df = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("maxOffsetsPerTrigger", 100)
        .option("acknowledgeMode", "commit")
        .load()
    )

    def start(attempt: int) -> StreamingQuery:
        # One batch, then an hour's wait: its records stay acquired (settled only when the next batch is planned).
        return (
            df.writeStream.format("memory")
            .queryName("stop_sink")
            .option("checkpointLocation", str(tmp_path / f"ckpt-{attempt}"))
            .trigger(processingTime="1 hour")
            .start()
        )

    def first_trigger_came_back_empty(query: StreamingQuery) -> bool:
        return not query.status["isTriggerActive"] and any(p["numInputRows"] == 0 for p in query.recentProgress)

    # The source waits a while (not forever) for its new consumer's assignment; on a loaded machine the
    # assignment can come later, and then the first trigger plans an empty batch and the next one is an hour
    # away. Such a query holds nothing: a new one (same group, same records) starts the scenario again.
    for attempt in range(3):
        query = start(attempt)
        try:
            deadline = time.monotonic() + 90
            while not _rows(spark, "stop_sink") and not first_trigger_came_back_empty(query):
                assert query.exception() is None
                assert time.monotonic() < deadline
                time.sleep(0.3)
        finally:
            query.stop()
        if _rows(spark, "stop_sink"):
            break
    first_batch = _rows(spark, "stop_sink")
    assert len(first_batch) == 100

    consumer = share_consumer(broker.bootstrap, group, [topic])
    got = Consumed()
    try:
        poll_until(consumer, lambda: len(got) >= len(produced), got, timeout=60)
    finally:
        consumer.close()
    counts = {(p, o): d for p, o, _, d in got.records}
    assert sorted(counts) == sorted((p, o) for p, o, _ in produced)
    # The batch Spark had (committed, but not yet settled when the query stopped) was released, not kept.
    assert all(counts[r] == 2 for r in first_batch)


def test_commit_mode_a_batch_that_outlives_the_acquisition_lock_keeps_its_records(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = "spark-slow", "spark-slow-group"
    _prepare(broker, topic, group, 1)
    set_group_config(broker.bootstrap, group, share_record_lock_duration_ms="1500")
    produced = produce(broker.bootstrap, topic, 200)
    df = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        # Two batches from one 200-record log batch: the second half must not be acquired (and left to expire
        # unrenewed in the client's buffer) while the first batch is still running.
        .option("maxOffsetsPerTrigger", 100)
        .option("acknowledgeMode", "commit")
        .option("lockRenewIntervalMs", 400)
        .load()
    )
    seen: list[tuple[int, int, int]] = []

    def slow_sink(batch: DataFrame, batch_id: int) -> None:
        rows = batch.select("partition", "offset", "deliveryCount").collect()
        seen.extend((r.partition, r.offset, r.deliveryCount) for r in rows)
        if rows:
            time.sleep(4.5)  # three lock durations: the records stay ours only if their locks are renewed

    query = (
        df.writeStream.foreachBatch(slow_sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((p, o) for p, o, _ in seen) == sorted((p, o) for p, o, _ in produced)
    assert {d for _, _, d in seen} == {1}  # never redelivered
    assert max(p["numInputRows"] for p in query.recentProgress) <= 100
    with Admin(broker.bootstrap) as admin:
        offsets = admin.list_share_group_offsets(group, [topic])
    assert offsets[(topic, 0)].start_offset == len(produced)


def test_a_task_reads_its_ranges_in_fetches_of_max_partition_fetch_bytes(broker: BrokerProcess) -> None:
    """A task's rows are the same whether its ranges take one Fetch each or one Fetch per log batch
    (kafka.max.partition.fetch.bytes=1: the broker still returns the first whole batch), and only the
    offsets of its ranges come out, with their delivery counts."""
    from shoal.client.spark.source import RangeTask, SourceOptions, read_task

    topic = "spark-fetch-size"
    _prepare(broker, topic, "unused", 1)
    produced = produce(broker.bootstrap, topic, 2000, extra={"batch.num.messages": 50})
    value_at = {offset: value for _, offset, value in produced}
    ranges = [(5, 480, 1), (700, 1333, 2), (1500, 1999, 1)]

    def read(fetch_bytes: int) -> tuple[int, list[tuple[int, bytes, int]]]:
        options = SourceOptions.parse({
            "kafka.bootstrap.servers": broker.bootstrap, "group.id": "unused", "subscribe": topic,
            "kafka.max.partition.fetch.bytes": str(fetch_bytes),
        })
        batches = list(read_task(RangeTask([(topic, 0, ranges)]), options))
        rows = [(r["offset"], r["value"], r["deliveryCount"]) for b in batches for r in b.to_pylist()]
        return len(batches), rows

    expected = [(o, value_at[o], count) for first, last, count in ranges for o in range(first, last + 1)]
    fetches_small, small = read(1)
    fetches_big, big = read(64 * 1024 * 1024)
    assert small == expected
    assert big == expected
    assert fetches_big == len(ranges)  # one Arrow batch per fetch
    assert fetches_small > 10 * len(ranges)


def test_ranges_that_follow_on_are_read_as_one_span_keeping_each_ranges_delivery_count(broker: BrokerProcess) -> None:
    """Acquisitions cut a partition into ranges that often follow on from each other: those are fetched as
    one span (a fetch does not stop at each range's edge), and each record still gets the delivery count
    of the range it belongs to."""
    from shoal.client.spark.source import RangeTask, SourceOptions, read_task

    topic = "spark-fetch-spans"
    _prepare(broker, topic, "unused", 1)
    produced = produce(broker.bootstrap, topic, 2000, extra={"batch.num.messages": 50})
    value_at = {offset: value for _, offset, value in produced}
    ranges = [(5, 480, 1), (481, 900, 3), (901, 901, 2), (902, 1200, 1), (1500, 1999, 2)]
    options = SourceOptions.parse({
        "kafka.bootstrap.servers": broker.bootstrap, "group.id": "unused", "subscribe": topic,
        "kafka.max.partition.fetch.bytes": str(64 * 1024 * 1024),
    })
    batches = list(read_task(RangeTask([(topic, 0, ranges)]), options))
    rows = [(r["offset"], r["value"], r["deliveryCount"]) for b in batches for r in b.to_pylist()]
    assert rows == [(o, value_at[o], count) for first, last, count in ranges for o in range(first, last + 1)]
    assert len(batches) == 2  # 5..1200 and 1500..1999: one fetch each


def test_a_task_of_several_partitions_reads_each_in_offset_order(broker: BrokerProcess) -> None:
    """Tasks are cut by bytes, so one task may hold the ranges of several topic-partitions: its rows are
    those of each partition's ranges, a partition's in offset order, with their delivery counts."""
    from shoal.client.spark.source import RangeTask, SourceOptions, read_task

    topic = "spark-task-of-partitions"
    _prepare(broker, topic, "unused", 2)
    produced = produce(broker.bootstrap, topic, 1000, partitions=2)
    value_at = {(p, o): v for p, o, v in produced}
    parts = [(topic, 1, [(10, 99, 3), (200, 249, 1)]), (topic, 0, [(0, 0, 1), (400, 499, 2)])]
    options = SourceOptions.parse({"kafka.bootstrap.servers": broker.bootstrap, "group.id": "unused", "subscribe": topic})
    rows = [(r["partition"], r["offset"], r["value"], r["deliveryCount"])
            for b in read_task(RangeTask(parts), options) for r in b.to_pylist()]
    assert rows == [(p, o, value_at[(p, o)], count)
                    for _, p, ranges in parts for first, last, count in ranges for o in range(first, last + 1)]


def test_records_back_from_the_offset_log_are_accepted_and_dropped(broker: BrokerProcess) -> None:
    """The crash window of checkpoint mode, driven through the reader itself (no Spark needed): a batch is
    in the offset log but its ACCEPT never reached the broker, so its records return to the group. The
    restarted query replays the batch by offset and must not emit those records a second time."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shoal.client.spark.source import KafkaShareStreamReader

    topic, group = "spark-dedup", "spark-dedup-group"
    options = _one_partition_of(broker, topic, group, 100)

    first = KafkaShareStreamReader(options)
    start = first.initialOffset()
    logged = _first_batch(first, start, ReadMaxRows(60))  # Spark would now write this to its offset log...
    assert logged["ranges"] == {topic: {"0": [[0, 59, 1, logged["ranges"][topic]["0"][0][3]]]}}
    first.stop()  # ...and the driver dies before partitions() accepts: the records go back to the group

    restarted = KafkaShareStreamReader(options)
    replay = restarted.partitions(start, logged)  # Spark replays the logged batch by its ranges
    assert [t.parts for t in replay] == [[(topic, 0, [(0, 59, 1)])]]
    following = restarted.latestOffset(logged, ReadMaxRows(100))
    # 0..59 came back (delivery count 2): accepted and dropped. Only the records never logged make the batch.
    assert following["ranges"] == {topic: {"0": [[60, 99, 1, following["ranges"][topic]["0"][0][3]]]}}
    assert "logged" not in following  # the dropped records' ACCEPT is confirmed: nothing left to watch for
    restarted.partitions(logged, following)  # in the offset log now: accepted
    restarted.stop()
    _assert_all_accepted(broker, group, topic, 100)


def test_the_batch_acquired_ahead_keeps_its_locks_while_the_current_batch_runs(broker: BrokerProcess) -> None:
    """Checkpoint mode acquires the next batch as soon as the current one is planned. Those records wait
    for the next trigger however long the current batch runs: their locks are renewed meanwhile, so another
    consumer of the group never gets them, and they are still this query's to accept."""
    from confluent_kafka import ShareConsumer
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shoal.client.spark.source import KafkaShareStreamReader, SourceOptions

    topic, group = "spark-ahead", "spark-ahead-group"
    _prepare(broker, topic, group, 1)
    set_group_config(broker.bootstrap, group, share_record_lock_duration_ms="1000")
    produce(broker.bootstrap, topic, 80)
    options = SourceOptions.parse({
        "kafka.bootstrap.servers": broker.bootstrap, "group.id": group, "subscribe": topic,
        "lockRenewIntervalMs": "250", "journalTopic": "none",  # records wait acquired, not journaled
    })
    reader = KafkaShareStreamReader(options)
    other = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        start = reader.initialOffset()
        first = _first_batch(reader, start, ReadMaxRows(40))
        assert reader.partitions(start, first)  # logged: accepted, and offsets 40..79 are acquired ahead
        # While the "current batch" runs for three lock durations, another member of the group polls.
        other.subscribe([topic])
        taken: list[int] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            taken += [m.offset() for m in other.poll(0.2) if not m.error()]
        assert taken == []
        second = reader.latestOffset(first, ReadMaxRows(40))
        assert second["ranges"] == {topic: {"0": [[40, 79, 1, second["ranges"][topic]["0"][0][3]]]}}
        reader.partitions(first, second)
        assert reader.latestOffset(second, ReadMaxRows(40)) == second  # drained
    finally:
        other.close()
        reader.stop()
    _assert_all_accepted(broker, group, topic, 80)


def _assert_all_accepted(broker: BrokerProcess, group: str, topic: str, records: int) -> None:
    with Admin(broker.bootstrap) as admin:
        offsets = admin.list_share_group_offsets(group, [topic])
    assert offsets[(topic, 0)].start_offset == records and offsets[(topic, 0)].lag == 0


def _offsets_of(offset: dict[str, Any], topic: str) -> list[int]:
    return [o for spans in offset["ranges"][topic].values() for first, last, *_ in spans for o in range(first, last + 1)]


def test_a_journaled_batch_holds_more_than_the_in_flight_limit(broker: BrokerProcess) -> None:
    """From the second batch on, each acquisition round is journaled and then accepted, so one batch can
    hold many times the group's in-flight limit."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shoal.client.spark.source import KafkaShareStreamReader, SourceOptions

    topic, group = "spark-journal-big", "spark-journal-big-group"
    _prepare(broker, topic, group, 1)
    set_group_config(broker.bootstrap, group, share_partition_max_record_locks="100")
    # Small log batches: the in-flight limit is only as fine as the log batches it cuts.
    produce(broker.bootstrap, topic, 1000, extra={"batch.num.messages": 10, "linger.ms": 0})
    options = SourceOptions.parse({"kafka.bootstrap.servers": broker.bootstrap, "group.id": group, "subscribe": topic})
    reader = KafkaShareStreamReader(options)
    try:
        start = reader.initialOffset()
        first = _first_batch(reader, start, ReadMaxRows(1000))
        assert len(_offsets_of(first, topic)) <= 200  # batch 1 waits acquired: at most about the limit
        reader.partitions(start, first)
        second = reader.latestOffset(first, ReadMaxRows(1000))
        assert len(_offsets_of(second, topic)) > 200
        reader.partitions(first, second)
        while (following := reader.latestOffset(second, ReadMaxRows(1000))) != second:
            reader.partitions(second, following)
            second = following
        batches = [first, second] if second is not first else [first]
    finally:
        reader.stop()
    assert sorted(o for b in batches for o in _offsets_of(b, topic)) == list(range(1000))
    _assert_all_accepted(broker, group, topic, 1000)


def test_a_new_query_skips_the_journal_and_the_journal_topic_rolls_small_segments(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing can be journaled under the member id a new query makes up, so only a restarted query reads the
    journal back; and the journal topic rolls small segments, which compaction can then clean."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shoal.client.admin import RESOURCE_TOPIC
    from shoal.client.spark.journal import JOURNAL_SEGMENT_BYTES, AcquisitionJournal
    from shoal.client.spark.source import KafkaShareStreamReader

    topic, group = "spark-journal-new-query", "spark-journal-new-query-group"
    options = _one_partition_of(broker, topic, group, 100)
    reads: list[bytes] = []
    newest = AcquisitionJournal.newest
    monkeypatch.setattr(AcquisitionJournal, "newest", lambda self: reads.append(self.key) or newest(self))

    reader = KafkaShareStreamReader(options)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(40))
    reader.partitions(start, first)
    reader.stop()
    assert reads == []
    restarted = KafkaShareStreamReader(options)
    restarted.latestOffset(first, ReadMaxRows(40))
    restarted.stop()
    assert reads == [f"{group}/{first['member']}".encode()]

    assert options.journal_topic is not None
    with Admin(broker.bootstrap) as admin:
        configs = admin.describe_configs(RESOURCE_TOPIC, options.journal_topic, ["cleanup.policy", "segment.bytes"])
    assert {k: e.value for k, e in configs.entries.items()} == {
        "cleanup.policy": "compact", "segment.bytes": str(JOURNAL_SEGMENT_BYTES),
    }


def test_a_batch_journaled_but_never_logged_is_the_next_batch_after_a_restart(broker: BrokerProcess) -> None:
    """The crash window the journal opens: batch 2 was acquired ahead, journaled and accepted, and the
    driver died before Spark wrote it to the offset log. The restarted query (same member id, from its last
    logged offset) finds batch 2 in the journal and reads exactly those offsets as its next batch."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from shoal.client.spark.journal import AcquisitionJournal, journal_key
    from shoal.client.spark.source import KafkaShareStreamReader, RangeTask

    topic, group = "spark-journal-restart", "spark-journal-restart-group"
    options = _one_partition_of(broker, topic, group, 100)

    first_run = KafkaShareStreamReader(options)
    start = first_run.initialOffset()
    logged = _first_batch(first_run, start, ReadMaxRows(40))  # batch 1: Spark logs it...
    first_run.partitions(start, logged)  # ...plans it, and batch 2 is acquired ahead (journaled, accepted)
    # The crash comes once batch 2 is in the journal; stopping earlier would release its records instead.
    assert options.journal_topic is not None
    journal = AcquisitionJournal(options.bootstrap_servers, options.journal_topic,
                                 journal_key(group, logged["member"]), options.client_config)
    try:
        deadline = time.monotonic() + 30
        while (entry := journal.newest()) is None or entry.seq != 2:
            assert time.monotonic() < deadline, "batch 2 never reached the journal"
            time.sleep(0.05)
    finally:
        journal.close()
    # The journal entry is written before the acceptance goes out: wait for that too (the window this test
    # is about opens only then), or a stop on a loaded machine could still release batch 2's records.
    with Admin(broker.bootstrap) as admin:
        while admin.list_share_group_offsets(group, [topic])[(topic, 0)].start_offset != 80:
            assert time.monotonic() < deadline, "batch 2 was journaled but never accepted"
            time.sleep(0.05)
    first_run.stop()  # the driver dies before batch 2 reaches the offset log

    restarted = KafkaShareStreamReader(options)
    recovered = restarted.latestOffset(logged, ReadMaxRows(40))
    assert recovered["seq"] == 2 and _offsets_of(recovered, topic) == list(range(40, 80))
    tasks = restarted.partitions(logged, recovered)
    rows = [o for t in tasks for rb in restarted.read(t) for o in rb.column("offset").to_pylist()]
    assert all(isinstance(t, RangeTask) for t in tasks) and rows == list(range(40, 80))
    following = restarted.latestOffset(recovered, ReadMaxRows(40))
    assert _offsets_of(following, topic) == list(range(80, 100))  # nothing of 0..79 comes again
    restarted.partitions(recovered, following)
    restarted.stop()
    _assert_all_accepted(broker, group, topic, 100)
