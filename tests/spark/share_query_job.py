"""A Spark driver the crash tests run as their own process: kafka-share source -> parquet file sink.

    python share_query_job.py BOOTSTRAP TOPIC GROUP CHECKPOINT OUT_DIR MODE MAX_PER_TRIGGER CONTROL_DIR \
        [once] [upstream=HOST:PORT]

MODE is the source's acknowledgeMode. Rows keep partition, offset and deliveryCount. Tasks pass their rows
through mapInArrow, which, when CONTROL_DIR/hang exists and a batch has committed, stops inside the running
micro-batch (after the batch is in Spark's offset log, before it can commit), leaving CONTROL_DIR/hanging
so the test can kill the driver then. With `once`, the query drains what is available (trigger availableNow) and the job exits.
With `upstream=HOST:PORT`, BOOTSTRAP is a Shoal sidecar and the executors read their ranges from that upstream.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any


def main(argv: list[str]) -> int:
    bootstrap, topic, group, checkpoint, out_dir, mode, per_trigger, control = argv[:8]
    once = "once" in argv[8:]
    upstream = next((arg.split("=", 1)[1] for arg in argv[8:] if arg.startswith("upstream=")), None)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shoal.client.spark.source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"share-query-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    reader = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("acknowledgeMode", mode)
        .option("maxOffsetsPerTrigger", per_trigger)
    )
    if upstream is not None:
        reader = reader.option("upstream.bootstrap.servers", upstream)
    df = reader.load().select("partition", "offset", "deliveryCount")

    def committed_once() -> bool:
        commits = os.path.join(checkpoint, "commits")
        return os.path.isdir(commits) and any(name.isdigit() for name in os.listdir(commits))

    def maybe_hang(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if batch.num_rows and os.path.exists(os.path.join(control, "hang")) and committed_once():
                with open(os.path.join(control, "hanging"), "w") as f:
                    f.write(str(batch.num_rows))
                time.sleep(3600)
            yield batch

    writer = (
        df.mapInArrow(maybe_hang, df.schema)
        .writeStream.format("parquet")
        .option("path", out_dir)
        .option("checkpointLocation", checkpoint)
    )
    if once:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
