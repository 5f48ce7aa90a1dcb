"""The kafka-share Spark source against a real broker: completeness, accepted offsets, queue semantics."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

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


def _prepare(broker: BrokerProcess, topic: str, group: str, partitions: int) -> None:
    create_topic(broker.bootstrap, topic, partitions)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")


def _rows(spark: SparkSession, table: str) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in spark.sql(f"SELECT partition, offset FROM {table}").collect()]


def test_stream_reads_every_record_and_accepts_them(spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "spark-orders", "spark-all"
    _prepare(broker, topic, group, 3)
    produced = produce(broker.bootstrap, topic, 20_000, partitions=3)
    df = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("maxRecordsPerTrigger", 4000)
        .load()
    )
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
    rows = spark.sql("SELECT partition, offset, value, topic, deliveryCount, timestamp FROM all_orders").collect()

    got = sorted((r.partition, r.offset, bytes(r.value)) for r in rows)
    assert got == sorted(produced)  # every record, once
    assert {r.topic for r in rows} == {topic}
    assert {r.deliveryCount for r in rows} == {1}
    assert all(r.timestamp is not None for r in rows)
    # maxRecordsPerTrigger caps each micro-batch.
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 20_000 and max(sizes) <= 4000

    # Every record was ACCEPTed: the share-partition start offset has reached the end of each partition.
    ends = {p: 1 + max(o for pp, o, _ in produced if pp == p) for p in range(3)}
    with Admin(broker.bootstrap) as admin:
        offsets = admin.list_share_group_offsets(group, [topic])
    assert {tp[1]: o.start_offset for tp, o in offsets.items()} == ends
    assert {o.lag for o in offsets.values()} == {0}


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
            .option("maxRecordsPerTrigger", 200)
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


def test_stopping_a_query_releases_what_it_holds(spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
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
        .option("maxRecordsPerTrigger", 100)
        .load()
    )
    # One batch, then an hour's wait: its records stay acquired (settled only when the next batch is planned).
    query = (
        df.writeStream.format("memory")
        .queryName("stop_sink")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 hour")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        while not _rows(spark, "stop_sink"):
            assert query.exception() is None
            assert time.monotonic() < deadline
            time.sleep(0.3)
    finally:
        query.stop()
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


def test_a_batch_that_outlives_the_acquisition_lock_keeps_its_records(
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
        .option("maxRecordsPerTrigger", 100)
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
