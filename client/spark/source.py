"""`kafka-share`: a PySpark (4.x Python Data Source API) streaming source that reads a Shoal share group.

    import shoal.client.spark.source                    # registers "kafka-share" in the active session
    # or: spark.dataSource.register(KafkaShareDataSource)
    df = (spark.readStream.format("kafka-share")
          .option("kafka.bootstrap.servers", "broker:9092")
          .option("group.id", "orders-app")
          .option("subscribe", "orders")
          .load())

Rows have Spark's Kafka schema (key, value, topic, partition, offset, timestamp, timestampType, and
`headers` when includeHeaders is true) plus `deliveryCount`. The topic is consumed as a queue: several
queries in one share group split it.

How a micro-batch is made. One share consumer lives in the driver-side process Spark keeps for the
source. `latestOffset` acquires records with ShareFetch, reading only batch headers, never payloads, and
returns an end offset that lists exactly what it acquired: per topic-partition, the offset ranges and
their delivery counts. `partitions` cuts those ranges into tasks by bytes (maxBytesPerPartition and
minPartitions), not one per topic-partition: a task holds offset ranges, never records, possibly of
several partitions, each partition's in offset order. Each task reads its ranges from the partition
leaders with a plain Fetch, keeping only those offsets (other consumers of the group own the rest of the
partition), and decodes them on the executor straight into Arrow columns (record_columns), one Arrow
batch per fetch, with the next fetch under way meanwhile.

When records are accepted (`acknowledgeMode`):
  * `checkpoint` (default): once the batch is replayable. Batch 1 is accepted as soon as its end offset is
    in Spark's offset log: Spark writes it before it plans the batch, so `partitions(start, end)` is the
    first call that proves it. From batch 2 on, the acquisition journal (journal.py; option journalTopic)
    makes each acquisition round durable first and then accepts it, so a batch is not capped by the
    group's in-flight limit (`share.partition.max.record.locks` per partition); a batch journaled but not
    in the offset log when the driver died is the restarted query's next batch. With journalTopic=none,
    every batch is accepted from `partitions` (in the background) and holds at most the in-flight limit.
    Either way the driver acquires the next batch while the current one runs, so `latestOffset` usually
    finds it ready (locks still held then are renewed, lockRenewIntervalMs). A batch Spark replays after a
    crash (in the offset log, not in the commit log) is read again by offset and gives the same rows, so
    with an idempotent sink (the file sink, for one) the query is exactly-once across driver crashes. If the
    driver dies between making a batch replayable and its ACCEPT, the records return to the group; those
    that come back to this query are checked against the ranges it logged, accepted and dropped. (Any that
    go to another member of the group are processed there too.) A range that retention or DeleteRecords
    removed before a replay could read it fails the query (failOnDataLoss=true, the default) or is skipped
    with a warning.
  * `commit`: after the batch is in Spark's commit log, i.e. after the sink has it: Spark asks for the next
    batch's end (`latestOffset`) only then, so that is where the accept goes. Records of a batch that never
    commits (crash, failure, stop) go back to the group for any consumer; a replayed batch is empty.
    At-least-once, and the batch's locks are held (and renewed) while it runs.

The share-group member id is part of every offset: a query restarted from its checkpoint rejoins under
the same id and at once gets the partitions its killed incarnation had. Never run two queries from one
checkpoint (or copies of it) at once.

Options (Spark's Kafka names where they mean the same): kafka.bootstrap.servers; group.id (or
kafka.group.id); subscribe (comma-separated topics); acknowledgeMode (checkpoint | commit);
maxOffsetsPerTrigger (records per micro-batch; default: up to 1,000,000, or what the group lets one
consumer hold in flight without the journal);
maxBytesPerPartition (bytes per task, default 8 MiB); minPartitions (tasks per batch, at least);
kafkaConsumer.pollTimeoutMs (how long a trigger waits for the first record, default 500); failOnDataLoss
(default true); includeHeaders (default false); lockRenewIntervalMs (how often held records' locks are
renewed: a running batch's in commit mode, the next batch's while it waits in checkpoint mode; default 5000;
0 = never renew); journalTopic (checkpoint mode: the compacted topic of the acquisition journal, created
if missing, default kafka-share-journal; none = no journal); kafka.max.partition.fetch.bytes (the most a
task's Fetch asks of one partition at a time, default 1 MiB as in Kafka's consumer); kafka.<client config>
(security settings and the like); upstream.bootstrap.servers and upstream.<client config> (when
kafka.bootstrap.servers is a Shoal sidecar: executors read their ranges straight from these upstream
brokers, so record bytes never pass through the sidecar; the driver still acquires through it). Any
other option is an error.
"""

from __future__ import annotations

