"""Compare the working tree against a baseline commit, on this machine, alternating between them.

Both builds are installed into venvs of their own in a temporary directory: the baseline from `git archive`
of the commit named in bench/BASELINE (or given on the command line), the working tree from its tracked and
untracked-but-not-ignored files. Each venv sees this interpreter's site-packages for the dependencies, so
only Shoal itself differs. Then, for `--rounds` rounds (baseline first in even rounds, the working tree
first in odd ones), each build gets a fresh broker and the same confluent-kafka workload:

- produce acks=1 and acks=all: N records of 100 B (300k by default, as the issue's table: at 100k a share
  drain lasts a tenth of a second and its rate swung by a fifth between identical builds) to a 4-partition
  topic, linger.ms=5;
- plain consume: an assigned Consumer (default fetch settings) drains the acks=1 topic, timed from the first
  record received to the last; then again with fetch.queue.backoff.ms at 10 ms, as librdkafka's consumer
  queue stall sets the first figure (see bench_produce_fetch.py);
- share consume: one ShareConsumer (implicit acknowledgement) drains the same topic, timed from the first
  record received (after its group join) to the last (both from bench_produce_fetch.py);
- produce-to-delivery latency at a fixed offered load (bench_latency.py, linger.ms=1), plain and share:
  p50/p99/p99.9;
- for each throughput figure, the broker's CPU time per record while it ran (from /proc): on a machine
  shared with other work, rates swing with the cores others take, CPU time per record much less.

It prints every run and, per figure, new/baseline: the median of the paired rounds' ratios (for latency the
ratio is of milliseconds, so below 1 is better). The machine is shared, so only paired ratios mean much.

Usage: python bench/bench_release.py [COMMIT] [--records 300000] [--rounds 2] [--latency-seconds 5]
       [--latency-rate 10000] [--new COMMIT] [--figures plain,share,acks-all,latency]

With --new, a second commit is measured instead of the working tree; with --figures, only some figures
(bisecting a regression of one figure between two commits: `--new C --figures share --latency-seconds 0`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_latency import create_topic as latency_topic
from bench_latency import delivery_latency
from bench_produce_fetch import NO_STALL, NO_STALL_LABEL, create_topic, fetch, produce, share_drain
from peers import broker_cpu_seconds, start_shoal, stop

BENCH = Path(__file__).resolve().parent
PARTITIONS = 4
VALUE = os.urandom(100)
# Figures where a larger number is better; the latency percentiles are better smaller.
PLAIN_NO_STALL = f"plain consume, {NO_STALL_LABEL.removeprefix('fetch, ')}"
THROUGHPUT = ("produce acks=1", "produce acks=all", "plain consume", PLAIN_NO_STALL, "share consume")
# What --figures may pick: the consumers, acks=all produce and the latency runs.
FIGURES = ("plain", "share", "acks-all", "latency")
# Per-record broker CPU and latency figures are better smaller.


def git(*args: str, cwd: Path = BENCH) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def export_commit(commit: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    # From the top: in a subdirectory `git archive` would take that subtree only.
    root = git("rev-parse", "--show-toplevel").strip()
    archive = subprocess.run(["git", "archive", commit], cwd=root, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def export_working_tree(dest: Path) -> None:
    """Tracked files as they are on disk, and untracked ones git does not ignore (symlinks kept)."""
    root = Path(git("rev-parse", "--show-toplevel").strip())
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=root).split("\0")
    for name in filter(None, names):
        src = root / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)


def make_venv(src: Path, venv: Path) -> str:
    """A venv holding Shoal built from `src` and reaching this interpreter's packages for its dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # A path line in a .pth adds that directory only: this venv's own editable Shoal (if any) is not loaded.
    Path(site, "_bench_release_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # This interpreter's pip installs into the venv (no pip bootstrapped into each venv).
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(src)],
                   check=True)
    return python


