"""`make compat`: librdkafka's own broker tests against one Shoal broker.

Builds librdkafka and its test runner (tests/test-runner) into .cache/librdkafka-<version>, starts a Shoal
broker per scenario (a real process on a free loopback port, data in a temporary directory), writes the
test.conf the runner reads, runs every allow-listed test number once per mode with a timeout, and prints
the pass and fail counts with the failing tests. Exit status 1 only for failures the allow-list does not
expect; 2 when the build cannot be done (a missing package is named).

librdkafka's source comes from the npm registry: Confluent's JavaScript client ships it whole (tests/
included) in deps/librdkafka. LIBRDKAFKA_SOURCE=<dir> uses a source tree already on disk instead.

    python -m tests.compat.run_librdkafka_tests [--only 0001,0102] [--timeout 600] [--keep-logs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.compat.allowlist import (
    ALLOWLIST,
    Entry,
    Summary,
    check_against_source,
    judge,
    load,
    numbers_in_source,
    read_report,
)
from tests.integration.broker_process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"

# The newest librdkafka whose source the registries this project reaches carry, and the npm package
# version that bundles it. confluent-kafka's wheel may bundle a newer one (see docs/compat.md).
LIBRDKAFKA_VERSION = "2.15.1"
NPM_PACKAGE = "@confluentinc/kafka-javascript@1.10.1"
# librdkafka's RD_KAFKA_VERSION for that release, checked after unpacking.
RD_KAFKA_VERSION_HEX = "0x020f01ff"

# The Kafka version the tests are told the broker is: share-consumer tests need 4.2.
BROKER_VERSION = "4.2.0"

# What the build needs, as Debian packages, with a header or command that shows each is there.
BUILD_PACKAGES = {
    "build-essential": ("cmd", "g++"),
    "make": ("cmd", "make"),
    "python3": ("cmd", "python3"),
    "libssl-dev": ("header", "openssl/ssl.h"),
    "zlib1g-dev": ("header", "zlib.h"),
    "libzstd-dev": ("header", "zstd.h"),
    "liblz4-dev": ("header", "lz4.h"),
    "libsasl2-dev": ("header", "sasl/sasl.h"),
    # The tests check statistics JSON with it (0053); without it they skip.
    "rapidjson-dev": ("header", "rapidjson/schema.h"),
    "npm": ("cmd", "npm"),
}

# Broker settings of librdkafka's own test clusters (tests/scenarios/*.json, cluster_testing.py) that mean
# something on one node.
SCENARIO_OVERRIDES = {
    "default": ["auto.create.topics.enable=true", "num.partitions=4"],
    "noautocreate": ["auto.create.topics.enable=false", "num.partitions=4"],
}
COMMON_OVERRIDES = [
    "node.id=1",
    "group.share.enable=true",
    "group.share.min.record.lock.duration.ms=1000",
    "delete.topic.enable=true",
    # trivup's brokers run the standard authorizer, open to everyone until an ACL names a resource; the
    # admin tests create and delete ACLs.
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users=User:admin",
    "allow.everyone.if.no.acl.found=true",
]


class BuildError(RuntimeError):
    pass


def missing_packages() -> list[str]:
    missing = []
    for package, (kind, name) in BUILD_PACKAGES.items():
        if kind == "cmd":
            if shutil.which(name) is None:
                missing.append(package)
        elif not any(Path(d, name).exists() for d in ("/usr/include", "/usr/local/include",
                                                      "/usr/include/x86_64-linux-gnu",
                                                      "/usr/include/aarch64-linux-gnu")):
            missing.append(package)
    return missing


def ensure_packages(install: bool) -> None:
    missing = missing_packages()
    if not missing:
        return
    can_install = install and os.geteuid() == 0 and shutil.which("apt-get") is not None
    if not can_install:
        raise BuildError("missing build packages: " + " ".join(missing)
                         + "\n  install them with: apt-get install -y " + " ".join(missing))
    print(f"compat: installing {' '.join(missing)}", flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    still = missing_packages()
    if still:
        raise BuildError("still missing after apt-get install: " + " ".join(still))


def fetch_source(dest: Path) -> None:
    """Unpacks librdkafka's source tree into dest (which must not exist)."""
    local = os.environ.get("LIBRDKAFKA_SOURCE")
    if local:
        shutil.copytree(local, dest, symlinks=True)
        return
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        print(f"compat: fetching librdkafka {LIBRDKAFKA_VERSION} ({NPM_PACKAGE})", flush=True)
        packed = subprocess.run(["npm", "pack", "--silent", NPM_PACKAGE], cwd=tmp, check=True,
                                capture_output=True, text=True).stdout.split()
        if not packed:
            raise BuildError(f"npm pack {NPM_PACKAGE} printed no file name")
        prefix = "package/deps/librdkafka/"
        with tarfile.open(Path(tmp, packed[-1])) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name != prefix]
            if not members:
                raise BuildError(f"{NPM_PACKAGE} carries no deps/librdkafka")
            for member in members:
                member.name = member.name[len(prefix):]
            tar.extractall(dest, members=members, filter="data")
    header = (dest / "src" / "rdkafka.h").read_text()
    if f"#define RD_KAFKA_VERSION {RD_KAFKA_VERSION_HEX}" not in header:
        raise BuildError(f"{NPM_PACKAGE} does not carry librdkafka {LIBRDKAFKA_VERSION}")


