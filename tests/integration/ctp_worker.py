"""Consume -> transform -> produce with confluent-kafka, exactly once through transactions.

Reads the input topic in a classic group (read_committed), writes each value upper-cased to the output
topic and commits the consumed offsets in the same transaction (send_offsets_to_transaction). With
`--pause-at N` it prints "open N" once its N-th transaction holds records and the offsets, then waits on
stdin before committing, so a test can kill it -9 mid-transaction. Prints "done" when the input is drained.

Usage: python -m tests.integration.ctp_worker BOOTSTRAP INPUT OUTPUT GROUP TXN_ID TOTAL [--pause-at N]
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka import Consumer, Producer


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "output", "group", "txn_id"):
        parser.add_argument(name)
    parser.add_argument("total", type=int)
    parser.add_argument("--pause-at", type=int, default=0)
    args = parser.parse_args()
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.txn_id,
                         "transaction.timeout.ms": 30000})
    producer.init_transactions(30)
    consumer.subscribe([args.input])
    transactions = 0
    while True:
        msgs = [m for m in consumer.consume(50, 0.5) if m.error() is None]
        if not msgs:
            committed = consumer.committed(consumer.assignment(), 10)
            if consumer.assignment() and sum(max(tp.offset, 0) for tp in committed) >= args.total:
                print("done", flush=True)
                return
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(args.output, m.value().upper(), key=m.value())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        transactions += 1
        if transactions == args.pause_at:
            producer.flush(30)
            print(f"open {transactions}", flush=True)
            sys.stdin.readline()
        producer.commit_transaction(30)


if __name__ == "__main__":
    main()
