"""End-to-end read rate of a classic-group confluent Consumer against a plain assign-mode Consumer.

One Shoal process on loopback; N records (100-byte values) are produced to a topic once, then read back
from the start by (a) a Consumer that assign()s every partition, and (b) a Consumer in a classic group
that subscribe()s (JoinGroup/SyncGroup, auto-commit every 5 s, group.initial.rebalance.delay.ms=0), the
group's join included in its time. Each is run `--rounds` times, alternating, and the best is kept. Rates
are printed for the whole read and from the first record on: a new group's consumer also waits for its
join and for librdkafka's offset reset (ListOffsets), a fixed cost that a short run cannot amortise.
The goal is a group rate of at least 0.9x the assign rate.

Usage: python bench/bench_consumer_group.py [--records 1000000] [--partitions 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

from bench_produce_fetch import Result, create_topic, line, produce, stop
from confluent_kafka import Consumer, TopicPartition
from peers import start_shoal

FETCH = {"fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760}


def drain(consumer: Any, records: int, value_bytes: int, started: float) -> tuple[Result, Result]:
    """The whole read, and the read from its first record on (without the client's start-up and join)."""
    got = 0
    first = 0.0
    deadline = time.monotonic() + 120
    while got < records and time.monotonic() < deadline:
        # Never ask for more than are left: consume() waits its whole timeout for a count never reached.
        for msg in consumer.consume(min(10_000, records - got), 1.0):
            if msg.error() is None:
                if not got:
                    first = time.perf_counter()
                got += 1
    ended = time.perf_counter()
    consumer.close()
    if got < records:
        raise RuntimeError(f"read only {got} of {records}")
    return Result(got, ended - started, got * value_bytes), Result(got, ended - first, got * value_bytes)


def read_assigned(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int) -> tuple[Result, Result]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                         **FETCH})
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return drain(consumer, records, value_bytes, started)


def read_in_group(bootstrap: str, topic: str, records: int, value_bytes: int) -> tuple[Result, Result]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", **FETCH})
    started = time.perf_counter()
    consumer.subscribe([topic])
    return drain(consumer, records, value_bytes, started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    n, parts = args.records, args.partitions
    data_dir = tempfile.mkdtemp(prefix="shoal-bench-")
    shoal, bootstrap = start_shoal(data_dir, ["group.initial.rebalance.delay.ms=0"])
    best: dict[str, Result] = {}
    try:
        create_topic(bootstrap, "bench-group", parts)
        produce(bootstrap, "bench-group", n, os.urandom(args.value_bytes), parts, "1")
        for _ in range(args.rounds):
            for label, run in (
                ("assign Consumer", lambda: read_assigned(bootstrap, "bench-group", n, parts, args.value_bytes)),
                ("group Consumer", lambda: read_in_group(bootstrap, "bench-group", n, args.value_bytes)),
            ):
                whole, steady = run()
                for key, result in ((label, whole), (f"{label} after 1st rec", steady)):
                    if key not in best or result.rate > best[key].rate:
                        best[key] = result
    finally:
        stop(shoal)
        shutil.rmtree(data_dir, ignore_errors=True)

    print(f"{n:,} records x {args.value_bytes} B values over {parts} partitions, confluent-kafka, "
          f"best of {args.rounds}")
    for label, r in best.items():
        print(line(label, r))
    for suffix in ("", " after 1st rec"):
        ratio = best[f"group Consumer{suffix}"].rate / best[f"assign Consumer{suffix}"].rate
        print(f"  ratio group/assign{suffix:<18} {ratio:>6.2f}  (goal >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
