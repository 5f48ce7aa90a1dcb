"""The kafka-share Spark source and sink against bare clients, one broker, one topic, one run.

N records (100-byte values) are produced once to a 3-partition topic. Then, each in its own share group:
  * a bare confluent-kafka ShareConsumer drains the topic (the reference reader) three times before Spark
    starts, and once right before each measured kafka-share query;
  * Spark (local[2]) drains it with format("kafka-share") into the noop sink and into the parquet sink,
    after unreported warm-up queries into both sinks (--warm-up sets how many rounds, 0 for a cold JVM),
    --runs times per configuration
    (availableNow; the steady rate counts the micro-batches after the first, which pays for start-up),
    first with Spark's default checkpoint file manager, then again with the FileSystem-based one: on a
    local checkpoint directory without Hadoop's native library, the default forks `readlink` and `chmod`
    for every offset-log and commit-log file, tens of processes per micro-batch. Each query's ratio is to
    the bare drain just before it, and the median of those ratios counts: the bare rate has moved by 1.7x
    within one run on a shared 2-core machine, and the two sides of a pair see the same stretch of it;
  * Spark alone copies the parquet output to parquet (no Kafka): the parquet sink's share of the cost;
  * a "no-work" Python streaming data source (it slices the same rows out of a memory-mapped Arrow
    file, in micro-batches of the same size, two tasks each) runs into each sink with each checkpoint
    file manager: the most any Python data source reaches there on this machine, against which the
    kafka-share source's rate is also shown;
  * the bundled producer sends the same rows (key, value) from one process (the reference writer), and the
    kafka-share sink writes them from Spark in micro-batches of the same size as the source's, in two
    queries: the steady rate, by the source's rule, counts the micro-batches after each query's first
    (over the sink's addBatch time); the first query's first micro-batch, which starts Spark's Python
    writer and commit processes, is shown on its own;
  * the driver-side source process's peak RSS is sampled while the source drains N and then 10 x N records
    (its own topics, same maxOffsetsPerTrigger): acquisition holds offsets, never payloads, so it should
    not grow with N.

--max-record-locks sets the broker's group.share.partition.max.record.locks (default 10000, the most
Kafka allows; Kafka's default is 2000). Without the acquisition journal (--option journalTopic=none) a
checkpoint-mode micro-batch holds no more than that per partition; with it, the limit only sets how many
records one acquisition round takes.

Usage: python bench/bench_spark.py [--records 300000] [--per-trigger 100000] [--max-record-locks 10000]
                                   [--rss-records 100000] [--runs 3] [--warm-up 8] [--source-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the broker launcher and producer helper live with the integration tests

from tests.integration.broker_process import BrokerProcess  # noqa: E402
from tests.integration.share_clients import create_topic, produce, set_group_config  # noqa: E402

TOPIC = "bench-spark"
# librdkafka queues 100k messages by default; a busy broker falls that far behind a bulk produce.
BIG_QUEUE = {"queue.buffering.max.messages": 10_000_000}
BREAKDOWN = False
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
FS_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
EXTRA_OPTIONS: dict[str, str] = {}
SINK_FILES_PER_TRIGGER = 2


def bare_confluent(bootstrap: str, group: str, total: int) -> float:
    """Records/s of a bare confluent ShareConsumer, from its first record to its last."""
    from confluent_kafka import ShareConsumer

    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.subscribe([TOPIC])
    seen = 0
    first: float | None = None
    try:
        while seen < total:
            got = [m for m in consumer.poll(1.0) if not m.error()]
            if got and first is None:
                first = time.perf_counter()
            seen += len(got)
        return total / (time.perf_counter() - (first or time.perf_counter()))
    finally:
        consumer.close()


class RssSampler:
    """Peak resident set of the driver-side Python process that runs the source (the streaming source
    runner the JVM starts for it), sampled from /proc while a query runs."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    if b"python_streaming_source_runner" not in (entry / "cmdline").read_bytes():
                        continue
                    status = (entry / "status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))


def use_checkpoint_manager(spark: Any, config: str) -> None:
    """The FileSystem-based checkpoint file manager for a "-fs" configuration, Spark's default otherwise."""
    if config.endswith("-fs"):
        spark.conf.set(CHECKPOINT_MANAGER_CONF, FS_CHECKPOINT_MANAGER)
    else:
        spark.conf.unset(CHECKPOINT_MANAGER_CONF)


def label(config: str, sink: str) -> str:
    return f"{sink}{', FS checkpoints' if config.endswith('-fs') else ''}"


def spark_session() -> Any:
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
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_source(spark: Any, bootstrap: str, topic: str, group: str, total: int, sink: str, tmp: str,
                 per_trigger: int) -> tuple[float, float]:
    """(steady records/s after the first micro-batch, wall seconds incl. start-up)."""
    df = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("maxOffsetsPerTrigger", per_trigger)
        .options(**EXTRA_OPTIONS)
        .load()
    )
    start = time.perf_counter()
    query = drain(df, sink, f"{tmp}/ckpt-{group}", f"{tmp}/out-{group}")
    return steady_rate(query, total)[0], time.perf_counter() - start


