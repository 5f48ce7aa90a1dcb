"""Records/s through the kafka-share Spark source versus the bare bundled share consumer, same topic, same run.

One Shoal broker; N records (100-byte values) produced once to a 3-partition topic. Then each reader drains
the whole topic in its own share group:
  * bare client, implicit acknowledgement (each poll accepts the previous one);
  * bare client, explicit acknowledgement (accept every record, commit_sync per poll);
  * Spark (local[2]) reading with format("kafka-share") into the `noop` sink, availableNow trigger.
For Spark we print the wall time (includes the first micro-batch's start-up) and the steady rate over the
batches after the first. A micro-batch can hold no more records than the group may have in flight
(group.share.partition.max.record.locks per partition, 2000 by default), so that setting bounds the Spark
rate through the fixed cost per micro-batch; --max-record-locks sets it on the broker.

Usage: python bench/bench_spark.py [--records 200000] [--per-trigger 50000] [--max-record-locks 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the broker launcher and producer helper live with the integration tests

from tests.integration.broker_process import BrokerProcess  # noqa: E402
from tests.integration.share_clients import create_topic, produce, set_group_config  # noqa: E402

TOPIC = "bench-spark"


def bare(bootstrap: str, group: str, total: int, explicit: bool) -> tuple[float, float]:
    """(seconds from subscribe to the last record, seconds from the first record to the last)."""
    from shoal.client.consumer.share_consumer import ShareConsumer

    mode = "explicit" if explicit else "implicit"
    consumer = ShareConsumer(bootstrap, group, acknowledgement_mode=mode, max_poll_records=5000)
    start = time.perf_counter()
    first: float | None = None
    seen = 0
    try:
        consumer.subscribe([TOPIC])
        while seen < total:
            records = consumer.poll(1.0)
            if records and first is None:
                first = time.perf_counter()
            seen += len(records)
            if explicit and records:
                for record in records:
                    consumer.acknowledge(record, "accept")
                consumer.commit_sync()
        end = time.perf_counter()
    finally:
        consumer.close()
    return end - start, end - (first or start)


def spark_run(bootstrap: str, group: str, total: int, per_trigger: int) -> tuple[float, float, int]:
    """(wall seconds of the query, seconds of the batches after the first, records in those batches)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from shoal.client.spark.source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        with tempfile.TemporaryDirectory() as ckpt:
            df = (
                spark.readStream.format("kafka-share")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("group.id", group)
                .option("subscribe", TOPIC)
                .option("maxRecordsPerTrigger", per_trigger)
                .load()
            )
            start = time.perf_counter()
            query = (
                df.writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True).start()
            )
            query.awaitTermination()
            wall = time.perf_counter() - start
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            rows = sum(p["numInputRows"] for p in progress)
            if rows != total:
                raise RuntimeError(f"Spark read {rows} records, expected {total}")
            later = progress[1:]
            steady_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
            return wall, steady_s, sum(p["numInputRows"] for p in later)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=50_000)
    parser.add_argument("--max-record-locks", type=int, default=2000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "group.share.heartbeat.interval.ms=1000",
            f"group.share.partition.max.record.locks={args.max_record_locks}",
        ]
        broker = BrokerProcess(Path(tmp) / "data", overrides=overrides).start()
        try:
            create_topic(broker.bootstrap, TOPIC, 3)
            pad = "x" * max(0, args.value_bytes - 8)
            produce(broker.bootstrap, TOPIC, args.records, partitions=3, prefix=pad)
            groups = {"bare-implicit": "bench-bare-i", "bare-explicit": "bench-bare-e", "spark": "bench-spark"}
            for group in groups.values():
                set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
            n = args.records
            print(f"{n} records, {args.value_bytes}-byte values, 3 partitions, one broker on loopback, "
                  f"max.record.locks {args.max_record_locks} per partition")
            for label, explicit in (("bare-implicit", False), ("bare-explicit", True)):
                total_s, steady_s = bare(broker.bootstrap, groups[label], n, explicit)
                print(f"  {label:14s} {n / total_s:>10,.0f} rec/s incl. join ({total_s:.2f} s); "
                      f"{n / steady_s:>10,.0f} rec/s first-to-last record ({steady_s:.2f} s)")
            wall, steady_s, steady_rows = spark_run(broker.bootstrap, groups["spark"], n, args.per_trigger)
            steady = f"{steady_rows / steady_s:>10,.0f} rec/s after the first batch" if steady_s else "one batch only"
            print(f"  {'spark':14s} {n / wall:>10,.0f} rec/s incl. start-up ({wall:.2f} s); {steady} "
                  f"(maxRecordsPerTrigger {args.per_trigger})")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
