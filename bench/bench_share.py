"""Share-group figures for Shoal, with librdkafka's mock cluster as the reference where it applies.

1. Consumption: records/s for 1 and 4 confluent-kafka ShareConsumers (implicit acknowledgement) draining a
   backlog of N 100-byte records on a 4-partition topic, against Shoal and against the mock cluster, once
   with large producer batches and once with batches of at most 100 records (a share fetch acquires whole
   log batches, so batch size sets how much work one fetch and one acknowledgement cover).
   Two ways (see consume_rate): "backlog" — fresh members drain records produced before they joined;
   "live" — members already consuming while the backlog is produced (the only way that works with the
   mock; it is bounded by the producer when consuming is faster). The clock runs from the first backlog
   record received to the last.
2. State cost: bytes appended to `__share_group_state` (sum of its partition logs in Shoal's data dir)
   per accepted record, for each of those runs.
3. Reload: a state log of many ShareUpdate records (written with raw WriteShareGroupState requests over
   many keys), then `kill -9` and a restart: time from process start to the SHOAL_READY line, and the
   seconds the broker reports for its "coordinators loaded" step.

The mock keeps everything in memory and persists no share state, so only figure 1 has a reference.

Usage: python bench/bench_share.py [--records 200000] [--mock-records 30000] [--state-records 200000]
       [--sections shoal,mock,reload]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from peers import start_mock

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey

READY_PREFIX = "SHOAL_READY "
STATE_TOPIC = "__share_group_state"
PARTITIONS = 4
VALUE = b"x" * 100
PROBE = b"probe"
BATCH_RECORDS = (10_000, 100)  # producer batch.num.messages: share fetches acquire whole log batches


# ---- brokers -------------------------------------------------------------------------------------


@dataclass
class Shoal:
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    ready_seconds: float = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Shoal:
        args = [
            sys.executable, "-m", "shoal.broker.server.main",
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "--override", f"log.dirs={self.data_dir}",
            "--override", "group.share.min.heartbeat.interval.ms=1000",
            "--override", "group.share.heartbeat.interval.ms=1000",
        ]
        log_file = open(self.log_path, "a")
        started = time.perf_counter()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True)
        log_file.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(READY_PREFIX):
                self.ready_seconds = time.perf_counter() - started
                self.port = int(json.loads(line[len(READY_PREFIX):])["listeners"][0]["port"])
                threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True).start()
                return self
            if not line and self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"shoal did not start; see {self.log_path}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def state_log_bytes(self) -> int:
        return sum(f.stat().st_size for d in self.data_dir.glob(f"{STATE_TOPIC}-*") for f in d.glob("*.log"))

    def coordinators_loaded_seconds(self) -> float | None:
        found = re.findall(r"coordinators loaded\s+seconds=([0-9.]+)", self.log_path.read_text())
        return float(found[-1]) if found else None


def _drain(stream: Any) -> None:
    for _ in stream:
        pass


# ---- consumption -----------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, count: int, value: bytes, *, one_per_partition: bool = False,
            batch_records: int = 10_000) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5,
                         "batch.num.messages": batch_records, "queue.buffering.max.messages": 1_000_000})
    for i in range(PARTITIONS if one_per_partition else count):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("undelivered records")


class ConsumerGroup:
    """N ShareConsumers on threads: they poll while `running` is set and count non-probe records."""

    def __init__(self, bootstrap: str, group: str, topic: str, n: int):
        self.consumers = [ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "max.poll.records": 500}) for _ in range(n)]
        for c in self.consumers:
            c.subscribe([topic])
        self.running = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.records = 0
        self.per_consumer = [0] * n  # records each member received (to tell a stalled member apart)
        self.probe_partitions: set[int] = set()
        self.first_record_at = 0.0
        self.last_record_at = 0.0
        self.threads = [threading.Thread(target=self._run, args=(c, i), daemon=True)
                        for i, c in enumerate(self.consumers)]
        for t in self.threads:
            t.start()

    def _run(self, consumer: ShareConsumer, index: int) -> None:
        while not self.stop.is_set():
            if not self.running.wait(0.1):
                continue
            msgs = consumer.poll(0.2)
            records = 0
            probes: set[int] = set()
            for m in msgs:
                if m.error():
                    continue
                if m.value() == PROBE:
                    probes.add(m.partition())
                else:
                    records += 1
            if records or probes:
                with self.lock:
                    self.records += records
                    self.per_consumer[index] += records
                    self.probe_partitions |= probes
                    self.last_record_at = time.perf_counter()
                    if records and not self.first_record_at:
                        self.first_record_at = self.last_record_at

    def wait(self, done: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if done():
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        for c in self.consumers:
            c.close()


def _probe_until_all_partitions(cg: ConsumerGroup, bootstrap: str, topic: str) -> None:
    """Produce a probe to every partition each second until the group received one from each: its share
    partitions are then started (the mock starts them at "latest", on a member's first fetch)."""
    deadline = time.monotonic() + 120
    while not cg.wait(lambda: len(cg.probe_partitions) == PARTITIONS, 1.0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"probes not consumed from {bootstrap}: {sorted(cg.probe_partitions)}")
        produce(bootstrap, topic, PARTITIONS, PROBE, one_per_partition=True)


def consume_rate(bootstrap: str, topic: str, group: str, n_consumers: int, records: int, batch_records: int,
                 *, fresh: bool, settle_s: float = 0.0, on_backlog: Callable[[], None] | None = None) -> float:
    """Records/s from the first backlog record received to the last.

    fresh: the backlog is produced first and `n_consumers` new members then drain it (after a primer member
    started the share partitions and left). Not fresh ("live"): the members join, receive probes, settle for
    `settle_s` (assignments reach later members with their next heartbeat), then keep polling while the
    backlog is produced — for when producing is much faster than consuming, as with the mock, which also
    restarts a group's share partitions at "latest" once the group emptied, so "fresh" cannot work there.
    (librdkafka's ShareConsumer fetches in the background even when the application does not poll, so
    pausing the members while producing would not hold the work back either.)"""
    if fresh:
        primer = ConsumerGroup(bootstrap, group, topic, 1)
        try:
            primer.running.set()
            _probe_until_all_partitions(primer, bootstrap, topic)
        finally:
            primer.close()
        produce(bootstrap, topic, records, VALUE, batch_records=batch_records)
        if on_backlog is not None:
            on_backlog()
    cg = ConsumerGroup(bootstrap, group, topic, n_consumers)
    try:
        cg.running.set()
        if not fresh:
            _probe_until_all_partitions(cg, bootstrap, topic)
            time.sleep(settle_s)
            if on_backlog is not None:
                on_backlog()
            produce(bootstrap, topic, records, VALUE, batch_records=batch_records)
        if not cg.wait(lambda: cg.records >= records, 600):
            raise RuntimeError(f"only {cg.records}/{records} consumed from {bootstrap}")
        return records / (cg.last_record_at - cg.first_record_at)
    finally:
        cg.close()


def shoal_topic(bootstrap: str, topic: str, group: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                             incremental_configs=[entry])]).values():
        f.result(30)


