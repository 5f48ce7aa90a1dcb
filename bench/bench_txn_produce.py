"""Transactional produce against idempotent produce on one Shoal broker, in one run.

confluent-kafka produces N records of 100 bytes to a 3-partition topic twice: once idempotent
(acks=all), once transactional with one transaction per 1,000 records (AddPartitionsToTxn, EndTxn, the
prepare and complete records on __transaction_state, a COMMIT marker on every partition, each fsynced).
Prints both rates and their ratio.

Usage: python bench/bench_txn_produce.py [--records 100000] [--per-txn 1000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from peers import start_shoal

PARTITIONS = 3


def create_topic(bootstrap: str) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


def idempotent(bootstrap: str, records: int, value: bytes) -> float:
    topic = create_topic(bootstrap)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0
    return records / (time.perf_counter() - start)


def transactional(bootstrap: str, records: int, per_txn: int, value: bytes) -> float:
    topic = create_topic(bootstrap)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    start = time.perf_counter()
    for first in range(0, records, per_txn):
        p.begin_transaction()
        for i in range(first, min(first + per_txn, records)):
            while True:
                try:
                    p.produce(topic, value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
        p.commit_transaction(60)
    return records / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--per-txn", type=int, default=1000)
    args = parser.parse_args()
    value = b"x" * 100
    data_dir = tempfile.mkdtemp(prefix="shoal-bench-txn-")
    proc, bootstrap = start_shoal(data_dir)
    try:
        idempotent(bootstrap, args.records // 10, value)  # warm-up: connections, first segments
        idem = idempotent(bootstrap, args.records, value)
        txn = transactional(bootstrap, args.records, args.per_txn, value)
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"idempotent produce:    {idem:10.0f} records/s")
    print(f"transactional produce: {txn:10.0f} records/s ({args.per_txn} records per transaction)")
    print(f"transactional / idempotent: {txn / idem:.2f}")


if __name__ == "__main__":
    main()
