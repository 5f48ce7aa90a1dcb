"""`kafka-share`: a PySpark (4.x Python Data Source API) streaming source that reads a Shoal share group.

    import shoal.client.spark                           # registers "kafka-share" in the active session
    # or: spark.dataSource.register(KafkaShareDataSource)
    df = (spark.readStream.format("kafka-share")
          .option("kafka.bootstrap.servers", "broker:9092")
          .option("group.id", "orders-app")
          .option("subscribe", "orders")
          .load())

Rows have Spark's Kafka schema (key, value, topic, partition, offset, timestamp, timestampType, headers)
plus `deliveryCount`. The topic is consumed as a queue: several queries in one share group split it.

Delivery is at-least-once. One share consumer lives in the driver-side process that Spark keeps for the
source. `latestOffset` fetches a batch of records (acquiring them), `partitions` ships them to the
executors inside the tasks, and `read` only turns them into Arrow. A record is ACCEPTed only once Spark has
written the commit-log entry of its micro-batch: Spark calls `latestOffset(start)` for the next batch only
after the batch ending at `start` is committed, so that is where we accept. (`commit(end)` arrives one batch
late and never for the last batch, so it only backs this up.) If the query dies, nothing of the running
batch was accepted; the broker hands those records out again once the consumer's connection drops or their
acquisition lock runs out, and the replayed micro-batch (same offsets, new process) comes out empty, so it
accepts nothing twice. Stopping the query releases what the consumer holds.

Each fetch asks the broker to acquire no more records than the batch still has room for (`poll(max_records=)`
with record-limit acquisition), so nothing sits acquired in the client's buffer where its lock could not be
renewed. The share-group member id is part of every offset (`{"seq": n, "member": id}`): Spark writes the
offset of a batch to the checkpoint before running it, and a query restarted from that checkpoint (even
after its driver was killed) rejoins under the same id before it fetches anything. The coordinator then
hands it the killed incarnation's partitions at once instead of keeping them for the old member until its
session times out. Two queries must therefore never run from one checkpoint (or copies of it) at once.

Options: kafka.bootstrap.servers, group.id (or kafka.group.id), subscribe (comma-separated topics),
maxRecordsPerTrigger (default 50000), maxBytesPerPartition (default 786432: records per Spark task are
capped so the task stays below Spark's 1000 KiB large-task warning), pollTimeoutMs (default 500: how long
a trigger waits for the first record), lockRenewIntervalMs (default 5000; 0 = never renew the locks of
records whose batch is still running), kafka.<client config> (security settings and the like).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from shoal.client.spark.options import (
    SparkOptionError,
    check_connection_config,
    client_options,
    int_option,
    lowered,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from shoal.client.consumer.share_consumer import ShareRecord

log = logging.getLogger("shoal.client.spark.source")

FORMAT_NAME = "kafka-share"
SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, deliveryCount INT"
)
DEFAULT_MAX_RECORDS_PER_TRIGGER = 50_000
DEFAULT_MAX_BYTES_PER_PARTITION = 768 * 1024
DEFAULT_POLL_TIMEOUT_MS = 500
# A third of the shortest acquisition lock a group may set by default (15 s; Kafka's default lock is 30 s).
DEFAULT_LOCK_RENEW_INTERVAL_MS = 5000
# Once records are flowing, further polls in the same trigger only pick up what is already there.
_TOP_UP_POLL_S = 0.05
# Records per ShareFetch; the broker also caps in-flight records per share partition (2000 by default).
_MAX_POLL_RECORDS = 5000
# How long a new consumer's first fetch (or an availableNow query's) waits for an assignment.
_ASSIGNMENT_WAIT_S = 15.0
# Rough per-record cost in a pickled task beyond key/value/headers (ints, list slots).
_RECORD_OVERHEAD_BYTES = 48


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...]
    client_config: dict[str, str] = field(default_factory=dict)
    max_records_per_trigger: int = DEFAULT_MAX_RECORDS_PER_TRIGGER
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    lock_renew_interval_ms: int = DEFAULT_LOCK_RENEW_INTERVAL_MS

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SourceOptions:
        options = lowered(raw)
        conn = client_options(options)
        group = options.get("group.id") or options.get("kafka.group.id")
        if not group:
            raise SparkOptionError("option 'group.id' is required: it names the share group to consume in")
        if "assign" in options or "subscribepattern" in options:
            raise SparkOptionError("share groups subscribe by topic name: use option 'subscribe'")
        if "startingoffsets" in options or "endingoffsets" in options:
            # Where a share group starts is the group's config, shared by all its members.
            raise SparkOptionError(
                "a share group has no per-query offsets; set the group config share.auto.offset.reset instead"
            )
        check_connection_config(conn.client_config)
        topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise SparkOptionError("option 'subscribe' is required (comma-separated topic names)")
        return cls(
            bootstrap_servers=conn.bootstrap_servers,
            group_id=group,
            topics=topics,
            client_config=conn.client_config,
            max_records_per_trigger=int_option(
                options, "maxRecordsPerTrigger", DEFAULT_MAX_RECORDS_PER_TRIGGER
            ),
            max_bytes_per_partition=int_option(
                options, "maxBytesPerPartition", DEFAULT_MAX_BYTES_PER_PARTITION
            ),
            poll_timeout_ms=int_option(options, "pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, minimum=0),
            lock_renew_interval_ms=int_option(
                options, "lockRenewIntervalMs", DEFAULT_LOCK_RENEW_INTERVAL_MS, minimum=0
            ),
        )


class RecordChunk(InputPartition):
    """Records of one share partition for one Spark task, in columns (cheap to pickle, quick to Arrow)."""

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(None)
        self.topic = topic
        self.partition = partition
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]] | None] = []
        self.delivery_counts: list[int] = []

    def add(self, record: ShareRecord) -> None:
        self.offsets.append(record.offset)
        self.timestamps.append(record.timestamp)
        self.timestamp_types.append(record.timestamp_type)
        self.keys.append(record.key)
        self.values.append(record.value)
        self.headers.append(list(record.headers) if record.headers else None)
        self.delivery_counts.append(record.delivery_count)

    def __len__(self) -> int:
        return len(self.offsets)

    def to_arrow(self) -> pa.RecordBatch:
        import pyarrow as pa

        n = len(self.offsets)
        headers = [None if h is None else [{"key": k, "value": v} for k, v in h] for h in self.headers]
        # Kafka uses -1 for "no timestamp"; Spark shows that as null rather than 1969-12-31.
        micros = [ts * 1000 if ts >= 0 else None for ts in self.timestamps]
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(micros, pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_types, pa.int32()),
                pa.array(headers, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
                pa.array(self.delivery_counts, pa.int32()),
            ],
            names=[
                "key",
                "value",
                "topic",
                "partition",
                "offset",
                "timestamp",
                "timestampType",
                "headers",
                "deliveryCount",
            ],
        )


def _record_size(record: ShareRecord) -> int:
    size = _RECORD_OVERHEAD_BYTES + len(record.key or b"") + len(record.value or b"")
    for key, value in record.headers or ():
        size += len(key) + len(value or b"") + 16
    return size


def split_into_chunks(records: Sequence[ShareRecord], max_bytes: int) -> list[RecordChunk]:
    """One or more chunks per share partition, each under `max_bytes` unless a single record is larger."""
    by_partition: dict[tuple[str, int], list[ShareRecord]] = {}
    for record in records:
        by_partition.setdefault((record.topic, record.partition), []).append(record)
    chunks: list[RecordChunk] = []
    for (topic, partition), recs in sorted(by_partition.items()):
        recs.sort(key=lambda r: r.offset)
        chunk, size = RecordChunk(topic, partition), 0
        for record in recs:
            rsize = _record_size(record)
            if len(chunk) and size + rsize > max_bytes:
                chunks.append(chunk)
                chunk, size = RecordChunk(topic, partition), 0
            chunk.add(record)
            size += rsize
        chunks.append(chunk)
    return chunks


@dataclass
class _AcquiredBatch:
    records: list[ShareRecord]
    chunks: list[RecordChunk]


def _exit_on_sigterm() -> None:
    """Spark stops the source process with SIGTERM; by default Python dies at once and the runner's
    `finally: reader.stop()` never runs. As SystemExit it unwinds, so stop() releases what we hold."""
    if threading.current_thread() is not threading.main_thread():
        return

    def _raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _raise_exit)


class _Acquisitions:
    """Driver-side state of one query's source: the share consumer, the batches it acquired and has not
    settled yet (by batch seq), and a thread renewing their acquisition locks while Spark works on them."""

    def __init__(self, options: SourceOptions, member_id: str) -> None:
        from shoal.client.consumer.share_consumer import ShareConsumer

        self.options = options
        self.member_id = member_id
        self.consumer_max_poll_records = min(options.max_records_per_trigger, _MAX_POLL_RECORDS)
        self.consumer = ShareConsumer(
            options.bootstrap_servers,
            options.group_id,
            # Explicit: records stay acquired across polls until we settle them after their batch commits.
            acknowledgement_mode="explicit",
            max_poll_records=self.consumer_max_poll_records,
            fetch_max_wait_ms=options.poll_timeout_ms,
            config=options.client_config,
            member_id=member_id,
        )
        self.pending: dict[int, _AcquiredBatch] = {}
        self.first_fetch = True
        # Spark calls us on one thread; the lock is for the renewal thread.
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._renewer: threading.Thread | None = None
        try:
            self.consumer.subscribe(list(options.topics))
        except BaseException:
            self.consumer.close()
            raise
        if options.lock_renew_interval_ms > 0:
            self._renewer = threading.Thread(target=self._renew_loop, name="kafka-share-renew", daemon=True)
            self._renewer.start()

    def fetch(self, max_rows: int, *, wait_for_assignment: bool) -> list[ShareRecord]:
        """Acquire up to `max_rows` records. Each poll asks the broker for no more than still fit, so no
        record is acquired beyond the batch: one left in the consumer's buffer could not have its lock
        renewed, and handing surplus back would count as a delivery (towards the delivery-count limit)."""
        records: list[ShareRecord] = []
        per_poll = self.consumer_max_poll_records
        timeout = self.options.poll_timeout_ms / 1000
        max_rows = max(1, max_rows)
        # A member still waiting for its first assignment keeps polling (bounded) rather than report "no data".
        assign_by = time.monotonic() + _ASSIGNMENT_WAIT_S if wait_for_assignment else 0.0
        self.first_fetch = False
        with self._lock:
            while len(records) < max_rows:
                got = self.consumer.poll(timeout, max_records=min(per_poll, max_rows - len(records)))
                if not got:
                    if not records and not self.consumer.assignment() and time.monotonic() < assign_by:
                        continue
                    break
                records.extend(got)
                timeout = _TOP_UP_POLL_S
        return records

    def add(self, seq: int, records: list[ShareRecord]) -> None:
        chunks = split_into_chunks(records, self.options.max_bytes_per_partition)
        with self._lock:
            self.pending[seq] = _AcquiredBatch(records, chunks)

    def has(self, seq: int) -> bool:
        with self._lock:
            return seq in self.pending

    def chunks(self, first_seq: int, last_seq: int) -> list[RecordChunk]:
        with self._lock:
            return [c for s in range(first_seq, last_seq + 1) if s in self.pending for c in self.pending[s].chunks]

    def settle(self, through_seq: int, kind: str) -> None:
        """ACCEPT or RELEASE every pending batch up to `through_seq`; repeating it is harmless."""
        with self._lock:
            done = sorted(s for s in self.pending if s <= through_seq)
            if not done:
                return
            count = 0
            for s in done:
                for record in self.pending.pop(s).records:
                    self.consumer.acknowledge(record, kind)
                    count += 1
            failed = {tp: err for tp, err in self.consumer.commit_sync().items() if err is not None}
        if failed:
            # The broker gave the records to someone else (lock expired, member fenced): they will be
            # delivered again, which is a duplicate, not a loss. Nothing here can do better than report it.
            log.warning("could not %s %d records of batch(es) %s: %s", kind, count, done, failed)

    def _renew_loop(self) -> None:
        from shoal.client.errors import UnsupportedVersionError

        # A micro-batch may outlast the acquisition lock (30 s by default); RENEW keeps it ours meanwhile.
        interval = self.options.lock_renew_interval_ms / 1000
        while not self._closing.wait(interval):
            try:
                with self._lock:
                    if not self.pending:
                        continue
                    for batch in self.pending.values():
                        for record in batch.records:
                            self.consumer.acknowledge(record, "renew")
                    failed = {tp: e for tp, e in self.consumer.commit_sync().items() if e is not None}
                if any(isinstance(e, UnsupportedVersionError) for e in failed.values()):
                    log.warning("the broker cannot RENEW acquisition locks; long batches may be redelivered")
                    return
                if failed:
                    log.warning("could not renew acquisition locks: %s", failed)
            except Exception:
                if self._closing.is_set():
                    return
                log.exception("renewing acquisition locks failed")

    def close(self) -> None:
        self._closing.set()
        try:
            if self.pending:
                # Whether the newest batch reached the commit log is unknown here (Spark stops us without
                # saying): releasing risks a duplicate, accepting would risk a loss.
                self.settle(max(self.pending), "release")
        finally:
            with self._lock:
                self.consumer.close()  # closes the share sessions (releasing anything left) and leaves


class KafkaShareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are `{"seq": n, "member": id}`: the n-th batch this query acquired, and the share-group member
    id the query consumes under. They are not replayable Kafka offsets: a share group cannot re-read a batch,
    which is why a replayed batch is empty (see module doc). Checkpoints written before the member id was
    recorded hold only "seq"; such a query starts under a new id and records it from its next batch on."""

    def __init__(self, options: SourceOptions) -> None:
        # Runs in the driver (twice) and the instance is pickled to executors: no I/O, threads or locks here.
        self.options = options
        self._acq: _Acquisitions | None = None
        self._available_now = False
        self._member_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_acq"] = None
        return state

    # ---- driver side ------------------------------------------------------------------------------

    def _member(self) -> str:
        from shoal.client.consumer.share_consumer import new_member_id

        if self._member_id is None:
            self._member_id = new_member_id()
        return self._member_id

    def _acquisitions(self, start: Mapping[str, Any]) -> _Acquisitions:
        if self._acq is None:
            _exit_on_sigterm()
            self._adopt_member(start)
            self._acq = _Acquisitions(self.options, self._member())
        return self._acq

    def _adopt_member(self, start: Mapping[str, Any]) -> None:
        # On a restart `start` is the checkpoint's last offset: its member id wins over one this reader may
        # have made up (in initialOffset) before Spark had read the checkpoint.
        recorded = start.get("member")
        if recorded:
            self._member_id = str(recorded)

    def _offset(self, seq: int) -> dict[str, Any]:
        return {"seq": seq, "member": self._member()}

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_records_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # A queue has no fixed end; "available now" means: stop once a fetch comes back empty.
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        acq = self._acquisitions(start)
        seq = int(start["seq"])
        # Spark asks for batch seq+1 only after the batch ending at `seq` is in its commit log.
        acq.settle(seq, "accept")
        if acq.has(seq + 1):
            # Asked again for the same start: the batch we planned then is still the answer.
            return self._offset(seq + 1)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_records_per_trigger
        # A new consumer's first fetch waits for its assignment: otherwise the query's first trigger is
        # empty (and under availableNow, an empty trigger ends the query).
        records = acq.fetch(max_rows, wait_for_assignment=self._available_now or acq.first_fetch)
        if not records:
            return start
        acq.add(seq + 1, records)
        return self._offset(seq + 1)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # May be called more than once per batch: read the buffer, never pop from it. A batch that is not
        # buffered is a replay after a restart; its records were never accepted and come back by themselves.
        if self._acq is None:
            return []
        return self._acq.chunks(int(start["seq"]) + 1, int(end["seq"]))

    def commit(self, end: dict[str, Any]) -> None:
        # Normally a no-op: latestOffset accepted this batch already.
        if self._acq is not None:
            self._acq.settle(int(end["seq"]), "accept")

    def stop(self) -> None:
        acq, self._acq = self._acq, None
        if acq is not None:
            acq.close()

    # ---- executor side ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RecordChunk)
        if len(partition):
            yield partition.to_arrow()


class KafkaShareDataSource(DataSource):
    """`spark.readStream.format("kafka-share")` and `df.writeStream.format("kafka-share")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaShareStreamReader(SourceOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from shoal.client.spark.sink import KafkaShareStreamWriter

        return KafkaShareStreamWriter(lowered(self.options), schema)


def register(spark: SparkSession) -> None:
    """Make `format("kafka-share")` available in `spark` (registration is per session)."""
    spark.dataSource.register(KafkaShareDataSource)


def _register_in_active_session() -> None:
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
    except Exception:  # no JVM yet, or an executor process: nothing to register with
        return
    if active is not None:
        register(active)


_register_in_active_session()
