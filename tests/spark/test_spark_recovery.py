"""A Spark driver killed with SIGKILL in the middle of a micro-batch and restarted from its checkpoint,
writing to the parquet file sink: exactly once in checkpoint mode, at least once in commit mode. The same
through a Shoal sidecar whose executors read straight from its upstream (the suite's broker).

The jobs run in processes of their own, and the output is read without a SparkSession (the file sink's log
names the committed files), so this module needs no session and runs beside the session's tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from shoal.client.admin import Admin
from shoal.client.spark.journal import DEFAULT_JOURNAL_TOPIC
from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import create_topic, produce, set_group_config
from tests.integration.test_metrics import scrape

from .conftest import BROKER_OVERRIDES, spark_env

JOB = Path(__file__).with_name("share_query_job.py")
REPO = Path(__file__).resolve().parents[2]
RECORDS = 3000
FORWARDED_FETCH_BYTES = "shoal_upstream_forwarded_fetch_bytes_total"


@dataclass(frozen=True)
class Deployment:
    """`shoal` is what the driver acquires through; behind a sidecar, `upstream` holds the topics and the
    executors read from it."""

    shoal: BrokerProcess
    upstream: BrokerProcess | None = None

    @property
    def data(self) -> BrokerProcess:
        return self.upstream or self.shoal

    def job_args(self) -> list[str]:
        return [] if self.upstream is None else [f"upstream={self.upstream.bootstrap}"]


@pytest.fixture(scope="module")
def sidecar(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A Shoal sidecar in front of the suite's broker (a standalone Shoal as the upstream)."""
    proc = BrokerProcess(tmp_path_factory.mktemp("spark-sidecar") / "data", overrides=[
        *BROKER_OVERRIDES, "node.id=7", f"upstream.bootstrap.servers={broker.bootstrap}"]).start()
    yield proc
    proc.stop()


def _start_job(where: Deployment, topic: str, group: str, base: Path, mode: str, *extra: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(JOB), where.shoal.bootstrap, topic, group, str(base / "ckpt"), str(base / "out"),
            mode, "1000", str(base / "control"), *extra, *where.job_args()]
    env = {**os.environ, **spark_env(), "PYTHONPATH": str(REPO)}
    with open(base / "jobs.log", "ab") as log_file:
        # Own session: the driver, its JVM and every Python worker can be killed together.
        return subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process in the job's session (pyspark's worker daemon makes its own process group)."""
    victims = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == proc.pid:  # field 6 of /proc/<pid>/stat: session id
            victims.append(int(entry.name))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def _batch_ids(ckpt: Path, log: str) -> set[int]:
    return {int(p.name) for p in (ckpt / log).iterdir() if p.name.isdigit()}


def _source_offset(ckpt: Path, batch: int) -> dict[str, Any]:
    """The source's end offset for `batch` in Spark's offset log (version, metadata, then one line per source)."""
    return json.loads((ckpt / "offsets" / str(batch)).read_text().splitlines()[-1])


class CrashRun:
    """One mode's scenario: a streaming job that is SIGKILLed inside a micro-batch, then a restart from its
    checkpoint that drains the topic. Both modes run side by side to share the JVMs' start-up time."""

    def __init__(self, where: Deployment, base: Path, mode: str) -> None:
        self.where, self.base, self.mode = where, base, mode
        name = f"spark-crash-{mode}" if where.upstream is None else f"spark-crash-sidecar-{mode}"
        self.topic, self.group = name, f"{name}-group"
        self.ckpt, self.control, self.log = base / "ckpt", base / "control", base / "jobs.log"
        self.control.mkdir(parents=True)
        create_topic(where.data.bootstrap, self.topic, 3)
        # Share groups, and so their configs, belong to the Shoal the driver acquires through.
        set_group_config(where.shoal.bootstrap, self.group, share_auto_offset_reset="earliest")
        self.produced = {(p, o) for p, o, _ in produce(where.data.bootstrap, self.topic, RECORDS, partitions=3)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        self.proc = _start_job(self.where, self.topic, self.group, self.base, self.mode, *extra)

    def _alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]

    def hanging(self, deadline: float) -> bool:
        """True once a task hangs inside a batch (the job hangs only after one batch has committed)."""
        self._alive()
        assert time.monotonic() < deadline, f"{self.mode}: no batch to kill in: " + self.log.read_text()[-3000:]
        return (self.control / "hanging").exists()

    def kill(self) -> None:
        assert self.proc is not None
        _kill_session(self.proc)
        (self.control / "hang").unlink()
        self.in_flight = _batch_ids(self.ckpt, "offsets") - _batch_ids(self.ckpt, "commits")
        assert self.in_flight, "the kill did not land inside a micro-batch"
        offset = _source_offset(self.ckpt, max(self.in_flight))
        self.member, self.in_flight_ranges = offset["member"], offset["ranges"]
        assert self.in_flight_ranges  # the offset log says exactly what the batch holds

    def wait_drained(self) -> None:
        assert self.proc is not None
        try:
            assert self.proc.wait(180) == 0, self.log.read_text()[-3000:]
        finally:
            if self.proc.poll() is None:
                _kill_session(self.proc)
        assert _source_offset(self.ckpt, max(_batch_ids(self.ckpt, "offsets")))["member"] == self.member

    def check(self) -> None:
        rows = committed_rows(self.base / "out", ["partition", "offset", "deliveryCount"])
        seen = Counter((r["partition"], r["offset"]) for r in rows)
        assert set(seen) == self.produced  # none missing
        if self.mode == "checkpoint":
            # The killed batch was replayed by offset, with the rows it had: nothing twice.
            assert all(n == 1 for n in seen.values()), [r for r, n in seen.items() if n > 1][:10]
        else:
            # Commit mode: the killed batch's records came back to the group and were read again, later.
            redelivered = {(r["partition"], r["offset"]) for r in rows if r["deliveryCount"] > 1}
            in_flight_offsets = {
                (int(p), o) for parts in self.in_flight_ranges.values() for p, rs in parts.items()
                for first, last, _, _ in rs for o in range(first, last + 1)
            }
            assert in_flight_offsets <= redelivered
        with Admin(self.where.shoal.bootstrap) as admin:
            offsets = admin.list_share_group_offsets(self.group, [self.topic])
        assert {o.lag for o in offsets.values()} == {0}