def drain(df: Any, sink: str, checkpoint: str, out: str) -> Any:
    """Run a streaming DataFrame into `sink` (noop or parquet, the latter at `out`) until it is drained."""
    writer = df.writeStream.format(sink).option("checkpointLocation", checkpoint)
    if sink == "parquet":
        writer = writer.option("path", out)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    return query


def steady_rate(query: Any, total: int, timing: str = "triggerExecution") -> tuple[float, float]:
    """(records/s of a finished availableNow query over its micro-batches after the first, records/s of
    the first, which pays for start-up), timed by durationMs[timing], once it is checked to have read
    `total` records."""
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    if rows != total:
        raise RuntimeError(f"Spark read {rows} records, expected {total}")
    first, later = progress[0], progress[1:] or progress
    if BREAKDOWN:
        for p in progress:
            parts = " ".join(f"{k}={v}" for k, v in sorted(p["durationMs"].items()) if v)
            print(f"    batch {p['batchId']}: {p['numInputRows']} rows  {parts}")
    steady_s = sum(p["durationMs"][timing] for p in later) / 1000
    return sum(p["numInputRows"] for p in later) / steady_s, first["numInputRows"] / (first["durationMs"][timing] / 1000)


def spark_parquet_copy(spark: Any, src: str, dst: str, total: int) -> float:
    """Records/s of Spark alone writing the same rows to parquet (a batch copy of the source's parquet
    output, no Kafka): what Spark's parquet writer allows on this machine. The second of two runs."""
    rate = 0.0
    for run in range(2):
        start = time.perf_counter()
        spark.read.parquet(src).write.mode("overwrite").parquet(f"{dst}-{run}")
        rate = total / (time.perf_counter() - start)
    return rate


def arrow_rows_source() -> type:
    """A streaming Python data source ("bench-arrow-rows") that does no work of its own: each task slices its
    rows out of a memory-mapped Arrow IPC file, and its schema is that file's. Options: path, total, perTrigger."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class RowSlice(InputPartition):
        def __init__(self, first: int, end: int) -> None:
            self.first, self.end = first, end

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, path: str, total: int, per_trigger: int) -> None:
            self.path, self.total, self.per_trigger = path, total, per_trigger

        def initialOffset(self) -> dict[str, int]:
            return {"row": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"row": min(self.total, start["row"] + self.per_trigger)}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[RowSlice]:
            first, last = start["row"], end["row"]
            step = max(1, -(-(last - first) // 2))  # two tasks, as the kafka-share source plans these batches
            return [RowSlice(i, min(last, i + step)) for i in range(first, last, step)]

        def commit(self, end: dict[str, int]) -> None:
            pass

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            assert isinstance(partition, RowSlice)
            table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()
            yield from table.slice(partition.first, partition.end - partition.first).to_batches(10_000)

    class ArrowRows(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-arrow-rows"

        def schema(self) -> Any:
            import pyarrow as pa
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(pa.ipc.open_file(pa.memory_map(self.options["path"])).schema)

        def streamReader(self, schema: Any) -> Reader:
            o = self.options
            return Reader(o["path"], int(o["total"]), int(o["perTrigger"]))

    return ArrowRows


def write_arrow_rows(parquet_dir: str, path: str) -> None:
    """The kafka-share source's parquet output as an Arrow IPC file, typed as the source yields it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_dir)
    utc = pa.timestamp("us", tz="UTC")
    table = table.cast(pa.schema([f.with_type(utc) if f.name == "timestamp" else f for f in table.schema]))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def python_source_floor(spark: Any, path: str, total: int, per_trigger: int, tmp: str, name: str, sink: str) -> float:
    """Steady records/s of the no-work Python source into `sink` (the same steady-rate rule as spark_source)."""
    df = (
        spark.readStream.format("bench-arrow-rows").option("path", path).option("total", total)
        .option("perTrigger", per_trigger).load()
    )
    return steady_rate(drain(df, sink, f"{tmp}/floor-ckpt-{name}", f"{tmp}/floor-out-{name}"), total)[0]


def bundled_producer(bootstrap: str, topic: str, rows: list[tuple[bytes, bytes]]) -> float:
    from shoal.client.producer import Producer

    with Producer(bootstrap) as producer:
        start = time.perf_counter()
        futures = [
            producer.send_many((topic, v, k, None, None) for k, v in rows[i : i + 10_000])
            for i in range(0, len(rows), 10_000)
        ]
        producer.flush()
        sent = sum(f.result() for f in futures)
        elapsed = time.perf_counter() - start
    assert sent == len(rows)
    return len(rows) / elapsed