def mock_topic(bootstrap: str, topic: str) -> None:
    """The mock creates a 4-partition topic on first use; it must exist before the group subscribes."""
    produce(bootstrap, topic, 1, b"init")


# ---- a large state log -------------------------------------------------------------------------------


class Wire:
    """Pipelined raw requests on one connection."""

    def __init__(self, bootstrap: str):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=120)
        self.correlation = 0
        self.pending: list[tuple[int, int, int]] = []

    def send(self, api_key: int, version: int, body: Any) -> None:
        self.correlation += 1
        frame = messages.encode_request(body, api_key, version, self.correlation, "bench")
        self.sock.sendall(struct.pack(">i", len(frame)) + bytes(frame))
        self.pending.append((self.correlation, api_key, version))

    def receive(self) -> Any:
        correlation, api_key, version = self.pending.pop(0)
        size = struct.unpack(">i", self._read(4))[0]
        got, resp = messages.decode_response(self._read(size), api_key, version)
        assert got == correlation
        return resp

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf


def topic_id(bootstrap: str, topic: str) -> bytes:
    w = Wire(bootstrap)
    md = messages.MetadataRequest
    w.send(ApiKey.METADATA, 12, md(topics=[md.MetadataRequestTopic(name=topic, topic_id=b"\x00" * 16)],  # type: ignore[attr-defined]
                                   allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    [t] = w.receive().topics
    w.sock.close()
    return bytes(t.topic_id)


def fill_state_log(bootstrap: str, state_records: int, groups: int = 20, partitions: int = 50) -> int:
    """InitializeShareGroupState for groups x partitions keys, then rounds of one WriteShareGroupState per
    group covering all its partitions (one ShareUpdate per key, each with an ACKNOWLEDGED and an AVAILABLE
    batch, SPSO advancing by 10). Returns the number of state records written."""
    topic = f"reload-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    tid = topic_id(bootstrap, topic)
    init = messages.InitializeShareGroupStateRequest
    write = messages.WriteShareGroupStateRequest
    wires = [Wire(bootstrap) for _ in range(4)]
    window = 16
    for g in range(groups):
        wires[0].send(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, init(group_id=f"reload-g{g}", topics=[
            init.InitializeStateData(topic_id=tid, partitions=[  # type: ignore[attr-defined]
                init.PartitionData(partition=p, state_epoch=0, start_offset=0)  # type: ignore[attr-defined]
                for p in range(partitions)])]))
    for _ in range(groups):
        wires[0].receive()
    rounds = max(1, state_records // (groups * partitions))
    k = 0
    for r in range(rounds):
        base = r * 10
        for g in range(groups):
            body = write(group_id=f"reload-g{g}", topics=[write.WriteStateData(topic_id=tid, partitions=[  # type: ignore[attr-defined]
                write.PartitionData(partition=p, state_epoch=0, leader_epoch=0, start_offset=base,  # type: ignore[attr-defined]
                                    delivery_complete_count=5, state_batches=[
                                        write.StateBatch(first_offset=base + 10, last_offset=base + 14,  # type: ignore[attr-defined]
                                                         delivery_state=2, delivery_count=1),
                                        write.StateBatch(first_offset=base + 15, last_offset=base + 19,  # type: ignore[attr-defined]
                                                         delivery_state=0, delivery_count=1)])
                for p in range(partitions)])])
            w = wires[k % len(wires)]
            k += 1
            w.send(ApiKey.WRITE_SHARE_GROUP_STATE, 1, body)
            if len(w.pending) >= window:
                _check_write(w.receive())
    for w in wires:
        while w.pending:
            _check_write(w.receive())
        w.sock.close()
    return groups * partitions * (rounds + 1)


def _check_write(resp: Any) -> None:
    errors = {p.error_code for t in resp.results for p in t.partitions} - {0}
    if errors:
        raise RuntimeError(f"WriteShareGroupState errors {errors}")


# ---- main ------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--state-records", type=int, default=200_000)
    ap.add_argument("--mock-records", type=int, default=30_000,
                    help="backlog for the mock, which drops old log segments of a long partition")
    ap.add_argument("--sections", default="shoal,mock,reload", help="comma-separated subset to run")
    args = ap.parse_args()
    sections = set(args.sections.split(","))

    tmp = Path(tempfile.mkdtemp(prefix="bench-share-"))
    print(f"# share-group bench: {args.records} records x {len(VALUE)} B, {PARTITIONS} partitions, "
          f"implicit acks, {os.cpu_count()} CPUs")
    shoal = Shoal(tmp / "data", tmp / "broker.log").start()
    try:
        print(f"shoal cold start to SHOAL_READY: {shoal.ready_seconds:.2f} s")
        for batch in BATCH_RECORDS if "shoal" in sections else ():
            for fresh in (True, False):
                for n in (1, 4):
                    topic, group = f"bs{n}-{uuid.uuid4().hex[:6]}", f"bsg{n}-{uuid.uuid4().hex[:6]}"
                    shoal_topic(shoal.bootstrap, topic, group)
                    before = [0]

                    def mark(box: list[int] = before) -> None:
                        box[0] = shoal.state_log_bytes()

                    rate = consume_rate(shoal.bootstrap, topic, group, n, args.records, batch, fresh=fresh,
                                        settle_s=2.0, on_backlog=mark)
                    time.sleep(1.0)  # the closing consumers' last acknowledgements
                    per_record = (shoal.state_log_bytes() - before[0]) / args.records
                    print(f"shoal  {'backlog' if fresh else 'live   '} {n} consumer(s), producer batches <= "
                          f"{batch:>5} rec: {rate:>9,.0f} rec/s   __share_group_state: {per_record:.2f} B/accepted "
                          "record", flush=True)

        if "mock" in sections:
            mock, mock_bs = start_mock()
            try:
                for batch in BATCH_RECORDS:
                    for n in (1, 4):
                        topic, group = f"ms{n}-{uuid.uuid4().hex[:6]}", f"msg{n}-{uuid.uuid4().hex[:6]}"
                        mock_topic(mock_bs, topic)
                        rate = consume_rate(mock_bs, topic, group, n, args.mock_records, batch, fresh=False,
                                            settle_s=6.0)
                        print(f"mock   live    {n} consumer(s), producer batches <= {batch:>5} rec: "
                              f"{rate:>9,.0f} rec/s   ({args.mock_records} records)", flush=True)
            finally:
                mock.terminate()
                mock.wait(15)

        if "reload" not in sections:
            return 0
        started = time.perf_counter()
        written = fill_state_log(shoal.bootstrap, args.state_records)
        fill_s = time.perf_counter() - started
        size = shoal.state_log_bytes()
        print(f"state log filled: {written:,} records via WriteShareGroupState in {fill_s:.1f} s "
              f"({written / fill_s:,.0f} records/s); __share_group_state now {size / 1e6:.1f} MB", flush=True)
        shoal.kill()
        shoal.start()
        loaded = shoal.coordinators_loaded_seconds()
        print(f"restart after kill -9: process start to SHOAL_READY {shoal.ready_seconds:.2f} s; "
              f"'coordinators loaded' {loaded} s")
    finally:
        shoal.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