import concurrent.futures
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from shoal.client.fetch_defaults import MAX_PARTITION_FETCH_BYTES
from shoal.client.spark.journal import (
    DEFAULT_JOURNAL_TOPIC,
    DISABLED,
    AcquisitionJournal,
    JournaledBatch,
    journal_key,
)
from shoal.client.spark.options import (
    UPSTREAM_PREFIX,
    ClientOptions,
    SparkOptionError,
    bool_option,
    check_connection_config,
    check_known,
    choice_option,
    client_options,
    int_option,
    lowered,
    upstream_options,
)
from shoal.client.spark.ranges import (
    BatchRanges,
    OffsetRange,
    OffsetSet,
    plan_tasks,
    ranges_from_json,
    ranges_to_json,
)
from shoal.client.spark.worker_heap import freeze_long_lived

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from shoal.client.admin import Admin
    from shoal.client.consumer.offset_reader import OffsetReader
    from shoal.client.consumer.share_consumer import AcquiredRange

log = logging.getLogger("shoal.client.spark.source")

FORMAT_NAME = "kafka-share"
CHECKPOINT, COMMIT = "checkpoint", "commit"
_COLUMNS = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, timestampType INT"
)
_HEADERS_COLUMN = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
DEFAULT_MAX_BYTES_PER_PARTITION = 8 * 1024 * 1024
DEFAULT_POLL_TIMEOUT_MS = 500
_FETCH_BYTES_KEY = "max.partition.fetch.bytes"
# A third of the shortest acquisition lock a group may set by default (15 s; Kafka's default lock is 30 s).
DEFAULT_LOCK_RENEW_INTERVAL_MS = 5000
# Without maxOffsetsPerTrigger a trigger takes what the group lets it hold, up to this many records.
_UNLIMITED_TRIGGER_CAP = 1_000_000
# Once records are flowing, further polls in the same trigger only pick up what is already there.
_TOP_UP_POLL_S = 0.05
# How long a new consumer's first fetch (or an availableNow query's) waits for an assignment.
_ASSIGNMENT_WAIT_S = 15.0
# How often the driver asks the group which logged-but-unconfirmed offsets it has settled for good.
_PRUNE_INTERVAL_S = 10.0

SOURCE_OPTIONS = (
    "subscribe",
    "group.id",
    "acknowledgeMode",
    "maxOffsetsPerTrigger",
    "maxRecordsPerTrigger",  # this source's earlier name for maxOffsetsPerTrigger
    "maxBytesPerPartition",
    "minPartitions",
    "kafkaConsumer.pollTimeoutMs",
    "pollTimeoutMs",  # earlier name for kafkaConsumer.pollTimeoutMs
    "failOnDataLoss",
    "includeHeaders",
    "lockRenewIntervalMs",
    "journalTopic",
    # Spark Kafka options that a share group cannot honour; each gets its own explanation.
    "assign",
    "subscribePattern",
    "startingOffsets",
    "endingOffsets",
)


def _first_int(options: Mapping[str, str], names: tuple[str, ...], default: int, *, minimum: int = 1) -> int:
    for name in names:
        if options.get(name.lower()) not in (None, ""):
            return int_option(options, name, default, minimum=minimum)
    return default


def _journal_topic(options: Mapping[str, str]) -> str | None:
    topic = options.get("journaltopic", DEFAULT_JOURNAL_TOPIC).strip()
    if topic.lower() == DISABLED:
        return None
    if not topic:
        raise SparkOptionError(f"option 'journalTopic' names a topic, or is '{DISABLED}'")
    return topic


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...]
    client_config: dict[str, str] = field(default_factory=dict)
    acknowledge_mode: str = CHECKPOINT
    max_offsets_per_trigger: int | None = None
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    max_partition_fetch_bytes: int = MAX_PARTITION_FETCH_BYTES
    min_partitions: int = 1
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    fail_on_data_loss: bool = True
    include_headers: bool = False
    lock_renew_interval_ms: int = DEFAULT_LOCK_RENEW_INTERVAL_MS
    journal_topic: str | None = DEFAULT_JOURNAL_TOPIC
    # Sidecar mode: the cluster behind the Shoal sidecar, which executors read their ranges from.
    upstream: ClientOptions | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SourceOptions:
        options = lowered(raw)
        check_known(options, SOURCE_OPTIONS, "kafka-share source", ("kafka.", UPSTREAM_PREFIX))
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
        # A consumer setting, not a connection one: it sizes the executors' Fetch requests.
        conn.client_config.pop(_FETCH_BYTES_KEY, None)
        check_connection_config(conn.client_config)
        topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise SparkOptionError("option 'subscribe' is required (comma-separated topic names)")
        per_trigger = _first_int(options, ("maxOffsetsPerTrigger", "maxRecordsPerTrigger"), 0)
        return cls(
            bootstrap_servers=conn.bootstrap_servers,
            group_id=group,
            topics=topics,
            client_config=conn.client_config,
            acknowledge_mode=choice_option(options, "acknowledgeMode", (CHECKPOINT, COMMIT)),
            max_offsets_per_trigger=per_trigger or None,
            max_bytes_per_partition=int_option(options, "maxBytesPerPartition", DEFAULT_MAX_BYTES_PER_PARTITION),
            max_partition_fetch_bytes=int_option(
                options, f"kafka.{_FETCH_BYTES_KEY}", MAX_PARTITION_FETCH_BYTES
            ),
            min_partitions=int_option(options, "minPartitions", 1),
            poll_timeout_ms=_first_int(
                options, ("kafkaConsumer.pollTimeoutMs", "pollTimeoutMs"), DEFAULT_POLL_TIMEOUT_MS, minimum=0
            ),
            fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
            include_headers=bool_option(options, "includeHeaders", False),
            lock_renew_interval_ms=int_option(
                options, "lockRenewIntervalMs", DEFAULT_LOCK_RENEW_INTERVAL_MS, minimum=0
            ),
            journal_topic=_journal_topic(options),
            upstream=upstream_options(options),
        )

    def reads_from(self) -> ClientOptions:
        """Where executors read their ranges: the upstream brokers behind a sidecar when the source names
        them (record bytes then never pass through Shoal), else the brokers the driver acquires from."""
        return self.upstream or ClientOptions(self.bootstrap_servers, self.client_config)

    def schema(self) -> str:
        columns = [_COLUMNS]
        if self.include_headers:
            columns.append(_HEADERS_COLUMN)
        columns.append("deliveryCount INT")
        return ", ".join(columns)


