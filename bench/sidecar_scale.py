"""Sidecar scale-out: share consumption with 8 consumers through two sidecars of one sidecar group, against
the same through one sidecar, over one standalone Shoal upstream.

One upstream process, one sidecar alone in its membership group, and two sidecars sharing another (they
split the share partitions and the state partitions between them). Every round's topics are created and
filled straight on the upstream first, and each drain starts only once its sidecars' Metadata names a
leader for every partition (for the pair: both sidecars lead some, and they agree), so the figures
measure consumption, not topic discovery. Each round drains one topic with `consumers` ShareConsumers
(implicit acknowledgement) through the single sidecar and another through the pair (bootstrap = both
addresses), alternating which goes first. Prints the median records/s from the subscription to the
last record (the group's join included; librdkafka's ShareConsumer fetches in the background from its
subscription on, so records wait in the client before the first poll returns, and a rate from the first
record received flatters, the more so the fewer the records: it is printed beside), the ratio two / one
per round, and the CPU each sidecar process, the upstream and the consumers (this process) used during
the drain (their threads' CPU seconds from /proc/<pid>/task, over the drain's wall time: the cores used;
and per 100k records, which holds better than cores on a machine busy with other work). On a machine with few cores that also runs the upstream and the clients, the ratio shows
the cost of splitting the work more than the gain of a second machine.

A drain that stops making progress for `stall_s` fails with every consumer's count and each sidecar's
view of the topic's leaders, instead of waiting on.

Usage: python bench/sidecar_scale.py [--records 300000] [--partitions 8] [--consumers 8] [--rounds 2]
       [--batch-records 100] [--stall-s 60] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from bench_produce_fetch import create_topic, produce
from bench_share import ConsumerGroup
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from peers import broker_cpu_seconds, start_shoal, stop

SMALL_STATE = ["offsets.topic.num.partitions=4", "share.coordinator.state.topic.num.partitions=4",
               "transaction.state.log.num.partitions=4"]
# The sidecars re-read the upstream's topics every few seconds and then rebalance: a minute is plenty.
READY_S = 60.0
# Records per producer batch: about what a Java producer's default batch.size (16 KiB) holds of 100-byte
# values. A share fetch acquires and acknowledges whole batches, so batches of thousands of records would
# leave the sidecars next to idle and measure the clients alone.
BATCH_RECORDS = 100
# The sidecars' share-group heartbeat interval: consumers get their assignment with a heartbeat, so Kafka's
# 5 s would make the join most of a drain.
SIDECAR_SHARE_GROUPS = ["group.share.min.heartbeat.interval.ms=1000", "group.share.heartbeat.interval.ms=1000"]


@dataclass
class Deployment:
    """One sidecar group: its processes and bootstrap addresses."""

    label: str
    procs: list[subprocess.Popen[str]]
    addrs: list[str]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.addrs)


@dataclass
class Drain:
    rate: float  # records/s from the subscription to the last record
    streaming: float  # records/s from the first record received to the last (flatters: see the module doc)
    seconds: float  # from the subscription to the last record
    cores: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds / wall seconds


def _wait(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what()}")
        time.sleep(0.2)


def leaders(addr: str, topic: str) -> dict[int, int]:
    """Each partition's leader as the sidecar at `addr` answers Metadata (-1: none)."""
    md = AdminClient({"bootstrap.servers": addr}).list_topics(topic, timeout=10)
    found = md.topics.get(topic)
    if found is None or found.error is not None:
        return {}
    return {p: part.leader for p, part in found.partitions.items()}


def wait_led(deployment: Deployment, topic: str, partitions: int) -> None:
    """Until every sidecar of the deployment names a leader for every partition of the topic, all agree, and
    (for several) each sidecar leads some: the sidecar group has rebalanced over the new topic."""
    views: list[dict[int, int]] = []

    def ready() -> bool:
        views[:] = [leaders(addr, topic) for addr in deployment.addrs]
        first = views[0]
        return (len(first) == partitions and -1 not in first.values() and all(v == first for v in views)
                and len(set(first.values())) == len(deployment.addrs))

    _wait(ready, READY_S, lambda: f"{deployment.label}: leaders of {topic} as each sidecar sees them: {views}")


def set_earliest(deployment: Deployment, group: str) -> None:
    """share.auto.offset.reset=earliest through the first sidecar, then until every sidecar reports it (a
    group config set through one reaches the others within about a second)."""
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": deployment.addrs[0]})  # kept: its futures need the handle alive
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)

    def everywhere() -> bool:
        for addr in deployment.addrs:
            peer = AdminClient({"bootstrap.servers": addr})
            [future] = peer.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
            if future.result(30)["share.auto.offset.reset"].value != "earliest":
                return False
        return True

    _wait(everywhere, READY_S, lambda: f"{deployment.label}: the group config of {group} on every sidecar")


