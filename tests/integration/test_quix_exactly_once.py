"""A Quix Streams exactly-once application through a broker kill -9: it counts the records of each key
in a stateful step (RocksDB state with its changelog topic on the broker, transactions that commit the
output, the changelog and the consumer offsets together) and writes every new count to an output topic.
The broker is killed mid-stream and restarted on the same data dir; the app (restarted whenever it
exits) recovers. Read with read_committed, the output holds each key's counts 1..n once each: nothing
counted twice, nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from .broker_process import BrokerProcess
from .share_clients import create_topic

REPO = Path(__file__).resolve().parents[2]
# The Quix venv of this checkout; SHOAL_QUIX_PYTHON names another (a worktree without its own venv).
QUIX_PYTHON = Path(os.environ.get("SHOAL_QUIX_PYTHON", REPO / ".venv-quix" / "bin" / "python"))
QUIX_APP = Path(__file__).parent / "quix_eos_app.py"
KEYS = 8
RECORDS = 2400  # keys round-robin, so each key gets RECORDS // KEYS
DEADLINE = 300.0  # a hang guard, not a timing assertion


class QuixApp:
    """The app as a subprocess, started again whenever it exits (a transaction the dead broker aborted can
    end it; Quix Streams recovers its state from the changelog on the next start)."""

    def __init__(self, broker: BrokerProcess, source: str, sink: str, group: str, state_dir: Path,
                 log_path: Path) -> None:
        self.args = [str(QUIX_PYTHON), str(QUIX_APP), broker.bootstrap, source, sink, group, str(state_dir)]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
            self.starts += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class CommittedOutput:
    """The output topic as a read_committed consumer sees it: every count per key, in order."""

    def __init__(self, bootstrap: str, sink: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False})
        self.consumer.subscribe([sink])
        self.counts: dict[str, list[int]] = {}

    def poll(self) -> None:
        msg = self.consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            return
        key = msg.key()
        assert key is not None
        self.counts.setdefault(key.decode(), []).append(int(json.loads(msg.value())["count"]))

    def total(self) -> int:
        return sum(len(c) for c in self.counts.values())

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", overrides=["group.initial.rebalance.delay.ms=0"]).start()
    yield proc
    proc.stop()


def test_quix_streams_exactly_once_counts_survive_a_broker_kill(broker: BrokerProcess, tmp_path: Path) -> None:
    if not QUIX_PYTHON.exists():
        pytest.skip("Quix Streams' venv is missing: `make install-test` builds .venv-quix")
    tag = uuid.uuid4().hex[:8]
    source, sink, group = f"qin-{tag}", f"qout-{tag}", f"qapp-{tag}"
    create_topic(broker.bootstrap, source, 2)
    create_topic(broker.bootstrap, sink, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(source, key=f"k{i % KEYS}".encode(), value=json.dumps({"i": i}).encode())
    assert producer.flush(30) == 0
    expected = RECORDS // KEYS

    app = QuixApp(broker, source, sink, group, tmp_path / "state", tmp_path / "quix-app.log")
    output = CommittedOutput(broker.bootstrap, sink)
    killed_at: int | None = None
    try:
        app.ensure_running()
        deadline = time.monotonic() + DEADLINE
        # Mid-stream: some counts committed, most records still to go.
        while output.total() < RECORDS // 8:
            assert time.monotonic() < deadline, f"the app committed {output.total()} counts; see {app.log_path}"
            app.ensure_running()
            output.poll()
        killed_at = output.total()
        broker.kill()
        broker.start()
        # Until every key reaches its final count (a double count would go past it and never stop here
        # unnoticed: the check below sees every count).
        while any(max(output.counts.get(f"k{k}", [0])) < expected for k in range(KEYS)):
            assert time.monotonic() < deadline, (
                f"counts stuck at {[max(output.counts.get(f'k{k}', [0])) for k in range(KEYS)]}; "
                f"see {app.log_path}")
            app.ensure_running()
            output.poll()
        # Anything committed after the last count would still be a double count: read to the end.
        app.stop()
        for _ in range(25):
            output.poll()
    finally:
        app.stop()
        output.close()
    assert killed_at is not None and killed_at < RECORDS, killed_at
    for k in range(KEYS):
        assert output.counts[f"k{k}"] == list(range(1, expected + 1)), (k, app.starts)
