"""Per-request cost of the broker's metrics: the working tree's BrokerMetrics against a baseline commit's.

Each simulated request makes the updates a small acks=all Produce makes, the way their callers make them:
bytes in (connection), records and bytes appended into the topic's cached children (partition log), one
log flush (produce), the request count and latency (connection) and bytes out (connection). The baseline's
broker/common/metrics.py is loaded from git beside the working tree's, so both run in one process,
alternating, and the printed ratio is new/baseline of µs per request with the empty loop's cost taken off.

Usage: python bench/bench_metrics.py [COMMIT] [--requests 200000] [--rounds 5]
(COMMIT defaults to 0900939, the last one counting these families with prometheus_client objects.)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from shoal.broker.common import metrics as new_metrics

BENCH = Path(__file__).resolve().parent
DEFAULT_BASELINE = "0900939"
APIS = ("Produce", "Fetch", "Metadata")
TOPICS = ("orders", "payments", "audit")


def baseline_module(commit: str) -> ModuleType:
    """The commit's metrics module, importing its siblings (share_metrics) from the working tree."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=BENCH, check=True,
                               capture_output=True, text=True).stdout.strip())
    source = subprocess.run(["git", "show", f"{commit}:broker/common/metrics.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    name = "shoal.broker.common._baseline_metrics"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "shoal.broker.common"
    sys.modules[name] = module
    exec(compile(source, f"{commit}:broker/common/metrics.py", "exec"), module.__dict__)
    return module


def run(metrics: Any, requests: int) -> float:
    """Seconds for `requests` simulated Produce requests, each with the metric updates the broker makes."""
    children = [(metrics.messages_in.labels(topic=t), metrics.log_bytes_in.labels(topic=t)) for t in TOPICS]
    bytes_in, bytes_out, fsyncs, observe = metrics.bytes_in, metrics.bytes_out, metrics.log_fsyncs, \
        metrics.observe_request
    napis, ntopics = len(APIS), len(TOPICS)
    start = time.perf_counter()
    for i in range(requests):
        bytes_in.inc(180)
        messages, size = children[i % ntopics]
        messages.inc(1)
        size.inc(120)
        fsyncs.inc(1)
        observe(APIS[i % napis], 0.0003)
        bytes_out.inc(60)
    return time.perf_counter() - start


def empty(requests: int) -> float:
    """The same loop with no metric updates: its cost is taken off both sides."""
    napis, ntopics = len(APIS), len(TOPICS)
    start = time.perf_counter()
    for i in range(requests):
        _ = (i % ntopics, APIS[i % napis])
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", nargs="?", default=DEFAULT_BASELINE, help="baseline commit")
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    old = baseline_module(args.commit)
    builds = {"baseline": old.BrokerMetrics, "new": new_metrics.BrokerMetrics}
    per_request: dict[str, list[float]] = {name: [] for name in builds}
    ratios = []
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        loop = empty(args.requests)
        round_us = {}
        for name in order:
            seconds = run(builds[name](), args.requests)
            round_us[name] = max(seconds - loop, 0.0) / args.requests * 1e6
            per_request[name].append(round_us[name])
        ratios.append(round_us["new"] / round_us["baseline"])
        print(f"round {r + 1}: baseline {round_us['baseline']:.3f} µs/request, new {round_us['new']:.3f} µs/request, "
              f"new/baseline {ratios[-1]:.3f}", flush=True)
    print(f"median: baseline {statistics.median(per_request['baseline']):.3f} µs/request, "
          f"new {statistics.median(per_request['new']):.3f} µs/request, "
          f"new/baseline {statistics.median(ratios):.3f} (baseline {args.commit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
