"""Chaos: a producer and explicit-ack share consumers run as processes while the broker is killed with
SIGKILL several times and consumers many times, some of them part way through a commit_sync.

Every acknowledged produce, every delivery and every confirmed ACCEPT is logged by the processes
themselves (see chaos_worker.py); afterwards the logs must show that
- nothing whose produce was acknowledged is missing: a consumer got each such record;
- nothing whose ACCEPT was confirmed was delivered again;
- no record stays locked longer than one acquisition-lock duration once its holders are dead.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import ShareConsumer

from .broker_process import BrokerProcess
from .share_clients import create_topic, set_group_config
from .test_metrics import scrape

TOPIC, GROUP, PARTITIONS = "chaos", "chaos-workers", 2
RECORDS = 1500
LOCK_MS = 2000
CONSUMERS = 3
BROKER_KILLS = 3
CONSUMER_KILL_EVERY_S = 0.6
ROOT = Path(__file__).resolve().parents[2]


def spawn(role: str, broker: BrokerProcess, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.chaos_worker", role, broker.bootstrap, TOPIC, str(log), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def events(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # the last line of a process killed while writing it
    return out


def acquired_records(broker: BrokerProcess) -> float:
    samples, _types = scrape(broker)
    return sum(v for (name, labels), v in samples.items()
               if name == "shoal_share_partition_acquired_records" and ("group", GROUP) in labels)


def test_acked_records_survive_broker_and_consumer_kills(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", overrides=[
        f"num.partitions={PARTITIONS}", "group.share.min.session.timeout.ms=3000",
        "group.share.session.timeout.ms=3000", "group.share.min.heartbeat.interval.ms=500",
        "group.share.heartbeat.interval.ms=500", "group.share.min.record.lock.duration.ms=1000",
        "offsets.topic.num.partitions=3", "share.coordinator.state.topic.num.partitions=3",
    ]).start()
    rng = random.Random(932)
    logs = tmp_path / "logs"
    logs.mkdir()
    consumers: list[subprocess.Popen[bytes]] = []
    producer: subprocess.Popen[bytes] | None = None
    spawned = 0

    def new_consumer() -> subprocess.Popen[bytes]:
        nonlocal spawned
        spawned += 1
        return spawn("consume", broker, logs / f"consumer-{spawned}.jsonl", "--group", GROUP,
                     "--seed", str(spawned), "--die-in-commit", "0.1")

    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        set_group_config(broker.bootstrap, GROUP, share_auto_offset_reset="earliest",
                         share_record_lock_duration_ms=str(LOCK_MS))
        producer = spawn("produce", broker, logs / "producer.jsonl", "--records", str(RECORDS),
                         "--partitions", str(PARTITIONS), "--interval", "0.006")
        consumers = [new_consumer() for _ in range(CONSUMERS)]
        started = time.monotonic()
        produce_span = RECORDS * 0.006 + 2
        broker_kills_at = [started + produce_span * (i + 1) / (BROKER_KILLS + 1) for i in range(BROKER_KILLS)]
        consumer_kills = died_in_commit = 0
        while producer.poll() is None or broker_kills_at:
            time.sleep(CONSUMER_KILL_EVERY_S)
            assert time.monotonic() - started < 60, "the producer never finished"
            victim = rng.randrange(len(consumers))
            consumers[victim].kill()
            consumers[victim].wait()
            consumer_kills += 1
            for i, c in enumerate(consumers):
                if c.poll() is not None:  # killed just now, or died in a commit_sync
                    died_in_commit += i != victim
                    consumers[i] = new_consumer()
            if broker_kills_at and time.monotonic() >= broker_kills_at[0]:
                broker_kills_at.pop(0)
                broker.kill()
                broker.start()
        # Every holder dies at once; within one lock duration nothing may stay acquired.
        for c in consumers:
            c.kill()
            c.wait()
        holders_dead = time.monotonic()
        while acquired_records(broker) > 0:
            assert time.monotonic() - holders_dead < LOCK_MS / 1000 + 1, "records stayed locked past the lock duration"
            time.sleep(0.1)

        all_events = events(sorted(logs.glob("*.jsonl")))
        acked = {tuple(e["acked"]) for e in all_events if "acked" in e}
        assert len(acked) > RECORDS // 2, f"only {len(acked)} produces were acknowledged"
        # A last consumer drains the rest, logging the same way.
        final_log = logs / "final.jsonl"
        drain(broker, final_log)
        all_events += events([final_log])

        got = [(tuple(e["got"][:3]), e["t"]) for e in all_events if "got" in e]
        accepted_at: dict[tuple[int, int], float] = {}
        for e in all_events:
            for p, o in e.get("accepted", []):
                accepted_at[(p, o)] = min(e["t"], accepted_at.get((p, o), e["t"]))
        delivered = {record for record, _t in got}
        missing = acked - delivered
        assert not missing, f"{len(missing)} acknowledged records never delivered, e.g. {sorted(missing)[:5]}"
        again = [(record, t) for record, t in got if record[:2] in accepted_at and t > accepted_at[record[:2]]]
        assert not again, f"delivered after a confirmed ACCEPT: {again[:5]}"
        assert consumer_kills >= 10 and died_in_commit >= 1, (consumer_kills, died_in_commit)
    finally:
        for c in consumers:
            c.kill()
            c.wait()
        if producer is not None:
            producer.kill()
            producer.wait()
        broker.stop()


def share_lag(broker: BrokerProcess) -> float | None:
    """Records of the group not yet acknowledged or archived, over all partitions; None until all are loaded."""
    samples, _types = scrape(broker)
    lags = [v for (name, labels), v in samples.items()
            if name == "shoal_share_partition_lag" and ("group", GROUP) in labels]
    return sum(lags) if len(lags) == PARTITIONS else None


def drain(broker: BrokerProcess, log: Path) -> None:
    """Consume and ACCEPT until the group has nothing left: every record acknowledged or archived. (A record
    whose ACCEPT was written but whose consumer died before hearing so is done without a confirmation.)"""
    consumer = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP,
                              "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([TOPIC])
    deadline = time.monotonic() + 30
    try:
        with open(log, "w") as out:
            while share_lag(broker) != 0:
                assert time.monotonic() < deadline, f"the group still lags by {share_lag(broker)}"
                held: dict[int, list[int]] = {}
                for msg in consumer.poll(0.3):
                    if msg.error():
                        continue
                    out.write(json.dumps({"got": [msg.partition(), msg.offset(), msg.value().decode(),
                                                  msg.delivery_count()], "t": time.time()}) + "\n")
                    consumer.acknowledge(msg)
                    held.setdefault(msg.partition(), []).append(msg.offset())
                if not held:
                    continue
                results = consumer.commit_sync(10)
                done = [[tp.partition, o] for tp, err in results.items() if err is None
                        for o in held.get(tp.partition, [])]
                out.write(json.dumps({"accepted": done, "t": time.time()}) + "\n")
    finally:
        consumer.close()