def describe_build(python: str, cwd: Path) -> str:
    # A baseline from before the fsync worker has no such module: it fsyncs in the executor.
    code = ("import shoal.protocol.records as r\n"
            "try:\n    from shoal.broker.storage.fsync_worker import _FsyncWorker as f\n"
            "except ImportError:\n    f = None\n"
            "print(r.__file__, 'compiled walk' if getattr(r, '_compiled_walk', None) else 'python walk',"
            " 'compiled fsync' if f else 'executor fsync')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def run_build(python: str, work: Path, args: argparse.Namespace) -> dict[str, float]:
    data_dir = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    proc, bootstrap = start_shoal(str(data_dir), python=python)
    out: dict[str, float] = {}

    def measure(figure: str, work: Callable[[], float]) -> None:
        """The figure, and the broker's CPU time per record while it ran (steadier than rates on a busy
        machine: it does not count the time the broker waited for a core)."""
        before = broker_cpu_seconds(proc.pid)
        out[figure] = work()
        out[f"{figure} broker us/rec"] = (broker_cpu_seconds(proc.pid) - before) / args.records * 1e6

    try:
        n = args.records
        figures = args.figures
        create_topic(bootstrap, "release-acks1", PARTITIONS)
        # The consumers read what this produce wrote, so it runs whenever they do.
        measure("produce acks=1", lambda: produce(bootstrap, "release-acks1", n, VALUE, PARTITIONS, "1").rate)
        if "plain" in figures:
            measure("plain consume", lambda: fetch(bootstrap, "release-acks1", n, PARTITIONS, len(VALUE)).rate)
            # librdkafka's consumer-queue stall of one second sets the figure above (bench_produce_fetch).
            measure(PLAIN_NO_STALL, lambda: fetch(bootstrap, "release-acks1", n, PARTITIONS, len(VALUE),
                                                  settings=NO_STALL).rate)
        if "share" in figures:
            measure("share consume", lambda: share_drain(bootstrap, "release-acks1", n).rate)
        if "acks-all" in figures:
            create_topic(bootstrap, "release-acksall", PARTITIONS)
            measure("produce acks=all",
                    lambda: produce(bootstrap, "release-acksall", n, VALUE, PARTITIONS, "all").rate)
        if args.latency_seconds > 0 and "latency" in figures:
            for kind in ("plain", "share"):
                topic = f"release-latency-{kind}"
                latency_topic(bootstrap, topic)
                lat = delivery_latency(bootstrap, topic, kind, rate=args.latency_rate, seconds=args.latency_seconds,
                                       warm_up=min(2.0, args.latency_seconds / 4))
                out[f"{kind} latency p50 ms"] = lat.p50_ms
                out[f"{kind} latency p99 ms"] = lat.p99_ms
                out[f"{kind} latency p99.9 ms"] = lat.p999_ms
    finally:
        stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", nargs="?", help="baseline commit (default: the one in bench/BASELINE)")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-seconds", type=float, default=5.0, help="0 skips the latency figures")
    parser.add_argument("--latency-rate", type=int, default=10_000)
    parser.add_argument("--new", metavar="COMMIT",
                        help="measure this commit instead of the working tree (e.g. to bisect a regression)")
    parser.add_argument("--figures", default=",".join(FIGURES),
                        help=f"comma-separated subset of {','.join(FIGURES)} (produce acks=1 always runs)")
    args = parser.parse_args()
    args.figures = set(args.figures.split(","))
    if not args.figures <= set(FIGURES):
        parser.error(f"--figures: not one of {','.join(FIGURES)}: {','.join(args.figures - set(FIGURES))}")
    commit = args.commit or (BENCH / "BASELINE").read_text().split()[0]
    resolved = git("rev-parse", "--short", commit).strip()
    new_label = "working tree" if args.new is None else git("rev-parse", "--short", args.new).strip()

    work = Path(tempfile.mkdtemp(prefix="shoal-release-"))
    try:
        print(f"building baseline {resolved} and {new_label} in {work}", flush=True)
        export_commit(resolved, work / "baseline-src")
        if args.new is None:
            export_working_tree(work / "new-src")
        else:
            export_commit(new_label, work / "new-src")
        builds = {"baseline": make_venv(work / "baseline-src", work / "baseline-venv"),
                  "new": make_venv(work / "new-src", work / "new-venv")}
        for name, python in builds.items():
            print(f"  {name}: {describe_build(python, work)}", flush=True)

        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "new": []}
        for r in range(args.rounds):
            order = ("baseline", "new") if r % 2 == 0 else ("new", "baseline")
            for name in order:
                started = time.monotonic()
                result = run_build(builds[name], work, args)
                runs[name].append(result)
                figures = "  ".join(f"{k}={v:,.0f}" if k in THROUGHPUT else f"{k}={v:,.2f}"
                                    for k, v in result.items())
                print(f"round {r + 1} {name:<8} ({time.monotonic() - started:.0f} s): {figures}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nnew ({new_label}) / baseline ({resolved}), {args.records:,} records x 100 B, {PARTITIONS} partitions,"
          f" {args.rounds} alternating rounds; latency at {args.latency_rate:,} rec/s")
    print(f"  {'figure':<24} {'baseline runs':>28} {'new runs':>28} {'paired ratios':>20} {'median':>7}")
    for key in runs["baseline"][0]:
        base = [run[key] for run in runs["baseline"]]
        new = [run[key] for run in runs["new"]]
        ratios = [n / b for n, b in zip(new, base, strict=True)]
        fmt = "{:,.0f}" if key in THROUGHPUT else "{:,.2f}"  # rates; the rest are ms and us/rec
        better = "higher is better" if key in THROUGHPUT else "lower is better"
        print(f"  {key:<24} {' '.join(fmt.format(v) for v in base):>28} {' '.join(fmt.format(v) for v in new):>28}"
              f" {' '.join(f'{x:.2f}' for x in ratios):>20} {statistics.median(ratios):>7.2f}  ({better})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