class DataLossError(RuntimeError):
    """Offsets a micro-batch must read are gone from the log (retention or DeleteRecords)."""


def report_lost(topic: str, partition: int, first: int, last: int, *, fail: bool) -> None:
    what = f"{topic}-{partition} offsets {first}..{last}"
    if fail:
        raise DataLossError(
            f"{what} of this micro-batch were removed from the log (retention or DeleteRecords) before they "
            "could be read; set failOnDataLoss=false to skip them"
        )
    log.warning("skipping %s: removed from the log before this micro-batch could read them", what)


class RangeTask(InputPartition):
    """One Spark task: per topic-partition, offset ranges in order, as (first, last, delivery count)."""

    def __init__(self, parts: Sequence[tuple[str, int, Sequence[tuple[int, int, int]]]]) -> None:
        super().__init__(None)
        self.parts = [(topic, partition, list(ranges)) for topic, partition, ranges in parts]


# Offset readers of this Python worker, by connection settings: Spark reuses workers across tasks.
_READERS: dict[tuple[str, tuple[tuple[str, str], ...], int], OffsetReader] = {}
_READERS_LOCK = threading.Lock()


def _offset_reader(options: SourceOptions) -> OffsetReader:
    from shoal.client.consumer.offset_reader import OffsetReader

    source, fetch_bytes = options.reads_from(), options.max_partition_fetch_bytes
    bootstrap, config = source.bootstrap_servers, source.client_config
    key = (bootstrap, tuple(sorted(config.items())), fetch_bytes)
    with _READERS_LOCK:
        reader = _READERS.get(key)
        if reader is None:
            reader = _READERS[key] = OffsetReader(bootstrap, config=config, partition_max_bytes=fetch_bytes)
        return reader


