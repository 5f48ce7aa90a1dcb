"""KIP-932 broker metrics for share groups, as Prometheus families (see docs/metrics.md for the mapping).

Two kinds of sources:
- events the event loop reports as they happen (acknowledgements, share-partition loads, share-state
  writes), recorded into prometheus_client counters/histograms, which are thread-safe;
- state read at scrape time by `ShareGroupCollector`, which runs in prometheus_client's HTTP thread.
  It must not await or call into code that mutates: it copies containers in one C-level call
  (`list(d.values())`, safe under the GIL) and reads plain attributes; values the event loop has to
  compute (delivery-complete count, oldest lock) are published by the leaders as plain attributes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shoal.protocol.acknowledge_type import AcknowledgeType


class NamedTopic(Protocol):
    @property
    def name(self) -> str: ...


class TopicsById(Protocol):
    """The topic lookup the collector needs (the storage layer's TopicRegistry is one)."""

    def get_by_id(self, topic_id: bytes) -> NamedTopic | None: ...


class Broker(Protocol):
    """The parts of the broker the collector reads (the server's Broker has them)."""

    @property
    def topics(self) -> TopicsById: ...

    @property
    def share_groups(self) -> Any: ...

    share_coordinator: Any
    share_partitions: Any


PROTOCOL = "share"
ACK_TYPE_NAMES = {t.value: t.name.lower() for t in AcknowledgeType}  # metric label per wire value
GROUP_STATES = ("Empty", "Stable", "Dead")
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# The millisecond families of the previous release, kept for one more release as deprecated aliases of the
# `_seconds` ones (same observations, in ms) so existing dashboards and alerts keep working meanwhile.
MS_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
DEPRECATED = "Deprecated alias of {} in milliseconds; removed in the next release."


class WindowedMax:
    """The largest value seen in the last one or two windows, like Kafka's sampled Max stat
    (two samples of `window_s`): old maxima age out instead of sticking forever."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()  # recorded on the event loop, read by the scrape thread
        self._samples: list[tuple[float, float]] = []  # (window start, max in window)

    def record(self, value: float) -> None:
        now = self.clock()
        with self._lock:
            if self._samples and now - self._samples[-1][0] < self.window_s:
                start, current = self._samples[-1]
                self._samples[-1] = (start, max(current, value))
            else:
                self._samples.append((now, value))
                del self._samples[:-2]

    def value(self) -> float:
        """The max over unexpired samples; NaN when there is none (Kafka reports NaN too)."""
        now = self.clock()
        with self._lock:
            live = [v for start, v in self._samples if now - start < 2 * self.window_s]
        return max(live) if live else float("nan")


class ShareGroupMetrics:
    """Event-driven share-group metrics; the broker's code calls the `observe_*` / `record_*` methods."""

    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.share_acknowledgements = Counter(
            "shoal_group_coordinator_share_acknowledgement",
            "Acknowledgement requests for share partitions (share-acknowledgement-count; rate via rate()).",
            ["protocol"], registry=r,
        )
        self.record_acknowledgements = Counter(
            "shoal_group_coordinator_record_acknowledgement",
            "Records acknowledged, by acknowledgement type (record-acknowledgement-count; rate via rate()).",
            ["protocol", "ack_type"], registry=r,
        )
        self.partition_load_time = Histogram(
            "shoal_group_coordinator_partition_load_time_seconds",
            "Seconds to load a share partition's state on its leader (partition-load-time-avg = sum/count).",
            ["protocol"], registry=r, buckets=SECONDS_BUCKETS,
        )
        self.partition_load_time_ms = Histogram(
            "shoal_group_coordinator_partition_load_time_ms",
            DEPRECATED.format("shoal_group_coordinator_partition_load_time_seconds"),
            ["protocol"], registry=r, buckets=MS_BUCKETS,
        )
        self.state_partition_load_time = Histogram(
            "shoal_share_coordinator_partition_load_time_seconds",
            "Seconds to load one __share_group_state partition (partition-load-time-avg = sum/count).",
            registry=r, buckets=SECONDS_BUCKETS,
        )
        self.state_partition_load_time_ms = Histogram(
            "shoal_share_coordinator_partition_load_time_ms",
            DEPRECATED.format("shoal_share_coordinator_partition_load_time_seconds"),
            registry=r, buckets=MS_BUCKETS,
        )
        self.writes = Counter(
            "shoal_share_coordinator_write",
            "WriteShareGroupState calls served by the share coordinator (write-total; write-rate via rate()).",
            registry=r,
        )
        self.write_latency = Histogram(
            "shoal_share_coordinator_write_latency_seconds",
            "Seconds per share-state write call, including the append to __share_group_state "
            "(write-latency-avg = sum/count).",
            registry=r, buckets=SECONDS_BUCKETS,
        )
        self.write_latency_ms = Histogram(
            "shoal_share_coordinator_write_latency_ms",
            DEPRECATED.format("shoal_share_coordinator_write_latency_seconds"),
            registry=r, buckets=MS_BUCKETS,
        )
        # KIP-1103 BrokerTopicMetrics meters, counted per topic-partition of a request as Kafka does.
        self.share_fetch_requests = Counter(
            "shoal_broker_topic_total_share_fetch_requests",
            "Share-fetched topic-partitions (TotalShareFetchRequestsPerSec; rate via rate()).",
            ["topic"], registry=r,
        )
        self.failed_share_fetch_requests = Counter(
            "shoal_broker_topic_failed_share_fetch_requests",
            "Share-fetched topic-partitions answered with an error (FailedShareFetchRequestsPerSec).",
            ["topic"], registry=r,
        )
        self.share_acknowledgement_requests = Counter(
            "shoal_broker_topic_total_share_acknowledgement_requests",
            "Acknowledged topic-partitions (TotalShareAcknowledgementRequestsPerSec; rate via rate()).",
            ["topic"], registry=r,
        )
        self.failed_share_acknowledgement_requests = Counter(
            "shoal_broker_topic_failed_share_acknowledgement_requests",
            "Acknowledgements of a topic-partition that failed (FailedShareAcknowledgementRequestsPerSec).",
            ["topic"], registry=r,
        )
        # KIP-1191 dead-letter meters, per share group.
        self.dead_letter_records = Counter(
            "shoal_share_group_dead_letter_queue_records",
            "Records written to the group's dead-letter topic (DeadLetterQueueRecordCount).",
            ["group"], registry=r,
        )
        self.dead_letter_produce_requests = Counter(
            "shoal_share_group_dead_letter_queue_produce_requests",
            "Appends to the group's dead-letter topic (DeadLetterQueueTotalProduceRequestsPerSec).",
            ["group"], registry=r,
        )
        self.partition_load_time_max = WindowedMax()
        self.state_partition_load_time_max = WindowedMax()
        self.write_latency_max = WindowedMax()
        # Pre-create the label sets the KIP names so they are exported (as 0) before the first event.
        for name in ("accept", "release", "reject"):
            self.record_acknowledgements.labels(protocol=PROTOCOL, ack_type=name)
        self.share_acknowledgements.labels(protocol=PROTOCOL)
        self.partition_load_time.labels(protocol=PROTOCOL)
        self.partition_load_time_ms.labels(protocol=PROTOCOL)

    def record_acknowledgement(self, type_counts: dict[int, int]) -> None:
        """One acknowledgement of a share partition, with its record count per AcknowledgeType."""
        self.share_acknowledgements.labels(protocol=PROTOCOL).inc()
        for ack_type, n in type_counts.items():
            name = ACK_TYPE_NAMES.get(ack_type, str(ack_type))
            self.record_acknowledgements.labels(protocol=PROTOCOL, ack_type=name).inc(n)

    def record_share_acknowledgement(self, topic: str, failed: bool) -> None:
        self.share_acknowledgement_requests.labels(topic=topic).inc()
        if failed:
            self.failed_share_acknowledgement_requests.labels(topic=topic).inc()

    def record_dead_letters(self, group: str, records: int) -> None:
        self.dead_letter_records.labels(group=group).inc(records)
        self.dead_letter_produce_requests.labels(group=group).inc()

    # The callers time in milliseconds (Kafka's unit for these); the families are in seconds.
    def observe_partition_load(self, ms: float) -> None:
        self.partition_load_time.labels(protocol=PROTOCOL).observe(ms / 1000)
        self.partition_load_time_ms.labels(protocol=PROTOCOL).observe(ms)
        self.partition_load_time_max.record(ms)

    def observe_state_partition_load(self, ms: float) -> None:
        self.state_partition_load_time.observe(ms / 1000)
        self.state_partition_load_time_ms.observe(ms)
        self.state_partition_load_time_max.record(ms)

    def observe_state_write(self, ms: float) -> None:
        self.writes.inc()
        self.write_latency.observe(ms / 1000)
        self.write_latency_ms.observe(ms)
        self.write_latency_max.record(ms)


class ShareGroupCollector(Collector):
    """Scrape-time view of the group coordinator, share coordinator and share-partition leaders."""

    def __init__(self, broker: Broker, events: ShareGroupMetrics, clock_ms: Callable[[], float] | None = None):
        self.broker = broker
        self.events = events
        self.clock_ms = clock_ms or (lambda: time.time() * 1000)

    def describe(self) -> list[Any]:
        return []  # families depend on live state; nothing to pre-declare

    def collect(self) -> Iterator[Any]:
        yield from self._group_coordinator()
        yield from self._share_coordinator()
        yield from self._share_partitions()

    def _group_coordinator(self) -> Iterator[Any]:
        counts = dict.fromkeys(GROUP_STATES, 0)
        partitions = 0
        rebalances = 0
        coordinator = self.broker.share_groups
        if coordinator is not None:
            rebalances = int(coordinator.rebalances)
            for group in list(coordinator.groups.values()):
                state = group.state.value
                counts[state] = counts.get(state, 0) + 1
                partitions += sum(len(info.partitions) for info in list(group.initialized.values()))
        family = GaugeMetricFamily("shoal_group_coordinator_group_count",
                                   "Share groups managed by the group coordinator, by state (group-count).",
                                   labels=["protocol", "state"])
        for state, n in counts.items():
            family.add_metric([PROTOCOL, state], n)
        yield family
        rebalance = CounterMetricFamily("shoal_group_coordinator_rebalance",
                                        "Share-group rebalances, i.e. group epoch bumps (rebalance-count; "
                                        "rebalance-rate via rate()).", labels=["protocol"])
        rebalance.add_metric([PROTOCOL], rebalances)
        yield rebalance
        num = GaugeMetricFamily("shoal_group_coordinator_num_partitions",
                                "Share partitions with initialised state across share groups (num-partitions).",
                                labels=["protocol"])
        num.add_metric([PROTOCOL], partitions)
        yield num
        load_max_ms = self.events.partition_load_time_max.value()
        load_max = GaugeMetricFamily("shoal_group_coordinator_partition_load_time_max_seconds",
                                     "Longest share-partition load in the last 30-60 s (partition-load-time-max).",
                                     labels=["protocol"])
        load_max.add_metric([PROTOCOL], load_max_ms / 1000)
        yield load_max
        alias = GaugeMetricFamily("shoal_group_coordinator_partition_load_time_max_ms",
                                  DEPRECATED.format("shoal_group_coordinator_partition_load_time_max_seconds"),
                                  labels=["protocol"])
        alias.add_metric([PROTOCOL], load_max_ms)
        yield alias

    def _share_coordinator(self) -> Iterator[Any]:
        load_max_ms = self.events.state_partition_load_time_max.value()
        write_max_ms = self.events.write_latency_max.value()
        yield GaugeMetricFamily("shoal_share_coordinator_partition_load_time_max_seconds",
                                "Longest __share_group_state partition load in the last 30-60 s "
                                "(partition-load-time-max).", value=load_max_ms / 1000)
        yield GaugeMetricFamily("shoal_share_coordinator_partition_load_time_max_ms",
                                DEPRECATED.format("shoal_share_coordinator_partition_load_time_max_seconds"),
                                value=load_max_ms)
        yield GaugeMetricFamily("shoal_share_coordinator_write_latency_max_seconds",
                                "Slowest share-state write call in the last 30-60 s (write-latency-max).",
                                value=write_max_ms / 1000)
        yield GaugeMetricFamily("shoal_share_coordinator_write_latency_max_ms",
                                DEPRECATED.format("shoal_share_coordinator_write_latency_max_seconds"),
                                value=write_max_ms)
        coordinator = self.broker.share_coordinator
        busy = 0.0 if coordinator is None else float(coordinator.busy_seconds())
        yield CounterMetricFamily("shoal_share_coordinator_busy_seconds",
                                  "Seconds the share coordinator had work in progress (thread-idle-ratio-avg = "
                                  "1 - rate() of this).", value=busy)

    def _share_partitions(self) -> Iterator[Any]:
        labels = ["group", "topic", "partition"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"shoal_share_partition_{name}", doc, labels=labels)

        start = gauge("start_offset", "Share-partition start offset (SPSO).")
        in_flight = gauge("in_flight_records", "Records between SPSO and SPEO (the in-flight window).")
        available = gauge("available_records", "In-flight records AVAILABLE for acquisition.")
        acquired = gauge("acquired_records", "In-flight records ACQUIRED by a consumer.")
        archived = gauge("archived_records", "In-flight records ARCHIVED (rejected, expired past the limit, gaps).")
        lag = gauge("lag", "Records at or after SPSO not yet acknowledged or archived: latest offset - SPSO - "
                           "delivery-complete count.")
        oldest = gauge("oldest_acquired_age_seconds", "Age of the oldest acquisition lock still held (0 when none).")
        oldest_ms = gauge("oldest_acquired_age_ms", DEPRECATED.format("shoal_share_partition_oldest_acquired_age_seconds"))
        leaders = self.broker.share_partitions
        now = self.clock_ms()
        for leader in ([] if leaders is None else leaders.all()):
            sp = leader.state
            if sp is None:
                continue  # not loaded (yet, or dropped): nothing in memory to report
            topic = self.broker.topics.get_by_id(leader.key.topic_id)
            if topic is None:
                continue
            values = [leader.key.group_id, topic.name, str(leader.key.partition)]
            spso = sp.start_offset
            start.add_metric(values, spso)
            in_flight.add_metric(values, sp.in_flight_count)
            available.add_metric(values, sp.available_count)
            acquired.add_metric(values, sp.acquired_count)
            archived.add_metric(values, sp.archived_count)
            latest = leader.plog.high_watermark if leader.plog is not None else spso  # sidecar: no local log
            lag.add_metric(values, max(0, latest - spso - leader.published_delivery_complete))
            lock_start = leader.published_oldest_lock_ms
            age_ms = 0 if lock_start is None else max(0.0, now - lock_start)
            oldest.add_metric(values, age_ms / 1000)
            oldest_ms.add_metric(values, age_ms)
        yield from (start, in_flight, available, acquired, archived, lag, oldest, oldest_ms)
