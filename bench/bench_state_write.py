"""Sidecar share-state writes against a standalone Shoal upstream: the latency of one state write.

A sidecar writes its share state to the upstream as transactions, one transactional producer per state
partition (`broker/upstream/state_log.py`): with transaction.version 2 each write is a Produce v12 (which
adds the partition to the transaction) and an EndTxn v5; with 1, AddPartitionsToTxn first. This drives
that writer directly, without a sidecar process: one upstream broker process, and in this process an
`UpstreamStateLog` over a state topic of `--partitions` partitions.

Two loads, each for both transaction versions:
- serial: one write at a time on one partition (append, wait for its commit, next), as one share
  consumer's acknowledgements of one share partition arrive; prints writes/s and the median latency;
- parallel: a serial writer on each of the `--partitions` partitions at once (a ShareFetch acknowledging
  records of several share partitions writes to several state partitions).

Usage: python bench/bench_state_write.py [--writes 400] [--partitions 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import structlog
from peers import start_shoal, stop

from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS
from shoal.broker.upstream.cluster import UpstreamCluster
from shoal.broker.upstream.settings import parse_upstream
from shoal.broker.upstream.state_log import UpstreamStateLog
from shoal.broker.upstream.state_topics import ensure_state_topics
from shoal.coordinator.offset_metadata_manager import CommittedOffset, offset_commit_record


async def _writer(state_log: UpstreamStateLog, partition: int, writes: int, latencies: list[float]) -> None:
    for i in range(writes):
        record = offset_commit_record("bench", "t", partition, CommittedOffset(i, -1, "", 0))
        started = time.perf_counter()
        await state_log.append(partition, [record])
        latencies.append(time.perf_counter() - started)


async def _run(bootstrap: str, version: int, partitions: int, writes: int,
               parallel: bool) -> tuple[float, float, float]:
    """(writes per second, median and 90th percentile latency in ms) of one load."""
    cluster = UpstreamCluster(parse_upstream({"bootstrap.servers": bootstrap}))
    try:
        await cluster.start()
        topic = f"__shoal_bench_{uuid.uuid4().hex[:8]}"
        await ensure_state_topics(cluster, {topic: partitions}, None)
        state_log = UpstreamStateLog(cluster, topic, CONSUMER_OFFSETS, partitions, f"bench-{uuid.uuid4().hex[:6]}",
                                     max_transaction_version=version)
        used = list(range(partitions)) if parallel else [0]
        for p in used:
            await state_log.take(p)
        await asyncio.gather(*(_writer(state_log, p, 20, []) for p in used))  # warm-up
        latencies: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(*(_writer(state_log, p, writes, latencies) for p in used))
        elapsed = time.perf_counter() - started
        latencies.sort()
        return len(latencies) / elapsed, latencies[len(latencies) // 2] * 1000, latencies[len(latencies) * 9 // 10] * 1000
    finally:
        await cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=400, help="writes per writer")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    base = tempfile.mkdtemp(prefix="bench-state-write-")
    upstream, bootstrap = start_shoal(os.path.join(base, "upstream"), ["transaction.state.log.num.partitions=4"])
    runs: dict[str, list[tuple[float, float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for version in (2, 1):
                for parallel in (False, True):
                    label = f"tv{version} {'parallel x' + str(args.partitions) if parallel else 'serial'}"
                    runs.setdefault(label, []).append(
                        asyncio.run(_run(bootstrap, version, args.partitions, args.writes, parallel)))
    finally:
        stop(upstream)
        shutil.rmtree(base, ignore_errors=True)
    print(f"state writes against a standalone Shoal upstream, median of {args.rounds} rounds")
    for label, results in runs.items():
        rate = statistics.median(r[0] for r in results)
        latency = statistics.median(r[1] for r in results)
        p90 = statistics.median(r[2] for r in results)
        print(f"  {label:<18} {rate:8.0f} writes/s  latency median {latency:6.2f} ms, p90 {p90:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