def read_task(task: RangeTask, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """The rows of a task's ranges, read by offset (executor side), one topic-partition after another."""
    for topic, partition, ranges in task.parts:
        yield from _read_partition(topic, partition, ranges, options)


@dataclass(frozen=True)
class _Span:
    """A task's ranges of one partition that follow on without a gap, read as one: a fetch then stops only
    where the broker's size limit stops it, not at each acquisition's edge, which would leave a short fetch
    behind at every edge. `ends[i]` is the last offset of the i-th stretch of one delivery count and
    `counts[i]` that count, so a record's count is one search away."""

    first: int
    ends: np.ndarray[Any, np.dtype[np.int64]]
    counts: np.ndarray[Any, np.dtype[np.int32]]

    @property
    def last(self) -> int:
        return int(self.ends[-1])

    def delivery_counts(self, offsets: np.ndarray[Any, np.dtype[np.int64]]) -> pa.Array:
        import numpy as np
        import pyarrow as pa

        if len(self.counts) == 1:
            return pa.repeat(pa.scalar(int(self.counts[0]), pa.int32()), len(offsets))
        return pa.array(self.counts[np.searchsorted(self.ends, offsets)], pa.int32())


def _read_spans(ranges: Sequence[tuple[int, int, int]]) -> list[_Span]:
    """The spans of a partition's ranges (first, last, delivery count), given in offset order."""
    import numpy as np

    runs: list[tuple[int, list[int], list[int]]] = []  # first offset, stretch ends, their counts
    for first, last, count in ranges:
        if runs and runs[-1][1][-1] + 1 == first:
            _, ends, counts = runs[-1]
            if counts[-1] == count:
                ends[-1] = last
            else:
                ends.append(last)
                counts.append(count)
        else:
            runs.append((first, [last], [count]))
    return [_Span(first, np.array(ends, np.int64), np.array(counts, np.int32)) for first, ends, counts in runs]


def _read_partition(
    topic: str, partition: int, ranges: Sequence[tuple[int, int, int]], options: SourceOptions
) -> Iterator[pa.RecordBatch]:
    """One Arrow batch per fetch, decoded column by column (see record_columns) while the next fetch is
    under way."""
    import numpy as np
    import pyarrow as pa

    from shoal.client.spark.record_columns import decode_columns, record_sections

    reader = _offset_reader(options)
    spans = _read_spans(ranges)
    for index, step in reader.read_ranges(topic, partition, [(span.first, span.last) for span in spans]):
        for lo, hi in step.lost:
            report_lost(topic, partition, lo, hi, fail=options.fail_on_data_loss)
        if not step.batches:
            continue
        span = spans[index]
        data, sections = record_sections(step.data, step.batches)
        cols = decode_columns(data, sections, step.first, span.last)
        n = len(cols)
        if not n:
            continue
        ts_types = np.fromiter((h.timestamp_type for h, _, _ in sections), np.int32, len(sections))
        arrays = [
            cols.keys,
            cols.values,
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(cols.offsets, pa.int64()),
            # Kafka uses -1 for "no timestamp"; Spark shows that as null rather than 1969-12-31.
            pa.array(cols.timestamps * 1000, pa.timestamp("us", tz="UTC"), mask=cols.timestamps < 0),
            pa.array(ts_types[cols.batch_index], pa.int32()),
        ]
        if options.include_headers:
            arrays.append(_headers_column(step.data, step.batches, cols.batch_index, cols.record_index))
        arrays.append(span.delivery_counts(cols.offsets))
        yield pa.RecordBatch.from_arrays(arrays, names=_column_names(options))


def _column_names(options: SourceOptions) -> list[str]:
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if options.include_headers:
        names.append("headers")
    return [*names, "deliveryCount"]


def _headers_column(data: Any, batches: Sequence[tuple[Any, int]], batch_index: Any, record_index: Any) -> pa.Array:
    """Record headers of the kept records, through the reference decoder (only when includeHeaders)."""
    import pyarrow as pa

    from shoal.protocol.records import decode_records

    decoded: dict[int, list[Any]] = {}
    rows: list[list[dict[str, Any]] | None] = []
    for b, r in zip(batch_index.tolist(), record_index.tolist(), strict=True):
        if b not in decoded:
            header, at = batches[b]
            decoded[b] = decode_records(data, at, header)
        rows.append([{"key": h.key, "value": h.value} for h in decoded[b][r].headers] or None)
    return pa.array(rows, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))


def _exit_on_sigterm() -> None:
    """Spark stops the source process with SIGTERM; by default Python dies at once and the runner's
    `finally: reader.stop()` never runs. As SystemExit it unwinds, so stop() can settle what we hold."""
    if threading.current_thread() is not threading.main_thread():
        return

    def _raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _raise_exit)


OffsetOf = Callable[[BatchRanges], dict[str, Any]]


@dataclass
class _Batch:
    offset: dict[str, Any]  # the end offset handed to Spark
    acquired: list[AcquiredRange]  # to acknowledge (includes redeliveries of logged offsets)
    ranges: BatchRanges  # to read
    redelivered: list[tuple[tuple[str, int], int, int]]  # logged offsets that came back, dropped


