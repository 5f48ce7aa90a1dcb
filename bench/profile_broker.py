"""Profile a Shoal broker process under one workload: its CPU time per request and per record, and where it
goes (py-spy samples of the broker's threads, summed by function).

Workloads, each against a fresh broker with a 4-partition topic:
- produce: many small Produce requests (confluent-kafka, linger.ms=0, 20 records a batch), to show the
  per-request cost; prints the broker's CPU time per Produce request (the count from librdkafka's stats);
- produce-bulk, produce-bulk-all: the benches' produce (linger.ms=5, batches of a thousand records and more)
  with acks=1 or acks=all, to show the per-record cost: the receive path, the record walk, the write, fsyncs;
- plain: an assigned Consumer drains N records written before;
- share: one ShareConsumer drains N records written before.

CPU time comes from /proc (each thread's schedstat), so it does not count the time the broker waited for a
core on a busy machine. With --spy (py-spy from the test extra; it may need ptrace rights) the samples are
written to --out in py-spy's raw format (one stack a line: feed it to flamegraph.pl, or read the summary).

Usage: python bench/profile_broker.py {produce,produce-bulk,produce-bulk-all,plain,share} [--records 100000] [--spy] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_produce_fetch import create_topic, fetch, produce, share_drain
from confluent_kafka import Producer
from peers import broker_cpu_seconds, start_shoal, stop

PARTITIONS = 4
VALUE = os.urandom(100)


def small_requests(bootstrap: str, topic: str, records: int) -> int:
    """Produce `records` in small batches; returns the number of Produce requests librdkafka sent."""
    stats: dict[str, Any] = {}

    def on_stats(js: str) -> None:
        stats.update(json.loads(js))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0, "batch.num.messages": 20,
                         "statistics.interval.ms": 100, "stats_cb": on_stats})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, VALUE, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.001)
        if i % 20 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("undelivered records")
    time.sleep(0.3)
    producer.poll(0.2)  # one more stats report, after the last request
    return sum(int(b["req"].get("Produce", 0)) for b in stats.get("brokers", {}).values())


def summarize(raw: Path, top: int) -> None:
    """The functions the samples spent most time in, by themselves and with what they called."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if frames[-1].startswith(("Runner.run ", "run (uvloop")) or "_worker (concurrent" in frames[-1]:
            continue  # the event loop or an executor thread waiting for work
        n = int(count)
        busy += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    print(f"\n{busy} busy samples; by function itself:")
    for frame, n in own.most_common(top):
        print(f"  {n / busy:6.1%}  {frame}")
    print("with what it called:")
    for frame, n in total.most_common(top):
        print(f"  {n / busy:6.1%}  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=("produce", "produce-bulk", "produce-bulk-all", "plain", "share"))
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--spy", action="store_true", help="sample the broker with py-spy")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=Path("broker-profile.txt"))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="shoal-profile-")
    proc, bootstrap = start_shoal(data_dir)
    spy = None
    requests = 0
    try:
        topic = "profile"
        create_topic(bootstrap, topic, PARTITIONS)
        if not args.workload.startswith("produce"):
            produce(bootstrap, topic, args.records, VALUE, PARTITIONS, "1")
        if args.spy:
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(proc.pid),
                                    "-o", str(args.out), "-f", "raw", "-r", str(args.rate)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)  # attached
        before = broker_cpu_seconds(proc.pid)
        started = time.perf_counter()
        if args.workload == "produce":
            requests = small_requests(bootstrap, topic, args.records)
        elif args.workload.startswith("produce-bulk"):
            produce(bootstrap, topic, args.records, VALUE, PARTITIONS, "all" if args.workload.endswith("all") else "1")
        elif args.workload == "plain":
            fetch(bootstrap, topic, args.records, PARTITIONS, len(VALUE))
        else:
            share_drain(bootstrap, topic, args.records)
        cpu = broker_cpu_seconds(proc.pid) - before
        elapsed = time.perf_counter() - started
    finally:
        if spy is not None:
            spy.send_signal(2)  # py-spy writes its output on SIGINT
            spy.wait(30)
        stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"{args.workload}: {args.records:,} records in {elapsed:.2f} s; broker CPU {cpu:.3f} s, "
          f"{cpu / args.records * 1e6:.2f} us/record", end="")
    print(f", {requests:,} Produce requests, {cpu / requests * 1e6:.1f} us/request" if args.workload == "produce"
          else "")
    if spy is not None and args.out.exists():
        summarize(args.out, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