def committed_rows(out: Path, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of the parquet files the file sink committed: its log (`_spark_metadata`, one JSON entry a
    line after a version line, in per-batch and compacted files) names them, so a file the killed batch
    left half-written is not read, as Spark's own reader skips it."""
    committed: set[str] = set()
    removed: set[str] = set()
    for log in (out / "_spark_metadata").iterdir():
        if log.name.startswith("."):  # Hadoop's checksum files and temporaries
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            (committed if entry["action"] == "add" else removed).add(entry["path"].removeprefix("file://"))
    files = sorted(committed - removed)
    assert files, f"the file sink committed nothing in {out}"
    return pq.read_table(files, columns=columns).to_pylist()


def _forwarded_fetch_bytes(sidecar: BrokerProcess, topic: str) -> float:
    samples, _ = scrape(sidecar)
    return samples.get((FORWARDED_FETCH_BYTES, (("topic", topic),)), 0.0)


def test_killed_driver_restarts_exactly_once_in_checkpoint_mode_at_least_once_in_commit_mode(
    broker: BrokerProcess, sidecar: BrokerProcess, tmp_path: Path
) -> None:
    """Standalone in both modes, and through a sidecar whose executors read the upstream (checkpoint mode,
    where exactly-once is at stake), the three side by side to share the JVMs' start-up time."""
    standalone, behind_sidecar = Deployment(broker), Deployment(sidecar, upstream=broker)
    runs = [CrashRun(standalone, tmp_path / mode, mode) for mode in ("checkpoint", "commit")]
    through = CrashRun(behind_sidecar, tmp_path / "sidecar", "checkpoint")
    runs.append(through)
    try:
        # Run 1 streams until a batch has committed; a task of the next batch stops mid-batch, and the job's
        # whole process tree is SIGKILLed.
        for run in runs:
            (run.control / "hang").touch()
            run.start()
        deadline = time.monotonic() + 240
        waiting = list(runs)
        while waiting:
            waiting = [run for run in waiting if not run.hanging(deadline)]
            time.sleep(0.2)
        for run in runs:
            run.kill()
        # Run 2 from the same checkpoint drains the topic and ends by itself.
        for run in runs:
            run.start("once")
        for run in runs:
            run.wait_drained()
    finally:
        for run in runs:
            if run.proc is not None and run.proc.poll() is None:
                _kill_session(run.proc)
    for run in runs:
        run.check()
    # No record of the data topic passed through the sidecar: the executors fetched from the upstream.
    # The counter does count: the restarted driver read its acquisition journal through the sidecar.
    assert _forwarded_fetch_bytes(sidecar, through.topic) == 0
    assert _forwarded_fetch_bytes(sidecar, DEFAULT_JOURNAL_TOPIC) > 0