class _Acquisitions:
    """Driver-side state of one query's source: the header-only share consumer, the batches it acquired
    and has not settled yet (by seq), in checkpoint mode the next batch acquired ahead (on a worker thread
    that also sends the ACCEPTs, in order), and a thread renewing the locks of what is held meanwhile."""

    def __init__(self, options: SourceOptions, member_id: str, logged: OffsetSet, *, restarted: bool) -> None:
        from shoal.client.consumer.share_consumer import ShareConsumer

        self.options = options
        self.logged = logged
        self.checkpoint = options.acknowledge_mode == CHECKPOINT
        self.journal: AcquisitionJournal | None = None
        self.recovered: JournaledBatch | None = None
        if self.checkpoint and options.journal_topic is not None:
            self.journal = AcquisitionJournal(
                options.bootstrap_servers, options.journal_topic, journal_key(options.group_id, member_id),
                options.client_config,
            )
            # A batch journaled (and accepted) by an earlier run of this query that Spark never logged. A
            # query with no batch in the offset log has a member id of this run, under which nothing is
            # journaled (batch 1 never is): the journal need not be read then.
            if restarted:
                self.recovered = self.journal.newest()
        self.consumer = ShareConsumer(
            options.bootstrap_servers,
            options.group_id,
            acknowledgement_mode="explicit",
            header_only=True,
            max_poll_records=options.max_offsets_per_trigger or _UNLIMITED_TRIGGER_CAP,
            fetch_max_wait_ms=options.poll_timeout_ms,
            config=options.client_config,
            member_id=member_id,
        )
        self.pending: dict[int, _Batch] = {}
        self.first_fetch = True
        # One worker, so ACCEPTs and the fetch ahead reach the consumer in the order they were asked for.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kafka-share-acquire")
        self._settling: list[concurrent.futures.Future[None]] = []
        self._ahead: concurrent.futures.Future[_Batch | None] | None = None
        self._admin: Admin | None = None
        self._pruned_at = 0.0
        # Spark calls us on one thread; the lock is for the renewal thread.
        self._lock = threading.Lock()
        self._closing = threading.Event()
        try:
            self.consumer.subscribe(list(options.topics))
        except BaseException:
            self.consumer.close()
            if self.journal is not None:
                self.journal.close()
            raise
        # Held while waiting on a batch: commit mode, the running batch; checkpoint mode without the journal,
        # the batch acquired ahead (with it, every batch acquired ahead is accepted round by round).
        if options.lock_renew_interval_ms > 0 and (not self.checkpoint or self.journal is None):
            threading.Thread(target=self._renew_loop, name="kafka-share-renew", daemon=True).start()

    def fetch(
        self, max_rows: int, *, wait_for_assignment: bool, timeout: float | None = None, single: bool = False
    ) -> list[AcquiredRange]:
        """Acquire up to `max_rows`: one poll that waits up to `timeout` (default pollTimeoutMs) for the
        first records, then, unless `single`, short polls for what is there already."""
        if timeout is None:
            timeout = self.options.poll_timeout_ms / 1000
        # Right after joining, the first fetch may come before the assignment: wait for it rather than
        # report "no data".
        assign_by = time.monotonic() + _ASSIGNMENT_WAIT_S if wait_for_assignment else 0.0
        self.first_fetch = False
        got: list[AcquiredRange] = []
        count = 0
        with self._lock:
            while count < max_rows:
                ranges = self.consumer.poll_ranges(timeout, max_records=max_rows - count)
                if not ranges:
                    if not got and not self.consumer.assignment() and time.monotonic() < assign_by:
                        continue
                    break
                got.extend(ranges)
                count += sum(r.count for r in ranges)
                if single:
                    break
                timeout = _TOP_UP_POLL_S
        return got

    def acquire(self, seq: int, max_rows: int, offset_of: OffsetOf, *, wait_for_assignment: bool) -> _Batch | None:
        """Acquire batch `seq` (None: nothing to acquire now). Offsets already in the offset log that come
        back are accepted and dropped; if that is all that came, fetch again."""
        while True:
            # Batch 1 is never journaled: until Spark has logged an offset of this query, its member id
            # (the journal key) is not durable, and a restarted query could not find its entry.
            if self.journal is not None and seq >= 2:
                ranges = self._acquire_journaled(seq, max_rows, wait_for_assignment=wait_for_assignment)
                if ranges is None:
                    return None
                if not ranges:
                    continue
                return self._pend(seq, _Batch(offset_of(ranges), [], ranges, []))
            acquired = self.fetch(max_rows, wait_for_assignment=wait_for_assignment)
            if not acquired:
                return None
            made = self.add(seq, offset_of, acquired)
            if made is not None:
                return made

    def _acquire_journaled(self, seq: int, max_rows: int, *, wait_for_assignment: bool) -> BatchRanges | None:
        """Acquire in rounds until `max_rows` or nothing more comes: each round's new ranges are journaled
        (with the rounds before, as batch `seq`) and then the round is accepted, so its locks are free for
        the next round. None if nothing came at all."""
        assert self.journal is not None
        ranges: BatchRanges = {}
        count = 0
        got_any = False
        while count < max_rows:
            # One poll a round: at the in-flight limit more polls would only wait; after the ACCEPT below,
            # the next round's poll finds the records at once.
            acquired = self.fetch(
                max_rows - count, wait_for_assignment=wait_for_assignment and not got_any,
                timeout=_TOP_UP_POLL_S if got_any else None, single=True,
            )
            if not acquired or self._closing.is_set():
                break  # closing: what this round acquired is released with the consumer, not journaled
            got_any = True
            count += sum(r.count for r in acquired)
            new, redelivered = self._split_logged(acquired)
            for tp, rs in new.items():
                ranges.setdefault(tp, []).extend(rs)
            if new:
                self.journal.append(seq, ranges)
            # In the journal now (or only offsets already logged): ours to accept. An ACCEPT that fails
            # leaves the new offsets in `logged`, so that if they come back they are dropped.
            self._settle_ranges(acquired, "accept", new, redelivered)
        return ranges if got_any else None

    def fetch_ahead(self, seq: int, max_rows: int, offset_of: OffsetOf, *, wait_for_assignment: bool) -> None:
        """Start acquiring batch `seq` now, while the current one runs (checkpoint mode)."""
        if self._ahead is None:
            self._ahead = self._worker.submit(
                self.acquire, seq, max_rows, offset_of, wait_for_assignment=wait_for_assignment
            )

    def take_ahead(self) -> tuple[bool, _Batch | None]:
        """(whether a fetch ahead was started, the batch it acquired), once it and every ACCEPT asked for
        before it are done."""
        ahead, self._ahead = self._ahead, None
        self.wait_settled()
        return (False, None) if ahead is None else (True, ahead.result())

    def take_recovered(self, seq: int, offset_of: OffsetOf) -> _Batch | None:
        """The journaled batch `seq` that an earlier run accepted (or began to) but Spark never logged: it
        becomes this batch, read by offset. Its records may still come back to the group: they are watched
        for, like the offset log's."""
        recovered, self.recovered = self.recovered, None
        if recovered is None or recovered.seq != seq or not recovered.ranges:
            return None
        log.info("batch %d was journaled but not in the offset log: it is the next batch", seq)
        for tp, rs in recovered.ranges.items():
            for r in rs:
                self.logged.add(tp, r.first, r.last)
        return self._pend(seq, _Batch(offset_of(recovered.ranges), [], recovered.ranges, []))

    def wait_settled(self) -> None:
        """Wait for the ACCEPTs sent in the background: the offsets whose ACCEPT failed must be known before
        the next end offset is made (it carries them)."""
        settling, self._settling = self._settling, []
        for future in settling:
            future.result()

    def _split_logged(
        self, acquired: list[AcquiredRange]
    ) -> tuple[BatchRanges, list[tuple[tuple[str, int], int, int]]]:
        """The acquired offsets as ranges to read, and the pieces already in the offset log (to drop)."""
        ranges: BatchRanges = {}
        logged: list[tuple[tuple[str, int], int, int]] = []
        for rng in acquired:
            pieces, new = self._split_range(rng)
            logged.extend(pieces)
            if new:
                ranges.setdefault((rng.topic, rng.partition), []).extend(new)
        if logged:
            log.info("dropping redelivered offsets already in the offset log: %s", logged[:5])
        return ranges, logged

    def _split_range(self, rng: AcquiredRange) -> tuple[list[tuple[tuple[str, int], int, int]], list[OffsetRange]]:
        """The pieces of `rng` already in the offset log, and the rest as ranges (size pro rata)."""
        tp = (rng.topic, rng.partition)
        inside, outside = self.logged.split(tp, rng.first_offset, rng.last_offset)
        return [(tp, lo, hi) for lo, hi in inside], [
            OffsetRange(lo, hi, rng.delivery_count, rng.size * (hi - lo + 1) // rng.count) for lo, hi in outside
        ]

    def add(self, seq: int, offset_of: OffsetOf, acquired: list[AcquiredRange]) -> _Batch | None:
        """Make batch `seq` of what was acquired, minus offsets already in the offset log (redelivered
        after a crash: they are accepted and dropped). None if nothing new is left."""
        ranges: BatchRanges = {}
        kept: list[AcquiredRange] = []
        redelivered: list[tuple[tuple[str, int], int, int]] = []
        accept_now: list[AcquiredRange] = []
        accept_now_pieces: list[tuple[tuple[str, int], int, int]] = []
        for rng in acquired:
            pieces, new = self._split_range(rng)
            if not new:
                accept_now.append(rng)
                accept_now_pieces.extend(pieces)
                continue
            kept.append(rng)
            redelivered.extend(pieces)
            ranges.setdefault((rng.topic, rng.partition), []).extend(new)
        if redelivered or accept_now_pieces:
            log.info("dropping redelivered offsets already in the offset log: %s", (redelivered + accept_now_pieces)[:5])
        if accept_now:
            self._settle_ranges(accept_now, "accept", {}, accept_now_pieces)
        if not ranges:
            return None
        return self._pend(seq, _Batch(offset_of(ranges), kept, ranges, redelivered))

    def _pend(self, seq: int, batch: _Batch) -> _Batch:
        with self._lock:
            self.pending[seq] = batch
        return batch

    def get(self, seq: int) -> _Batch | None:
        with self._lock:
            return self.pending.get(seq)

    def settle(self, through_seq: int, kind: str, *, background: bool = False) -> None:
        """ACCEPT or RELEASE every pending batch up to `through_seq`; repeating it is harmless. In the
        background, the worker sends it (before any fetch asked for later); see wait_settled."""
        with self._lock:
            done = sorted(s for s in self.pending if s <= through_seq)
            batches = [self.pending.pop(s) for s in done]
        if not batches:
            return
        acquired = [r for b in batches for r in b.acquired]
        ranges: BatchRanges = {}
        for b in batches:
            for tp, rs in b.ranges.items():
                ranges.setdefault(tp, []).extend(rs)
        redelivered = [r for b in batches for r in b.redelivered]
        if background:
            self._settling.append(self._worker.submit(self._settle_ranges, acquired, kind, ranges, redelivered))
        else:
            self._settle_ranges(acquired, kind, ranges, redelivered)

    def _settle_ranges(
        self,
        acquired: list[AcquiredRange],
        kind: str,
        logged_ranges: BatchRanges,
        redelivered: list[tuple[tuple[str, int], int, int]],
    ) -> None:
        with self._lock:
            for rng in acquired:
                self.consumer.acknowledge_range(rng, kind)
            try:
                failed: dict[tuple[str, int], object] = {
                    tp: err for tp, err in self.consumer.commit_sync().items() if err is not None
                }
            except Exception as exc:
                if not self.checkpoint or kind != "accept":
                    raise
                # The batch is in the offset log either way: if the records come back, they are dropped.
                failed = {(r.topic, r.partition): exc for r in acquired}
        if failed:
            # The broker gave them to someone else (lock expired, member fenced) or the session is gone.
            log.warning("could not %s the records of %d ranges: %s", kind, len(acquired), failed)
        if not self.checkpoint or kind != "accept":
            return
        # Offsets whose ACCEPT is confirmed can never come back; the others may, and are in the offset log.
        for tp, lo, hi in redelivered:
            if tp not in failed:
                self.logged.remove(tp, lo, hi)
        for tp, rs in logged_ranges.items():
            if tp in failed:
                for r in rs:
                    self.logged.add(tp, r.first, r.last)

    def prune_logged(self) -> None:
        """Forget logged offsets below each share partition's start offset: the group settled them."""
        if not self.logged or time.monotonic() - self._pruned_at < _PRUNE_INTERVAL_S:
            return
        self._pruned_at = time.monotonic()
        from shoal.client.admin import Admin

        try:
            if self._admin is None:
                self._admin = Admin(self.options.bootstrap_servers, config=self.options.client_config)
            offsets = self._admin.list_share_group_offsets(self.options.group_id, list(self.options.topics))
        except Exception as exc:
            log.info("could not read the share group's start offsets: %s", exc)
            return
        for tp, o in offsets.items():
            if o.error is None and o.start_offset >= 0:
                self.logged.remove_below(tp, o.start_offset)

    def _held(self) -> list[AcquiredRange]:
        """Acquired ranges waiting on a micro-batch: commit mode, the running batch's; checkpoint mode, the
        batch fetched ahead (the running one is accepted already)."""
        if not self.checkpoint:
            return [rng for batch in self.pending.values() for rng in batch.acquired]
        ahead = self._ahead
        if ahead is None or not ahead.done() or ahead.exception() is not None:
            return []
        batch = ahead.result()
        return [] if batch is None else batch.acquired

    def _renew_loop(self) -> None:
        from shoal.client.errors import UnsupportedVersionError

        # A micro-batch may outlast the acquisition lock (30 s by default); RENEW keeps it ours meanwhile.
        interval = self.options.lock_renew_interval_ms / 1000
        while not self._closing.wait(interval):
            try:
                with self._lock:
                    held = self._held()
                    if not held:
                        continue
                    for rng in held:
                        self.consumer.acknowledge_range(rng, "renew")
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
            # Finish what the worker has under way (an ACCEPT must not be cut off half-sent); records fetched
            # ahead are in no offset, and the consumer's close releases them.
            self._worker.shutdown(wait=True)
            if self.pending:
                # Commit mode: whether the newest batch reached the commit log is unknown here (Spark stops
                # us without saying); releasing risks a duplicate, accepting would risk a loss. Checkpoint
                # mode: these batches were never planned, so never read.
                self.settle(max(self.pending), "release")
        finally:
            with self._lock:
                self.consumer.close()  # closes the share sessions (releasing anything left) and leaves
            if self._admin is not None:
                self._admin.close()
            if self.journal is not None:
                self.journal.close()


class KafkaShareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are `{"seq": n, "member": id, "acknowledgeMode": mode, "ranges": {...}, "logged": {...}}`:
    the n-th batch this query acquired, the share-group member id the query consumes under, the ranges the
    batch acquired (topic -> partition -> [[first, last, delivery count, bytes]]) and, in checkpoint mode,
    offsets of earlier batches in the offset log whose ACCEPT was not confirmed (same layout, [first, last])."""

    def __init__(self, options: SourceOptions) -> None:
        # Runs in the driver (twice) and the instance is pickled to executors: no I/O, threads or locks here.
        self.options = options
        self._acq: _Acquisitions | None = None
        self._available_now = False
        self._member_id: str | None = None
        self._logged = OffsetSet()
        self._seeded = False
        self._max_rows: int | None = None  # the last trigger's record limit, for the batch fetched ahead

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_acq"] = None
        state["_logged"] = OffsetSet()
        return state

    # ---- driver side ------------------------------------------------------------------------------

    def _member(self) -> str:
        from shoal.client.consumer.share_consumer import new_member_id

        if self._member_id is None:
            self._member_id = new_member_id()
        return self._member_id

    def _seed(self, logged_offset: Mapping[str, Any]) -> None:
        """The first offset this process sees from Spark's log tells what the log holds that may not
        have been accepted: that batch's ranges (checkpoint mode) and the offsets it carried forward."""
        if self._seeded:
            return
        self._seeded = True
        if logged_offset.get("acknowledgeMode") == CHECKPOINT:
            self._logged.add_ranges(ranges_from_json(logged_offset.get("ranges")))
            for tp, spans in OffsetSet.from_json(logged_offset.get("logged")).intervals.items():
                for lo, hi in spans:
                    self._logged.add(tp, lo, hi)

    def _acquisitions(self, start: Mapping[str, Any]) -> _Acquisitions:
        if self._acq is None:
            _exit_on_sigterm()
            self._adopt_member(start)
            self._seed(start)
            self._acq = _Acquisitions(self.options, self._member(), self._logged, restarted=int(start["seq"]) > 0)
        return self._acq

    def _adopt_member(self, start: Mapping[str, Any]) -> None:
        # On a restart `start` is the checkpoint's last offset: its member id wins over one this reader may
        # have made up (in initialOffset) before Spark had read the checkpoint.
        recorded = start.get("member")
        if recorded:
            self._member_id = str(recorded)

    def _offset(self, seq: int, ranges: BatchRanges | None = None) -> dict[str, Any]:
        offset: dict[str, Any] = {
            "seq": seq,
            "member": self._member(),
            "acknowledgeMode": self.options.acknowledge_mode,
        }
        if ranges is not None:
            offset["ranges"] = ranges_to_json(ranges)
            if self.options.acknowledge_mode == CHECKPOINT and self._logged:
                offset["logged"] = self._logged.to_json()
        return offset

    def _offset_of(self, seq: int) -> OffsetOf:
        return lambda ranges: self._offset(seq, ranges)

    def _wait_for_assignment(self, acq: _Acquisitions) -> bool:
        return self._available_now or acq.first_fetch

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # A queue has no fixed end; "available now" means: stop once a fetch comes back empty.
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        acq = self._acquisitions(start)
        seq = int(start["seq"])
        # Batch `seq` is in the offset log (checkpoint mode: accepted already when it was planned) and, as
        # Spark asks for the batch after it only then, in the commit log (commit mode).
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else _UNLIMITED_TRIGGER_CAP
        self._max_rows = max_rows
        acq.settle(seq, "accept")
        started, _ = acq.take_ahead()  # a batch it acquired is pending now, under its seq
        again = acq.get(seq + 1)
        if again is not None:
            # The batch acquired ahead, or asked again for the same start: the batch planned then.
            return again.offset
        offset_of = self._offset_of(seq + 1)
        recovered = acq.take_recovered(seq + 1, offset_of)
        if recovered is not None:
            return recovered.offset
        if started:
            return start  # the fetch ahead found nothing (under availableNow, that ends the query)
        acq.prune_logged()
        # A new consumer's first fetch waits for its assignment: otherwise the query's first trigger is
        # empty (and under availableNow, an empty trigger ends the query).
        batch = acq.acquire(seq + 1, max_rows, offset_of, wait_for_assignment=self._wait_for_assignment(acq))
        return start if batch is None else batch.offset

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = int(start["seq"]) + 1, int(end["seq"])
        if last < first:
            return []
        self._seed(end)
        pending = self._acq.get(last) if self._acq is not None else None
        checkpoint = end.get("acknowledgeMode") == CHECKPOINT
        if pending is None and not checkpoint:
            # Commit mode replay after a restart: nothing of it was accepted, so the broker hands its
            # records out again by itself; reading them here as well would only duplicate them.
            return []
        if pending is not None and checkpoint and self._acq is not None:
            # Spark wrote `end` to its offset log before asking for the batch's partitions: the batch can be
            # replayed from there, so its records are ours to accept. Then the next batch is acquired
            # while this one runs.
            self._acq.settle(last, "accept", background=True)
            if self._max_rows is not None:
                self._acq.fetch_ahead(
                    last + 1, self._max_rows, self._offset_of(last + 1),
                    wait_for_assignment=self._wait_for_assignment(self._acq),
                )
        ranges = ranges_from_json(end.get("ranges"))
        tasks = plan_tasks(ranges, self.options.max_bytes_per_partition, self.options.min_partitions)
        return [
            RangeTask([(p.topic, p.partition, [(r.first, r.last, r.delivery_count) for r in p.ranges]) for p in t.parts])
            for t in tasks
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Normally a no-op: partitions (checkpoint mode) or latestOffset (commit mode) accepted it already.
        if self._acq is not None:
            self._acq.settle(int(end["seq"]), "accept")

    def stop(self) -> None:
        acq, self._acq = self._acq, None
        if acq is not None:
            acq.close()

    # ---- executor side ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangeTask)
        yield from read_task(partition, self.options)
        freeze_long_lived()


class KafkaShareDataSource(DataSource):
    """`spark.readStream.format("kafka-share")` and `df.writeStream.format("kafka-share")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        # Spark asks for the schema when the query is defined (load()): bad options fail there.
        return SourceOptions.parse(self.options).schema()

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