def sink_input(spark: Any, parquet_dir: str, dst: str, total: int, per_trigger: int) -> None:
    """The rows (key, value) rewritten as SINK_FILES_PER_TRIGGER parquet files per `per_trigger` rows, so
    the sink's query gets micro-batches of the source's size, one task per file (two for local[2])."""
    files = SINK_FILES_PER_TRIGGER * -(-total // per_trigger)
    spark.read.parquet(parquet_dir).select("key", "value").repartition(files).write.parquet(dst)


def spark_sink(spark: Any, bootstrap: str, topic: str, src: str, tmp: str, total: int) -> tuple[float, float]:
    """(records/s of the kafka-share sink in the micro-batches after the first, records/s of the first),
    each over the time Spark spends in the sink (addBatch)."""
    schema = spark.read.parquet(src).schema
    query = (
        spark.readStream.schema(schema).option("maxFilesPerTrigger", SINK_FILES_PER_TRIGGER).parquet(src)
        .writeStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", f"{tmp}/ckpt-sink")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return steady_rate(query, total, "addBatch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--max-record-locks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="queries per Spark configuration (the median counts)")
    parser.add_argument("--per-trigger", type=int, default=100_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--rss-records", type=int, default=100_000, help="N for the RSS check (also 10 x N)")
    parser.add_argument("--source-only", action="store_true", help="only the bare reader and the Spark source")
    parser.add_argument("--breakdown", action="store_true", help="print each micro-batch's durationMs")
    parser.add_argument("--warm-up", type=int, default=8, metavar="ROUNDS",
                        help="unreported queries into noop and parquet before measuring (0: a cold JVM)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra kafka-share source option (repeatable), e.g. minPartitions=4")
    args = parser.parse_args()
    global BREAKDOWN
    BREAKDOWN = args.breakdown
    EXTRA_OPTIONS.update(o.split("=", 1) for o in args.option)

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "group.share.min.heartbeat.interval.ms=1000",
            "group.share.heartbeat.interval.ms=1000",
            f"group.share.max.partition.max.record.locks={max(4000, args.max_record_locks)}",
            f"group.share.partition.max.record.locks={args.max_record_locks}",
        ]
        broker = BrokerProcess(Path(tmp) / "data", overrides=overrides).start()
        try:
            bootstrap, n = broker.bootstrap, args.records
            pad = "x" * max(0, args.value_bytes - 8)
            for topic in (TOPIC, TOPIC + "-out", "rss-1", "rss-10"):
                create_topic(bootstrap, topic, 3)
            produce(bootstrap, TOPIC, n, partitions=3, prefix=pad, extra=BIG_QUEUE)
            warm_ups = [(f"warm-up-{i}-{sink}", sink) for i in range(args.warm_up) for sink in ("noop", "parquet")]
            configs = (("noop", "noop"), ("parquet", "parquet"), ("noop-fs", "noop"), ("parquet-fs", "parquet"))
            runs = [(f"{config}-{r}", config, sink) for config, sink in configs for r in range(args.runs)]
            for group in (*(g for g, _ in warm_ups), *(f"bare-{i}" for i in range(3)), *(g for g, _, _ in runs),
                          *(f"bare-{g}" for g, _, _ in runs), "rss-1", "rss-10"):
                set_group_config(bootstrap, group, share_auto_offset_reset="earliest")
            print(f"{n} records, {args.value_bytes}-byte values, 3 partitions, one broker on loopback, local[2], "
                  f"max.record.locks {args.max_record_locks} per partition")

            # Three drains on a machine without Spark, for the record; the ratios pair each query with the
            # drain right before it.
            drains = [bare_confluent(bootstrap, f"bare-{i}", n) for i in range(3)]
            spark = spark_session()
            try:
                # "Steady" means a warm JVM. Measured here (CPU of the JVM's threads by name, noop sink), the
                # JIT compiler threads use more CPU than the task threads through the first few queries of a
                # new JVM (Spark's planning, task deserialization and read/write paths are compiled, then
                # recompiled): 0.9-1.3 CPU-s per query over the first four, about 0.4 from the eighth on,
                # while the tasks use about 0.3. A long-running query pays that once.
                for group, sink in warm_ups:
                    spark_source(spark, bootstrap, TOPIC, group, n, sink, tmp, args.per_trigger)
                steady_by: dict[str, list[float]] = {}
                ratios_by: dict[str, list[float]] = {}
                walls: dict[str, list[float]] = {}
                for group, config, sink in runs:
                    use_checkpoint_manager(spark, config)
                    paired = bare_confluent(bootstrap, f"bare-{group}", n)
                    drains.append(paired)
                    steady, wall = spark_source(spark, bootstrap, TOPIC, group, n, sink, tmp, args.per_trigger)
                    steady_by.setdefault(config, []).append(steady)
                    ratios_by.setdefault(config, []).append(steady / paired)
                    walls.setdefault(config, []).append(wall)
                spark.dataSource.register(arrow_rows_source())
                arrow_path = f"{tmp}/rows.arrow"
                write_arrow_rows(f"{tmp}/out-parquet-0", arrow_path)
                floors: dict[str, list[float]] = {}
                for r in range(args.runs):
                    for config, sink in configs:
                        use_checkpoint_manager(spark, config)
                        floors.setdefault(config, []).append(
                            python_source_floor(spark, arrow_path, n, args.per_trigger, tmp, f"{config}-{r}", sink))
                spark.conf.unset(CHECKPOINT_MANAGER_CONF)
                bare = statistics.median(drains)
                print(f"  bare confluent ShareConsumer   {bare:>10,.0f} rec/s (median of {len(drains)} drains; "
                      f"before Spark: {', '.join(f'{d:,.0f}' for d in drains[:3])}; paired with the queries: "
                      f"{', '.join(f'{d:,.0f}' for d in drains[3:])})")
                if warm_ups:
                    print(f"  (Spark: after {len(warm_ups)} unreported warm-up queries of the same records, "
                          f"{args.warm_up} into each sink; each rate the median of {args.runs} queries)")
                rates: dict[str, float] = {}
                for config, sink in configs:
                    steady, wall = statistics.median(steady_by[config]), statistics.median(walls[config])
                    rates[config] = steady
                    each = ", ".join(f"{r:.2f}" for r in ratios_by[config])
                    print(f"  spark source -> {label(config, sink):22s} {steady:>10,.0f} rec/s steady ({n / wall:,.0f} incl. "
                          f"start-up, {wall:.1f} s)   ratio to bare: {statistics.median(ratios_by[config]):.2f} "
                          f"(each query to the drain before it: {each})")
                for config, sink in configs:
                    floor = statistics.median(floors[config])
                    print(f"  no-work source -> {label(config, sink):22s} {floor:>10,.0f} rec/s steady   ratio to the bare median: "
                          f"{floor / bare:.2f}   (kafka-share source at {rates[config] / floor:.2f} of it)")
                copy = spark_parquet_copy(spark, f"{tmp}/out-parquet-0", f"{tmp}/copy", n)
                print(f"  spark parquet copy, no Kafka   {copy:>10,.0f} rec/s   (Spark's parquet writer alone; "
                      f"source -> parquet at {rates['parquet-fs'] / copy:.2f} of it with FS checkpoints, "
                      f"{rates['parquet'] / copy:.2f} without)")
                if args.source_only:
                    return
                rows = [(bytes(r.key), bytes(r.value)) for r in spark.read.parquet(f"{tmp}/out-parquet-0").collect()]
                producer_rate = bundled_producer(bootstrap, TOPIC + "-out", rows)
                print(f"  bundled producer (send_many)   {producer_rate:>10,.0f} rec/s")
                sink_src = f"{tmp}/sink-input"
                sink_input(spark, f"{tmp}/out-parquet-0", sink_src, n, args.per_trigger)
                # Twice: the first query's first micro-batch also starts the Python processes Spark keeps for
                # a Python sink (each compiles pyspark from its zip) and opens the first producer connections.
                for run in ("first", "second"):
                    steady, first = spark_sink(spark, bootstrap, TOPIC + "-out", sink_src, f"{tmp}/{run}", n)
                    print(f"  spark kafka-share sink ({run:6s} query) {steady:>10,.0f} rec/s steady "
                          f"({first:,.0f} in its first micro-batch)   ratio to producer: "
                          f"{steady / producer_rate:.2f} (first micro-batch: {first / producer_rate:.2f})")
                peaks = []
                for topic, count in (("rss-1", args.rss_records), ("rss-10", 10 * args.rss_records)):
                    produce(bootstrap, topic, count, partitions=3, prefix=pad, extra=BIG_QUEUE)
                    with RssSampler() as sampler:
                        spark_source(spark, bootstrap, topic, topic, count, "noop", tmp, args.per_trigger)
                    peaks.append(sampler.peak_kb / 1024)
                    print(f"  driver source process peak RSS at {count:>9,} records: {peaks[-1]:7.1f} MiB")
                print(f"  peak RSS 10xN / N: {peaks[1] / peaks[0]:.2f}")
            finally:
                spark.stop()
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
