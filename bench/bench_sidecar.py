"""Sidecar mode's data path: produce and plain consumption through a sidecar, next to the same work sent
straight to its upstream (a standalone Shoal broker process).

One upstream and one sidecar (`upstream.bootstrap.servers` pointing at the upstream), both their own
processes on loopback. confluent-kafka produces N records (100-byte values, acks=1, linger 5 ms) and
reads them back with an assigned Consumer, once against the upstream directly and once through the
sidecar, each on its own topic, alternating the two (and which goes first) for `--rounds` rounds (the machine's load moves the
figures between runs; alternating exposes both paths to it alike). Prints the median rates and the ratios
sidecar / direct of the medians.

Share consumption: a confluent-kafka ShareConsumer pointed at the sidecar drains the topic produced
straight to the upstream (the sidecar acquires from the upstream's records through its batch cache),
against the plain Consumer reading that topic from the upstream. Two share rates: from the subscription
to the last record (the group's join and first heartbeat included), and from the first record received to
the last, the span the plain reads are timed over (bench_produce_fetch.fetch), so the ratios use that one.

Two plain reads from the upstream: with the client's default settings, and with fetch.queue.backoff.ms at
10 ms. With the defaults librdkafka's fetcher stops for a whole second each time its queue holds
queued.min.messages (100k) records, so that figure is set by how many such pauses fall into the drain: the
same build reads about 0.25M or about 1.2M records/s from one run to the next. The second read shows what
the upstream serves when the client does not pause; both ratios are printed.

Share-state writes: the sidecar writes its share state to the upstream in transactions, with
transaction.version 2 when the upstream finalizes it (standalone Shoal does). A second sidecar with
`upstream.state.transaction.version=1` (its own membership group, so neither fences the other) drains
the same topic with a group of its own in each round, so the two transaction protocols are paired in one
run: "share consume sidecar tv1" against "share consume sidecar". Whichever of the two consumes first in a
round also waits for its sidecar to discover the new topic (the upstream metadata refresh), which the second
finds done: they alternate, so pair them with an even `--rounds`, or compare the "1st rec on" figures.

Usage: python bench/bench_sidecar.py [--records 300000] [--value-bytes 100] [--partitions 4] [--rounds 3]
       [--no-tv1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench_produce_fetch import NO_STALL, Result, create_topic, fetch, line, produce, share_from_earliest
from bench_share import ConsumerGroup
from peers import start_shoal, stop
from sidecar_scale import two_vs_one


def share_consume(bootstrap: str, topic: str, group: str, records: int, value_bytes: int) -> tuple[Result, Result]:
    """One ShareConsumer (implicit acknowledgement) drains `records` from the earliest offset: (from the
    subscription, from the first record)."""
    share_from_earliest(bootstrap, group)
    started = time.perf_counter()
    cg = ConsumerGroup(bootstrap, group, topic, 1)
    try:
        cg.running.set()
        if not cg.wait(lambda: cg.records >= records, 600):
            raise RuntimeError(f"only {cg.records}/{records} share-consumed from {bootstrap}")
        whole, streaming = cg.last_record_at - started, cg.last_record_at - cg.first_record_at
    finally:
        cg.close()
    return Result(cg.records, whole, cg.records * value_bytes), Result(cg.records, streaming, cg.records * value_bytes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-tv1", action="store_true", help="skip the sidecar writing its state with TV1")
    parser.add_argument("--no-scale", action="store_true",
                        help="skip two sidecars against one, 8 share consumers over 8 partitions (sidecar_scale.py, "
                             "after the rest, with brokers of its own)")
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    n, parts = args.records, args.partitions
    base = tempfile.mkdtemp(prefix="bench-sidecar-")
    small = ["offsets.topic.num.partitions=4", "share.coordinator.state.topic.num.partitions=4",
             "transaction.state.log.num.partitions=4"]
    upstream, up_addr = start_shoal(os.path.join(base, "upstream"), small)
    sidecar = tv1 = None
    try:
        sidecar, side_addr = start_shoal(os.path.join(base, "sidecar"),
                                         [*small, "node.id=2", f"upstream.bootstrap.servers={up_addr}",
                                          "upstream.membership.group.id=bench-sidecar"])
        if not args.no_tv1:
            tv1, tv1_addr = start_shoal(os.path.join(base, "sidecar-tv1"),
                                        [*small, "node.id=3", f"upstream.bootstrap.servers={up_addr}",
                                         "upstream.membership.group.id=bench-sidecar-tv1",
                                         "upstream.state.transaction.version=1"])
        runs: dict[str, list[Result]] = {}
        for round_ in range(args.rounds):
            order = [("direct", up_addr), ("sidecar", side_addr)]
            for label, addr in order if round_ % 2 == 0 else order[::-1]:  # neither path always goes first
                topic = f"bench-{label}-{round_}"
                create_topic(addr, topic, parts)
                runs.setdefault(f"produce {label}", []).append(produce(addr, topic, n, value, parts, "1"))
                runs.setdefault(f"consume {label}", []).append(fetch(addr, topic, n, parts, args.value_bytes))
                runs.setdefault(f"consume {label}, no stall", []).append(
                    fetch(addr, topic, n, parts, args.value_bytes, settings=NO_STALL))
                if label == "direct":
                    sharers = [("", side_addr)] + ([] if tv1 is None else [(" tv1", tv1_addr)])
                    for suffix, addr in sharers if round_ % 2 == 0 else sharers[::-1]:
                        group = f"bench-share{suffix.strip()}-{round_}-{time.time_ns()}"
                        whole, streaming = share_consume(addr, topic, group, n, args.value_bytes)
                        runs.setdefault(f"share consume sidecar{suffix}", []).append(whole)
                        runs.setdefault(f"share sidecar{suffix}, 1st rec on", []).append(streaming)
        results = {label: sorted(rs, key=lambda r: r.rate)[len(rs) // 2] for label, rs in runs.items()}
        print(f"{n:,} records x {args.value_bytes} B over {parts} partitions, upstream: one standalone Shoal; "
              f"median of {args.rounds} rounds")
        for label, r in results.items():
            spread = statistics.pstdev([x.rate for x in runs[label]]) / r.rate if len(runs[label]) > 1 else 0.0
            print(line(label, r) + f"  spread {spread:.0%}")
        produce_ratio = results["produce sidecar"].rate / results["produce direct"].rate
        print(f"  produce through the sidecar / produce direct: {produce_ratio:.2f}")
        for stall in ("", ", no stall"):
            consume_ratio = results[f"consume sidecar{stall}"].rate / results[f"consume direct{stall}"].rate
            print(f"  consume{stall} through the sidecar / direct: {consume_ratio:.2f}")
        for plain in ("consume direct", "consume direct, no stall"):
            share_ratio = results["share sidecar, 1st rec on"].rate / results[plain].rate
            whole_ratio = results["share consume sidecar"].rate / results[plain].rate
            print(f"  share consume through the sidecar / plain {plain.removeprefix('consume ')}: "
                  f"{share_ratio:.2f} (from the subscription: {whole_ratio:.2f})")
            if tv1 is not None:
                tv1_ratio = results["share sidecar tv1, 1st rec on"].rate / results[plain].rate
                print(f"    the same, state written with transaction.version 1: {tv1_ratio:.2f}")
    finally:
        for proc in (sidecar, tv1):
            if proc is not None:
                stop(proc)
        stop(upstream)
        shutil.rmtree(base, ignore_errors=True)
    if not args.no_scale:
        two_vs_one(records=n, value_bytes=args.value_bytes, rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
