"""Sidecar mode's data path: produce and plain consumption through a sidecar, next to the same work sent
straight to its upstream (a standalone Shoal broker process).

One upstream and one sidecar (`upstream.bootstrap.servers` pointing at the upstream), both their own
processes on loopback. confluent-kafka produces N records (100-byte values, acks=1, linger 5 ms) and
reads them back with an assigned Consumer, once against the upstream directly and once through the
sidecar, each on its own topic, alternating the two (and which goes first) for `--rounds` rounds (the machine's load moves the
figures between runs; alternating exposes both paths to it alike). Prints the median rates and the ratios
sidecar / direct of the medians.

Usage: python bench/bench_sidecar.py [--records 300000] [--value-bytes 100] [--partitions 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from bench_produce_fetch import Result, create_topic, fetch, line, produce
from peers import start_shoal, stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    n, parts = args.records, args.partitions
    base = tempfile.mkdtemp(prefix="bench-sidecar-")
    small = ["offsets.topic.num.partitions=4", "share.coordinator.state.topic.num.partitions=4",
             "transaction.state.log.num.partitions=4"]
    upstream, up_addr = start_shoal(os.path.join(base, "upstream"), small)
    sidecar = None
    try:
        sidecar, side_addr = start_shoal(os.path.join(base, "sidecar"),
                                         [*small, "node.id=2", f"upstream.bootstrap.servers={up_addr}"])
        runs: dict[str, list[Result]] = {}
        for round_ in range(args.rounds):
            order = [("direct", up_addr), ("sidecar", side_addr)]
            for label, addr in order if round_ % 2 == 0 else order[::-1]:  # neither path always goes first
                topic = f"bench-{label}-{round_}"
                create_topic(addr, topic, parts)
                runs.setdefault(f"produce {label}", []).append(produce(addr, topic, n, value, parts, "1"))
                runs.setdefault(f"consume {label}", []).append(fetch(addr, topic, n, parts, args.value_bytes))
        results = {label: sorted(rs, key=lambda r: r.rate)[len(rs) // 2] for label, rs in runs.items()}
        print(f"{n:,} records x {args.value_bytes} B over {parts} partitions, upstream: one standalone Shoal; "
              f"median of {args.rounds} rounds")
        for label, r in results.items():
            spread = statistics.pstdev([x.rate for x in runs[label]]) / r.rate if len(runs[label]) > 1 else 0.0
            print(line(label, r) + f"  spread {spread:.0%}")
        produce_ratio = results["produce sidecar"].rate / results["produce direct"].rate
        consume_ratio = results["consume sidecar"].rate / results["consume direct"].rate
        print(f"  produce through the sidecar / produce direct: {produce_ratio:.2f}")
        print(f"  consume through the sidecar / consume direct: {consume_ratio:.2f}")
    finally:
        if sidecar is not None:
            stop(sidecar)
        stop(upstream)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
