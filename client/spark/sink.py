"""Spark streaming sink that writes a DataFrame to a Shoal (Kafka) topic with the bundled producer.

    df.writeStream.format("kafka-share")
        .option("kafka.bootstrap.servers", "broker:9092")
        .option("topic", "results")            # or give each row a `topic` column
        .option("checkpointLocation", "/ckpt")
        .start()

Input columns, as for Spark's Kafka sink: `value` (binary or string, required), and optionally `key`
(binary or string), `topic` (string), `partition` (int), `headers` (array<struct<key: string, value: binary>>).
Delivery is at-least-once: each task sends its rows and waits for every acknowledgement before reporting
success, so a failed or retried task can only produce a record twice, never drop it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shoal.client.spark.options import SparkOptionError, check_connection_config, client_options

if TYPE_CHECKING:
    import pyarrow as pa

# `kafka.<name>` options that are producer settings rather than connection settings.
_PRODUCER_KWARGS: dict[str, tuple[str, type]] = {
    "acks": ("acks", str),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("batch_size", int),
    "compression.type": ("compression", str),
    "delivery.timeout.ms": ("delivery_timeout_ms", int),
    "max.request.size": ("max_request_size", int),
}
_ALLOWED_COLUMNS = {"key", "value", "topic", "partition", "headers"}


@dataclass
class ProducedCommitMessage(WriterCommitMessage):
    records: int


def _as_bytes(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode()


class KafkaShareStreamWriter(DataSourceStreamArrowWriter):
    """Created on the driver, pickled to executors; the producer is made inside `write` on the executor."""

    def __init__(self, options: Mapping[str, str], schema: StructType):
        conn = client_options(options)
        self.bootstrap = conn.bootstrap_servers
        self.client_config: dict[str, str] = {}
        self.producer_kwargs: dict[str, Any] = {}
        for key, value in conn.client_config.items():
            if key in _PRODUCER_KWARGS:
                name, kind = _PRODUCER_KWARGS[key]
                self.producer_kwargs[name] = kind(value)
            else:
                self.client_config[key] = value
        if "enable.idempotence" in self.client_config:
            self.producer_kwargs["enable_idempotence"] = self.client_config.pop("enable.idempotence") == "true"
        check_connection_config(self.client_config)
        self.topic = options.get("topic")
        names = set(schema.fieldNames())
        # Fail at start() rather than in the first task: these are user errors, not transient ones.
        if "value" not in names:
            raise SparkOptionError("the kafka-share sink needs a 'value' column")
        if self.topic is None and "topic" not in names:
            raise SparkOptionError("the kafka-share sink needs option 'topic' or a 'topic' column")
        unknown = names - _ALLOWED_COLUMNS
        if unknown:
            raise SparkOptionError(f"the kafka-share sink does not know columns {sorted(unknown)}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ProducedCommitMessage:
        from shoal.client.producer import Producer

        producer = Producer(self.bootstrap, config=self.client_config, **self.producer_kwargs)
        futures = []
        try:
            for batch in iterator:
                cols = batch.to_pydict()
                rows = batch.num_rows
                values = cols["value"]
                keys = cols.get("key") or [None] * rows
                topics = [self.topic] * rows if self.topic is not None else cols["topic"]
                partitions = cols.get("partition") or [None] * rows
                headers = cols.get("headers") or [None] * rows
                for i in range(rows):
                    topic = topics[i]
                    if topic is None:
                        raise SparkOptionError("a row has a null topic and no 'topic' option is set")
                    hdrs = [(h["key"], _as_bytes(h["value"])) for h in headers[i]] if headers[i] else None
                    futures.append(
                        producer.send(
                            topic,
                            _as_bytes(values[i]),
                            key=_as_bytes(keys[i]),
                            headers=hdrs,
                            partition=partitions[i],
                        )
                    )
            producer.flush()
            # Raise the first send failure so the task fails and Spark retries it (at-least-once).
            for future in futures:
                future.result()
        finally:
            producer.close()
        return ProducedCommitMessage(records=len(futures))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every record is already acknowledged by the broker when its task succeeds.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records sent by tasks that did succeed stay in the topic: Kafka has no un-produce, so the batch's
        # replay may write them again (at-least-once, as with Spark's own Kafka sink).
        return None