def drain(deployment: Deployment, topic: str, group: str, records: int, consumers: int, stall_s: float,
          watched: dict[str, int]) -> Drain:
    """`consumers` ShareConsumers drain `records` from the earliest offset through the deployment, timed
    from their subscription (the group's join included) to the last record. Fails once no record arrived
    for `stall_s` (before the first one too), with the per-consumer counts."""
    set_earliest(deployment, group)
    cpu_before = {name: broker_cpu_seconds(pid) for name, pid in watched.items()}
    started = time.perf_counter()
    cg = ConsumerGroup(deployment.bootstrap, group, topic, consumers)
    try:
        cg.running.set()
        seen, progress_at = 0, time.monotonic()
        while not cg.wait(lambda: cg.records >= records, 1.0):
            with cg.lock:
                now_seen = cg.records
            if now_seen != seen:
                seen, progress_at = now_seen, time.monotonic()
            elif time.monotonic() - progress_at > stall_s:
                views = {addr: leaders(addr, topic) for addr in deployment.addrs}
                raise RuntimeError(
                    f"{deployment.label}: the drain of {topic} stalled: no record for {stall_s:.0f} s, "
                    f"{seen}/{records} received; per consumer {cg.per_consumer}; leaders per sidecar {views}")
        wall = time.perf_counter() - started
        cores = {name: (broker_cpu_seconds(pid) - cpu_before[name]) / wall for name, pid in watched.items()}
        whole, streaming = cg.last_record_at - started, cg.last_record_at - cg.first_record_at
    finally:
        cg.close()
    return Drain(cg.records / whole, cg.records / streaming, whole, cores)


def two_vs_one(records: int = 300_000, value_bytes: int = 100, partitions: int = 8, consumers: int = 8,
               rounds: int = 2, batch_records: int = BATCH_RECORDS, stall_s: float = 60.0,
               log_dir: str | None = None) -> dict[str, list[Drain]]:
    """Drain `rounds` topics through one sidecar and as many through two (alternating which goes first) and
    print the figures; returns the drains by label ("one", "two"). `batch_records`: the most records the
    producer puts in one batch. `log_dir`: keep each process's stderr there (log.level=info) instead of
    discarding it."""
    value = os.urandom(value_bytes)
    base = tempfile.mkdtemp(prefix="bench-sidecar-scale-")
    logs: list[IO[str]] = []

    def start(name: str, overrides: list[str]) -> tuple[subprocess.Popen[str], str]:
        if log_dir is None:
            return start_shoal(os.path.join(base, name), overrides)
        os.makedirs(log_dir, exist_ok=True)
        err = open(os.path.join(log_dir, f"{name}.log"), "w")  # noqa: SIM115 (closed after the run)
        logs.append(err)
        return start_shoal(os.path.join(base, name), [*overrides, "log.level=INFO"], stderr=err)

    upstream, up_addr = start("upstream", SMALL_STATE)
    deployments: list[Deployment] = []
    try:
        for label, node_ids in (("one", [11]), ("two", [21, 22])):
            deployment = Deployment(label, [], [])
            deployments.append(deployment)
            for node_id in node_ids:
                proc, addr = start(f"sidecar-{node_id}", [
                    *SMALL_STATE, *SIDECAR_SHARE_GROUPS, f"node.id={node_id}", f"upstream.bootstrap.servers={up_addr}",
                    f"upstream.membership.group.id=bench-scale-{label}-{os.getpid()}"])
                deployment.procs.append(proc)
                deployment.addrs.append(addr)
        topics = {(d.label, r): f"bench-scale-{d.label}-{r}" for r in range(rounds) for d in deployments}
        for topic in topics.values():
            create_topic(up_addr, topic, partitions)
            produce(up_addr, topic, records, value, partitions, "1", batch_records=batch_records)
        drains: dict[str, list[Drain]] = {d.label: [] for d in deployments}
        for r in range(rounds):
            for d in deployments if r % 2 == 0 else deployments[::-1]:
                topic = topics[(d.label, r)]
                wait_led(d, topic, partitions)
                watched = {"upstream": upstream.pid} | {f"sidecar {i + 1}": p.pid for i, p in enumerate(d.procs)}
                watched["consumers (this process)"] = os.getpid()
                drains[d.label].append(drain(d, topic, f"{topic}-{time.time_ns()}", records, consumers, stall_s,
                                             watched))
        print(f"{records:,} records x {value_bytes} B (batches of {batch_records}) over {partitions} partitions, "
              f"{consumers} share consumers (implicit ack), upstream: one standalone Shoal; {rounds} rounds")
        for label, runs in drains.items():
            median = statistics.median(x.rate for x in runs)
            per_round = ", ".join(f"{x.rate:,.0f}" for x in runs)
            streaming = statistics.median(x.streaming for x in runs)
            print(f"  {label} sidecar{'s' if label == 'two' else ''}: {median:>10,.0f} rec/s (rounds: {per_round}; "
                  f"from the first record: {streaming:,.0f})")
            for x in runs:
                used = ", ".join(f"{name} {c:.2f} ({c * x.seconds / records * 1e5:.2f} s per 100k records)"
                                 for name, c in x.cores.items())
                print(f"      cores used over {x.seconds:.1f} s: {used}")
        ratios = [two.rate / one.rate for one, two in zip(drains["one"], drains["two"], strict=True)]
        print(f"  two sidecars / one: {statistics.median(ratios):.2f} (per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)})")
        return drains
    finally:
        for d in deployments:
            for proc in d.procs:
                stop(proc)
        stop(upstream)
        for f in logs:
            f.close()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-records", type=int, default=BATCH_RECORDS, help="most records per producer batch")
    parser.add_argument("--stall-s", type=float, default=60.0, help="fail a drain after this long without a record")
    parser.add_argument("--log-dir", help="keep the brokers' logs (INFO) in this directory")
    args = parser.parse_args()
    two_vs_one(args.records, args.value_bytes, args.partitions, args.consumers, args.rounds, args.batch_records,
               args.stall_s, args.log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
