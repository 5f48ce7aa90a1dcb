"""Produce and fetch latency while the log cleaner works, against the same broker with the cleaner off.

One data directory, two broker runs. A compacted topic is preloaded with unique keys (every clean
re-reads and rewrites all of it) and, during each measurement, a background producer keeps making it
dirty. Meanwhile a probe measures, one record at a time on another topic: produce latency (acks=1,
until the delivery report) and end-to-end latency (produce until an assigned consumer has it), for a
fixed time, so the probe rate is a throughput figure too. Run 1
has log.cleaner.enable=false, run 2 cleans with min.cleanable.dirty.ratio=0.01 and a 100 ms backoff,
so the cleaner is busy throughout (the bytes it cleaned in the window are printed).

Usage: python bench/bench_compaction.py [--preload 300000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from peers import start_shoal, stop

COMPACTED = "compacted"
PROBE = "probe"




def preload(bootstrap: str, records: int, value_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(COMPACTED, 1, 1, config={"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                                 "min.cleanable.dirty.ratio": "0.01"}),
              NewTopic(PROBE, 1, 1)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    value = b"v" * value_bytes
    for i in range(records):
        while True:
            try:
                producer.produce(COMPACTED, key=b"key-%d" % i, value=value)
                break
            except BufferError:  # the client's queue is full: let deliveries drain it
                producer.poll(0.1)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(120)


def background_load(bootstrap: str, stop_event: threading.Event, start: int) -> None:
    """About 2,000 records a second of new keys onto the compacted topic."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    i = start
    while not stop_event.is_set():
        for _ in range(100):
            producer.produce(COMPACTED, key=b"key-%d" % i, value=b"w" * 100)
            i += 1
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(30)


def probe(bootstrap: str, seconds: float) -> tuple[list[float], list[float]]:
    """(produce latencies, end-to-end latencies) in milliseconds."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "fetch.wait.max.ms": 10,
                         "enable.auto.commit": False})
    _low, high = consumer.get_watermark_offsets(TopicPartition(PROBE, 0), timeout=30)
    consumer.assign([TopicPartition(PROBE, 0, high)])
    produce_ms: list[float] = []
    e2e_ms: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        started = time.perf_counter()
        producer.produce(PROBE, value=b"%d" % i)
        producer.flush(30)
        produce_ms.append((time.perf_counter() - started) * 1000)
        while True:
            msg = consumer.poll(5)
            if msg is not None and not msg.error() and msg.value() == b"%d" % i:
                break
        e2e_ms.append((time.perf_counter() - started) * 1000)
    consumer.close()
    return produce_ms, e2e_ms


def measure(data_dir: str, cleaner: bool, seconds: float, load_start: int, log_path: Path) -> dict[str, float]:
    overrides = ["log.level=info"] + (["log.cleaner.backoff.ms=100"] if cleaner else ["log.cleaner.enable=false"])
    with open(log_path, "a") as log_file:
        proc, bootstrap = start_shoal(data_dir, overrides, stderr=log_file)
    try:
        stop_event = threading.Event()
        loader = threading.Thread(target=background_load, args=(bootstrap, stop_event, load_start), daemon=True)
        loader.start()
        time.sleep(1.0)  # the cleaner (if on) picks the log up within its backoff
        window_start = time.time()
        produce_ms, e2e_ms = probe(bootstrap, seconds)
        window_end = time.time()
        stop_event.set()
        loader.join()
    finally:
        stop(proc)
    cleaned = cleaned_bytes(log_path, window_start, window_end)
    return {
        "produce_p50": statistics.median(produce_ms),
        "produce_p99": statistics.quantiles(produce_ms, n=100)[98],
        "e2e_p50": statistics.median(e2e_ms),
        "e2e_p99": statistics.quantiles(e2e_ms, n=100)[98],
        "probes_per_s": len(e2e_ms) / (window_end - window_start),
        "cleaned_mb": cleaned / 1e6,
    }


_CLEANED = re.compile(r"^(\S+) .*log\.cleaned .*bytes_read=(\d+)")


def cleaned_bytes(log_path: Path, start: float, end: float) -> int:
    """Bytes the cleaner read in cleans that finished inside the window (from the broker's log lines)."""
    total = 0
    for line in log_path.read_text().splitlines():
        m = _CLEANED.match(line)
        if m is None:
            continue
        stamp = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        if start - 1 <= stamp <= end + 1:
            total += int(m.group(2))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0, help="probe time per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = str(Path(tmp) / "data")
        log_path = Path(tmp) / "broker.log"
        with open(log_path, "a") as log_file:
            proc, bootstrap = start_shoal(data_dir, ["log.cleaner.enable=false"], stderr=log_file)
        try:
            preload(bootstrap, args.preload, args.value_bytes)
        finally:
            stop(proc)
        idle = measure(data_dir, False, args.seconds, args.preload, log_path)
        working = measure(data_dir, True, args.seconds, args.preload + 1_000_000, log_path)
        log_text = log_path.read_text()
    print(f"preloaded {args.preload} unique keys x {args.value_bytes} B; probes for {args.seconds} s per run")
    print(f"{'':14} {'cleaner off':>12} {'cleaner on':>12} {'on/off':>8}")
    for key in ("produce_p50", "produce_p99", "e2e_p50", "e2e_p99", "probes_per_s"):
        ratio = working[key] / idle[key] if idle[key] else float("nan")
        print(f"{key:14} {idle[key]:12.2f} {working[key]:12.2f} {ratio:8.2f}")
    print(f"cleaner read {working['cleaned_mb']:.1f} MB during the 'on' window ({idle['cleaned_mb']:.1f} when off)")
    print(json.dumps({"idle": idle, "working": working}))
    if "log.cleaned" not in log_text:
        print("the cleaner never finished a clean: the 'on' run did not measure a working cleaner")


if __name__ == "__main__":
    main()
