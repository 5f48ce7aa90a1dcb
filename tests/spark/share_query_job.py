"""A Spark driver the crash test runs as its own process: kafka-share source -> one JSON file per batch.

    python share_query_job.py BOOTSTRAP TOPIC GROUP CHECKPOINT OUT_DIR RUN_NAME MAX_PER_TRIGGER [HANG_AT]

Each micro-batch's rows, as [partition, offset, deliveryCount], go to OUT_DIR/RUN_NAME-batch-<id>.json,
written whole and then renamed, so a reader never sees half a file. With HANG_AT, the sink stops inside
batch HANG_AT (after writing its rows, before Spark can commit it) and leaves RUN_NAME-hanging.json, so
the test can kill the driver while that batch is in flight.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    bootstrap, topic, group, checkpoint, out_dir, run_name, per_trigger = argv[:7]
    hang_at = int(argv[7]) if len(argv) > 7 else -1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shoal.client.spark.source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"share-query-{run_name}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = (
        spark.readStream.format("kafka-share")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("maxRecordsPerTrigger", per_trigger)
        .load()
    )

    def write_batch(batch: Any, batch_id: int) -> None:
        rows = [[r.partition, r.offset, r.deliveryCount] for r in batch.select("partition", "offset", "deliveryCount").collect()]
        final = os.path.join(out_dir, f"{run_name}-batch-{batch_id}.json")
        with open(final + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(final + ".tmp", final)
        if batch_id == hang_at:
            with open(os.path.join(out_dir, f"{run_name}-hanging.json"), "w") as f:
                json.dump({"batch": batch_id, "rows": len(rows)}, f)
            time.sleep(3600)

    query = df.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint).start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
