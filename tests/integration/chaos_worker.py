"""A producer or an explicit-ack share consumer run as its own process by the chaos test.

Each writes one JSON line per event to its log, flushed at once, so a `kill -9` loses nothing it saw:
  producer: {"acked": [partition, offset, value]} for every record the broker acknowledged (acks=all)
  consumer: {"got": [partition, offset, value, delivery_count], "t": time} for every delivery, and
            {"accepted": [[partition, offset], ...], "t": time} once commit_sync confirmed an ACCEPT.
A consumer given a positive `--die-in-commit` probability kills itself with SIGKILL part way through
some commit_sync calls.

Usage: python -m tests.integration.chaos_worker produce|consume BOOTSTRAP TOPIC LOG [options]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import time
from typing import IO, Any

from confluent_kafka import KafkaException, Producer, ShareConsumer


def emit(out: IO[str], event: dict[str, Any]) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


def produce(args: argparse.Namespace, out: IO[str]) -> None:
    producer = Producer({
        "bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False,
        "message.timeout.ms": 20_000, "reconnect.backoff.max.ms": 200,
    })

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            emit(out, {"acked": [msg.partition(), msg.offset(), msg.value().decode()]})

    for i in range(args.records):
        while True:
            try:
                producer.produce(args.topic, value=f"v-{i}".encode(), partition=i % args.partitions,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        time.sleep(args.interval)
    producer.flush(30)


def consume(args: argparse.Namespace, out: IO[str]) -> None:
    rng = random.Random(args.seed)
    consumer = ShareConsumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "share.acknowledgement.mode": "explicit",
        "reconnect.backoff.max.ms": 200,
    })
    consumer.subscribe([args.topic])
    while True:
        try:
            messages = consumer.poll(0.5)
        except KafkaException:
            continue
        held: dict[int, list[int]] = {}
        for msg in messages:
            if msg.error():
                continue
            emit(out, {"got": [msg.partition(), msg.offset(), msg.value().decode(), msg.delivery_count()],
                       "t": time.time()})
            consumer.acknowledge(msg)
            held.setdefault(msg.partition(), []).append(msg.offset())
        if not held:
            continue
        if rng.random() < args.die_in_commit:
            # Die a few milliseconds into the commit: sometimes before, sometimes after the request left.
            delay = rng.uniform(0.0, 0.01)
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            results = consumer.commit_sync(10)
        except KafkaException:
            continue
        accepted = [[tp.partition, offset] for tp, err in results.items() if err is None
                    for offset in held.get(tp.partition, [])]
        if accepted:
            emit(out, {"accepted": accepted, "t": time.time()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("log")
    parser.add_argument("--group", default="chaos")
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--die-in-commit", type=float, default=0.0)
    args = parser.parse_args()
    with open(args.log, "a") as out:
        (produce if args.role == "produce" else consume)(args, out)


if __name__ == "__main__":
    main()
