"""Example Spark Structured Streaming job: work through the `orders` queue and publish results.

Reads the share group `orders-spark` on topic `orders` with the kafka-share source, turns each order
(a UTF-8 text value such as "widget,3") into a line item with a computed total, and writes it to the
topic `orders-priced` with the kafka-share sink. Run several copies with the same group id and they split
the queue between them.

    python examples/spark_orders_job.py --bootstrap localhost:9092 --checkpoint /tmp/orders-ckpt \
        [--acknowledge-mode checkpoint|commit]

What happens to a copy's unfinished micro-batch when it dies depends on `acknowledgeMode`:
  * checkpoint (default): the batch's orders were accepted as soon as the batch could be replayed: once
    Spark logged it in this copy's checkpoint, or (from the second batch on) once the source wrote it to
    its acquisition journal topic. Only this copy, restarted from that checkpoint, prices them: it replays
    the batch by offset. A copy that never comes back leaves its last batch (and the one it had acquired
    ahead) unpriced. In exchange the locks are free while a batch runs, batches can be larger than the
    group's in-flight limit, and with an idempotent sink (files, a MERGE) the output is exactly-once. The Kafka sink used here is not idempotent: a replayed batch is produced again, so the
    priced topic gets it at least once.
  * commit: orders are accepted only after the sink has the batch. If a copy dies, its unfinished orders
    go back to the queue and any copy prices them, with or without a restart (at least once). Each batch
    holds its records' locks while it runs, so it is capped by the group's in-flight limit
    (share.partition.max.record.locks per partition).

Needs pyspark 4.x with pyarrow, a Java 17+ runtime, and Shoal installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from shoal.client.admin import RESOURCE_GROUP, Admin, NewTopic
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

UNIT_PRICES = {"widget": 2.50, "gadget": 10.00, "gizmo": 7.25}


def ensure_topics(bootstrap: str, source: str, sink: str, group: str, partitions: int) -> None:
    """Create the topics if missing and let the share group start at the earliest offset (Kafka's default
    for a new share group is `latest`, which would skip orders produced before the job first ran)."""
    with Admin(bootstrap) as admin:
        for result in admin.create_topics([NewTopic(source, partitions), NewTopic(sink, partitions)]).values():
            if result.error is not None and result.error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise result.error
        error = admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"})
        if error is not None:
            raise error


def price_orders(orders: DataFrame) -> DataFrame:
    """value "item,quantity" -> value "item,quantity,total"; unknown items or bad lines get total -1."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    item = F.split(text, ",").getItem(0)
    qty = F.split(text, ",").getItem(1).cast("int")
    price = F.coalesce(
        *[F.when(item == name, F.lit(p)) for name, p in UNIT_PRICES.items()], F.lit(None).cast("double")
    )
    total = F.coalesce(F.round(price * qty, 2), F.lit(-1.0))
    return orders.select(
        F.col("key"),
        F.concat_ws(",", item, qty.cast("string"), total.cast("string")).cast("binary").alias("value"),
        # Keep where the order came from, as a header, for tracing.
        F.array(
            F.struct(F.lit("source").alias("key"), F.format_string("%s-%d@%d", "topic", "partition", "offset")
                     .cast("binary").alias("value"))
        ).alias("headers"),
    )


def build_query(
    spark: SparkSession,
    *,
    bootstrap: str,
    source: str,
    sink: str,
    group: str,
    checkpoint: str,
    available_now: bool = False,
    max_offsets_per_trigger: int = 10_000,
    acknowledge_mode: str = "checkpoint",
) -> StreamingQuery:
    from shoal.client.spark.source import register

    register(spark)
    orders = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", group)
        .option("subscribe", source)
        .option("maxOffsetsPerTrigger", max_offsets_per_trigger)
        .option("acknowledgeMode", acknowledge_mode)
        .load()
    )
    writer = (
        price_orders(orders)
        .writeStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .queryName(f"price-{source}")
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="1 second")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=os.environ.get("SHOAL_BOOTSTRAP", "localhost:9092"))
    parser.add_argument("--source", default="orders")
    parser.add_argument("--sink", default="orders-priced")
    parser.add_argument("--group", default="orders-spark")
    parser.add_argument("--partitions", type=int, default=3, help="for topics the job creates")
    parser.add_argument("--checkpoint", default=os.environ.get("CHECKPOINT_DIR", "/tmp/orders-spark-checkpoint"))
    parser.add_argument("--available-now", action="store_true", help="drain the queue, then exit")
    parser.add_argument("--acknowledge-mode", choices=("checkpoint", "commit"), default="checkpoint")
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    args = parser.parse_args(argv)

    # Spark's Python workers must run this interpreter (it has Shoal and pyarrow installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    ensure_topics(args.bootstrap, args.source, args.sink, args.group, args.partitions)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("shoal-orders-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    query = build_query(
        spark,
        bootstrap=args.bootstrap,
        source=args.source,
        sink=args.sink,
        group=args.group,
        checkpoint=args.checkpoint,
        available_now=args.available_now,
        acknowledge_mode=args.acknowledge_mode,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
