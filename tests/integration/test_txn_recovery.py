"""Transactions across broker failures, with real clients: a power cut that loses the unsynced tail
of the transaction index, and the transaction-completion task facing a topic deleted mid-flush."""

from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from .broker_process import BrokerProcess
from .names import unique_name
from .partition_reader import read_partition


def test_a_power_cut_after_an_abort_never_delivers_the_aborted_records(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        topic = unique_name("txn-cut")
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={"internal.segment.bytes": "16384"})])[topic].result(30)
        producer = Producer({"bootstrap.servers": proc.bootstrap, "transactional.id": unique_name("tx"),
                             "linger.ms": 5})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"c0", partition=0)
        producer.commit_transaction(30)
        producer.begin_transaction()
        for i in range(300):  # about 40 KB: the aborted transaction spans several segments
            producer.produce(topic, b"aborted-%03d-" % i + b"x" * 100, partition=0)
        producer.flush(30)
        producer.abort_transaction(30)  # returns once the ABORT marker is written and fsynced
        producer.begin_transaction()
        producer.produce(topic, b"c1", partition=0)
        producer.commit_transaction(30)
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == [b"c0", b"c1"]

        # Power cut: the marker reached the disk, the unsynced tail of the active segment's
        # transaction index (or an earlier version's transactions.json) did not.
        proc.kill()
        partition = proc.data_dir / f"{topic}-0"
        segments = sorted(p for p in partition.iterdir() if p.name.endswith(".log"))
        assert len(segments) > 2
        cut = 0
        for path in partition.iterdir():
            if path.name == "transactions.json" or path.name == segments[-1].name.replace(".log", ".txnindex"):
                cut += path.stat().st_size
                os.truncate(path, 0)
        assert cut > 0  # the aborted transaction was listed there
        proc.start()
        assert [v for _o, _k, v in read_partition(proc.bootstrap, topic, "read_committed")] == [b"c0", b"c1"]
    finally:
        proc.stop()
