"""The kafka-share Spark source against a real broker: completeness, accepted offsets, queue semantics."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from shoal.client.admin import Admin
from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import create_topic, produce, set_group_config

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession


def _prepare(broker: BrokerProcess, topic: str, group: str, partitions: int) -> None:
    create_topic(broker.bootstrap, topic, partitions)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")


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
