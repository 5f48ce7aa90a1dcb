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

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shoal.client.spark.options import SparkOptionError, check_connection_config, check_known, client_options
from shoal.client.spark.worker_heap import freeze_long_lived

if TYPE_CHECKING:
    import pyarrow as pa

    from shoal.client.producer import Producer

# `kafka.<name>` options that are producer settings rather than connection settings.
_PRODUCER_KWARGS: dict[str, tuple[str, type]] = {
    "acks": ("acks", str),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("batch_size", int),
    "compression.type": ("compression", str),
    "delivery.timeout.ms": ("delivery_timeout_ms", int),
    "max.request.size": ("max_request_size", int),
}
# Spark hands a sink all writer options, its own (checkpointLocation, queryName, path) among them.
SINK_OPTIONS = ("topic", "checkpointLocation", "queryName", "path")
_PRODUCERS: dict[tuple[Any, ...], Producer] = {}
_PRODUCERS_LOCK = threading.Lock()
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
        check_known(options, SINK_OPTIONS, "kafka-share sink")
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

    def _producer(self) -> Producer:
        # One producer per Python worker and settings: Spark reuses workers across tasks, and connecting
        # (metadata, producer id) costs more than a small task's rows.
        key = (self.bootstrap, tuple(sorted(self.client_config.items())), tuple(sorted(self.producer_kwargs.items())))
        with _PRODUCERS_LOCK:
            producer = _PRODUCERS.get(key)
            if producer is None:
                from shoal.client.producer import Producer

                producer = _PRODUCERS[key] = Producer(self.bootstrap, config=self.client_config, **self.producer_kwargs)
            return producer

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ProducedCommitMessage:
        producer = self._producer()
        futures = []
        try:
            for batch in iterator:
                cols = batch.to_pydict()
                rows = batch.num_rows
                values = [_as_bytes(v) for v in cols["value"]]
                keys = [_as_bytes(k) for k in cols["key"]] if "key" in cols else [None] * rows
                topics = [self.topic] * rows if self.topic is not None else cols["topic"]
                if None in topics:
                    raise SparkOptionError("a row has a null topic and no 'topic' option is set")
                partitions = cols.get("partition") or [None] * rows
                headers = (
                    [[(h["key"], _as_bytes(h["value"])) for h in hs] if hs else None for hs in cols["headers"]]
                    if "headers" in cols
                    else [None] * rows
                )
                # One hand-over to the producer's loop per Arrow batch, not one per row.
                futures.append(producer.send_many(zip(topics, values, keys, headers, partitions, strict=True)))
            producer.flush()
            # Raise the first send failure so the task fails and Spark retries it (at-least-once).
            sent = sum(future.result() for future in futures)
        except BaseException:
            # A producer that failed a task is not trusted with the next one.
            with _PRODUCERS_LOCK:
                for key, cached in list(_PRODUCERS.items()):
                    if cached is producer:
                        del _PRODUCERS[key]
            producer.close()
            raise
        freeze_long_lived()
        return ProducedCommitMessage(records=sent)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every record is already acknowledged by the broker when its task succeeds.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records sent by tasks that did succeed stay in the topic: Kafka has no un-produce, so the batch's
        # replay may write them again (at-least-once, as with Spark's own Kafka sink).
        return None
