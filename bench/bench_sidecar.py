"""Sidecar mode's data path: produce and plain consumption through a sidecar, next to the same work sent
straight to its upstream (a standalone Shoal broker process).

One upstream and one sidecar (`upstream.bootstrap.servers` pointing at the upstream), both their own
processes on loopback. confluent-kafka produces N records (100-byte values, acks=1, linger 5 ms) and
reads them back with an assigned Consumer, once against the upstream directly and once through the
sidecar, each on its own topic. Prints the rates and the ratios sidecar / direct.

Usage: python bench/bench_sidecar.py [--records 300000] [--value-bytes 100] [--partitions 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from bench_produce_fetch import Result, create_topic, fetch, line, produce
from peers import start_shoal, stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
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
        results: dict[str, Result] = {}
        for label, addr in (("direct", up_addr), ("sidecar", side_addr)):
            topic = f"bench-{label}"
            create_topic(addr, topic, parts)
            results[f"produce {label}"] = produce(addr, topic, n, value, parts, "1")
            results[f"consume {label}"] = fetch(addr, topic, n, parts, args.value_bytes)
        print(f"{n:,} records x {args.value_bytes} B over {parts} partitions, upstream: one standalone Shoal")
        for label, r in results.items():
            print(line(label, r))
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
