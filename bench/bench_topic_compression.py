"""Produce throughput into a topic that keeps the producer's batches (compression.type=producer) against one
the broker recompresses (compression.type=zstd, and the other codecs on request).

One Shoal broker on loopback; the same confluent-kafka producer (acks=1, linger 5 ms, the producer's own
codec from --producer-codec) writes N records of repetitive text to each topic in turn, rounds alternating so
a busy machine weighs on both alike (each codec goes first in turn). The figure that matters is the ratio: recompression runs on the produce
path, inside the broker's event loop.

Usage: python bench/bench_topic_compression.py [--records 100000] [--value-bytes 200] [--rounds 3]
       [--producer-codec none] [--codecs zstd]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from peers import start_shoal, stop


def produce(bootstrap: str, topic: str, records: int, value: bytes, codec: str) -> float:
    """Seconds to produce `records` and receive every delivery report."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "compression.type": codec,
                         "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    failures = 0

    def report(err: object, _msg: object) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % (i % 1000), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} records failed")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producer-codec", default="none")
    parser.add_argument("--codecs", default="zstd", help="comma-separated topic codecs to compare with producer")
    args = parser.parse_args()
    text = b"sensor=thermo-17 reading=21.5 unit=C status=ok " * (args.value_bytes // 48 + 1)
    value = text[: args.value_bytes]
    data_dir = tempfile.mkdtemp(prefix="shoal-bench-compression-")
    proc, bootstrap = start_shoal(data_dir)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        codecs = ["producer", *args.codecs.split(",")]
        times: dict[str, list[float]] = {codec: [] for codec in codecs}
        for r in range(args.rounds):
            for codec in codecs[r % len(codecs):] + codecs[: r % len(codecs)]:  # each codec goes first in turn
                topic = f"bench-{codec}-{r}"
                admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": codec})])[topic].result(30)
                times[codec].append(produce(bootstrap, topic, args.records, value, args.producer_codec))
        base = statistics.median(times["producer"])
        print(f"{args.records} records of {args.value_bytes} bytes, producer codec {args.producer_codec}, "
              f"median of {args.rounds} rounds")
        for codec in codecs:
            median = statistics.median(times[codec])
            print(f"  compression.type={codec:10s} {args.records / median:10.0f} records/s  "
                  f"ratio to producer {base / median:.2f}")
    finally:
        stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
