"""Sidecar scale-out: share consumption with 8 consumers through two sidecars of one sidecar group, against
the same through one sidecar, over one standalone Shoal upstream.

One upstream process, one sidecar in membership group `bench-one`, and two sidecars in group `bench-two`
(they split the share partitions and state partitions between them). Every round's topic is created and
filled straight on the upstream before any consuming, and the sidecars are given time to learn of the
topics, so the figures measure consumption, not topic discovery. Each round then drains one topic with
8 ShareConsumers (implicit acknowledgement) through the single sidecar and another through the pair,
alternating which goes first. Prints the median rates (from the first record received to the last), the
ratio two / one, and the cores the sidecar processes used while consuming (their CPU seconds, from
/proc, over the wall time). On a 2-core machine that also runs the upstream and the clients, the ratio
shows the cost of splitting the work more than the gain of a second machine.

Usage: python bench/bench_sidecar_scale.py [--records 300000] [--partitions 8] [--consumers 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_produce_fetch import create_topic, produce
from bench_share import ConsumerGroup
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from peers import start_shoal, stop

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(procs: list[subprocess.Popen[str]]) -> float:
    """User plus system CPU of the processes (every thread), from /proc/<pid>/stat."""
    total = 0
    for proc in procs:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def set_earliest(bootstrap: str, group: str) -> None:
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                             incremental_configs=[entry])]).values():
        f.result(30)


def drain(bootstrap: str, topic: str, group: str, records: int, consumers: int,
          sidecars: list[subprocess.Popen[str]]) -> tuple[float, float]:
    """(records per second from the first record to the last, cores the sidecars used meanwhile)."""
    set_earliest(bootstrap, group)
    time.sleep(1.5)  # a group config set through one sidecar reaches the others within about a second
    cg = ConsumerGroup(bootstrap, group, topic, consumers)
    try:
        cg.running.set()
        while not cg.first_record_at:
            time.sleep(0.01)
        cpu_before, wall_before = cpu_seconds(sidecars), time.perf_counter()
        if not cg.wait(lambda: cg.records >= records, 600):
            raise RuntimeError(f"only {cg.records}/{records} share-consumed through {bootstrap}")
        cpu_after, wall_after = cpu_seconds(sidecars), time.perf_counter()
        streaming = cg.last_record_at - cg.first_record_at
    finally:
        cg.close()
    return cg.records / streaming, (cpu_after - cpu_before) / (wall_after - wall_before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    base = tempfile.mkdtemp(prefix="bench-sidecar-scale-")
    small = ["offsets.topic.num.partitions=4", "share.coordinator.state.topic.num.partitions=4",
             "transaction.state.log.num.partitions=4"]
    upstream, up_addr = start_shoal(os.path.join(base, "upstream"), small)
    sidecars: dict[str, list[tuple[subprocess.Popen[str], str]]] = {"one": [], "two": []}
    try:
        for label, node_ids in (("one", [11]), ("two", [21, 22])):
            for node_id in node_ids:
                sidecars[label].append(start_shoal(os.path.join(base, f"sidecar-{node_id}"), [
                    *small, f"node.id={node_id}", f"upstream.bootstrap.servers={up_addr}",
                    f"upstream.membership.group.id=bench-{label}"]))
        topics = {(label, r): f"bench-scale-{label}-{r}" for r in range(args.rounds) for label in sidecars}
        for topic in topics.values():
            create_topic(up_addr, topic, args.partitions)
            produce(up_addr, topic, args.records, value, args.partitions, "1")
        time.sleep(8)  # the sidecars re-read the upstream's topics every few seconds, then rebalance
        rates: dict[str, list[float]] = {label: [] for label in sidecars}
        cores: dict[str, list[float]] = {label: [] for label in sidecars}
        for r in range(args.rounds):
            order = ["one", "two"] if r % 2 == 0 else ["two", "one"]
            for label in order:
                procs = [p for p, _ in sidecars[label]]
                bootstrap = ",".join(addr for _, addr in sidecars[label])
                rate, used = drain(bootstrap, topics[(label, r)], f"bench-scale-{label}-{r}-{time.time_ns()}",
                                   args.records, args.consumers, procs)
                rates[label].append(rate)
                cores[label].append(used)
        print(f"{args.records:,} records x {args.value_bytes} B over {args.partitions} partitions, "
              f"{args.consumers} share consumers, upstream: one standalone Shoal; {args.rounds} rounds")
        for label in sidecars:
            print(f"  {label} sidecar(s): {sorted(rates[label])[len(rates[label]) // 2]:>12,.0f} rec/s "
                  f"(rounds: {', '.join(f'{x:,.0f}' for x in rates[label])}), "
                  f"sidecar cores used {', '.join(f'{c:.2f}' for c in cores[label])}")
        ratios = [two / one for one, two in zip(rates["one"], rates["two"], strict=True)]
        print(f"  two sidecars / one, per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    finally:
        for pairs in sidecars.values():
            for proc, _ in pairs:
                stop(proc)
        stop(upstream)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