# No libcurl (OIDC token fetch) nor GSSAPI: no allow-listed test uses them.
CONFIGURE = ["./configure", "--disable-curl", "--disable-gssapi"]


def build(source: Path, jobs: int) -> Path:
    """librdkafka and its test runner. Done once: a stamp records the configure line and the packages it
    found, and a change of either configures and makes again (make itself rebuilds only what changed)."""
    runner = source / "tests" / "test-runner"
    stamp = source / ".shoal-build"
    wanted = " ".join([*CONFIGURE, *sorted(BUILD_PACKAGES)]) + "\n"
    if runner.exists() and stamp.exists() and stamp.read_text() == wanted:
        return runner
    stamp.unlink(missing_ok=True)
    log = source.parent / f"librdkafka-{LIBRDKAFKA_VERSION}-build.log"
    print(f"compat: building librdkafka {LIBRDKAFKA_VERSION} in {source} (log: {log})", flush=True)
    steps = [CONFIGURE, ["make", f"-j{jobs}", "libs"], ["make", f"-j{jobs}", "-C", "tests", "build"]]
    with open(log, "a") as out:
        for step in steps:
            done = subprocess.run(["nice", *step], cwd=source, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise BuildError(f"{' '.join(step)} failed with {done.returncode}; see {log}")
    if not runner.exists():
        raise BuildError(f"the build made no {runner}; see {log}")
    stamp.write_text(wanted)
    return runner


def prepare(install: bool, jobs: int) -> Path:
    CACHE.mkdir(exist_ok=True)
    ensure_packages(install)
    source = CACHE / f"librdkafka-{LIBRDKAFKA_VERSION}"
    if not (source / "src" / "rdkafka.h").exists():
        if source.exists():
            shutil.rmtree(source)
        partial = source.with_name(source.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        fetch_source(partial)
        partial.rename(source)
    return build(source, jobs)


def write_test_conf(path: Path, bootstrap: str) -> None:
    path.write_text(
        f"bootstrap.servers={bootstrap}\n"
        # What librdkafka's own test clusters use (LibrdkafkaTestApp.py).
        "test.timeout.multiplier=2\n"
        # Topic names of their own per run, so a rerun never meets an earlier run's topics.
        "test.topic.random=true\n"
    )


@dataclass
class RunResult:
    states: dict[str, str] | None
    timed_out: float | None
    seconds: float


def run_test(runner: Path, number: str, mode: str, conf: Path, logs: Path, timeout: float) -> RunResult:
    report = logs / f"{number}-{mode}.json"
    report.unlink(missing_ok=True)
    env = {
        **os.environ,
        "TESTS": number,
        "TEST_KAFKA_VERSION": BROKER_VERSION,
        "RDKAFKA_TEST_CONF": str(conf),
        "TEST_REPORT": str(report),
        "LD_LIBRARY_PATH": f"{runner.parent.parent / 'src'}:{runner.parent.parent / 'src-cpp'}",
    }
    env.pop("CI", None)  # the runner would raise its own timeouts and parallelism
    if mode == "consumer":
        env["TEST_CONSUMER_GROUP_PROTOCOL"] = "consumer"
    else:
        env.pop("TEST_CONSUMER_GROUP_PROTOCOL", None)
    scenario = "noautocreate" if mode == "noautocreate" else "default"
    # -p1: one test at a time; -L: no broker-less tests. Not -Q: quick mode skips every SUB_TEST that is not
    # marked quick, which is most of the share-consumer tests.
    args = [str(runner), "-p1", "-L", "-s", scenario]
    started = time.monotonic()
    with open(logs / f"{number}-{mode}.log", "w") as out:
        proc = subprocess.Popen(args, cwd=runner.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return RunResult(None, timeout, time.monotonic() - started)
    seconds = time.monotonic() - started
    try:
        return RunResult(read_report(report.read_text()), None, seconds)
    except (OSError, ValueError, KeyError):
        return RunResult(None, None, seconds)


class Brokers:
    """One Shoal broker per scenario, started on first use and restarted if it died."""

    def __init__(self, root: Path):
        self.root = root
        self.running: dict[str, BrokerProcess] = {}
        self.restarts: list[str] = []

    def get(self, scenario: str) -> BrokerProcess:
        broker = self.running.get(scenario)
        if broker is not None and broker.alive():
            return broker
        if broker is not None:
            self.restarts.append(f"{scenario} broker died (exit {broker.proc and broker.proc.returncode}); "
                                 f"see {broker.log_path}")
            broker.stop()
        for other in list(self.running):
            if other != scenario:  # one broker at a time on a small machine
                self.running.pop(other).stop()
        data = self.root / f"{scenario}-data-{len(self.restarts)}"
        data.mkdir()
        broker = BrokerProcess(data, [*COMMON_OVERRIDES, *SCENARIO_OVERRIDES[scenario]],
                               log_path=self.root / f"{scenario}-broker.log").start(timeout=60)
        self.running[scenario] = broker
        return broker

    def stop(self) -> None:
        for broker in self.running.values():
            broker.stop()
        self.running.clear()


def select(entries: list[Entry], only: set[str] | None) -> list[tuple[Entry, str]]:
    runs = [(entry, mode) for entry in entries if entry.kind != "exclude" for mode in entry.modes]
    if only:
        runs = [(entry, mode) for entry, mode in runs if entry.number in only]
    # Group by scenario so each broker starts once.
    return sorted(runs, key=lambda run: run[1] == "noautocreate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    parser.add_argument("--only", help="comma-separated test numbers to run (of the allow-listed ones)")
    # A guard against a hang only: each test sets its own timeouts, and 0113 alone runs over ten minutes.
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per test run (default 1800)")
    parser.add_argument("--jobs", type=int, default=2, help="make -j for the build (default 2)")
    parser.add_argument("--no-install", action="store_true", help="only check the build packages")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--logs", type=Path, help="directory for the logs (default: a new temporary one)")
    args = parser.parse_args(argv)

    entries = load(args.allowlist)
    try:
        runner = prepare(install=not args.no_install, jobs=args.jobs)
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"compat: cannot build librdkafka's tests: {exc}", file=sys.stderr)
        return 2
    problems = check_against_source(entries, numbers_in_source((runner.parent / "test.c").read_text()))
    if problems:
        print(f"compat: {args.allowlist} does not match librdkafka {LIBRDKAFKA_VERSION}'s tests:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    if args.build_only:
        print(f"compat: built {runner}")
        return 0

    only = set(args.only.split(",")) if args.only else None
    runs = select(entries, only)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="shoal-compat-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"compat: {len(runs)} runs of librdkafka {LIBRDKAFKA_VERSION}'s tests; logs in {logs}", flush=True)
    brokers = Brokers(logs)
    summary = Summary()
    try:
        for entry, mode in runs:
            broker = brokers.get("noautocreate" if mode == "noautocreate" else "default")
            conf = logs / "test.conf"
            write_test_conf(conf, broker.bootstrap)
            result = run_test(runner, entry.number, mode, conf, logs, args.timeout)
            outcome = judge(entry.number, mode, entry.kind == "xfail", result.states, result.timed_out)
            summary.add(outcome)
            verdict = "pass" if outcome.passed else ("xfail" if outcome.expected_to_fail else "FAIL")
            print(f"compat: {outcome.label:<22} {verdict:<5} {result.seconds:6.1f}s {outcome.detail}", flush=True)
    except KeyboardInterrupt:
        print("compat: interrupted", file=sys.stderr)
    finally:
        brokers.stop()
    for note in brokers.restarts:
        print(f"compat: {note}")
    excluded = [entry for entry in entries if entry.kind == "exclude"]
    print(f"compat: {len(excluded)} tests excluded by the allow-list (see {args.allowlist.name})")
    for line in summary.lines():
        print(line)
    return summary.exit_status



if __name__ == "__main__":
    sys.exit(main())
