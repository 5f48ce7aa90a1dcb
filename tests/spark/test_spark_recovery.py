"""A Spark driver killed with SIGKILL in the middle of a micro-batch and restarted from its checkpoint,
writing to the parquet file sink: exactly once in checkpoint mode, at least once in commit mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.client.admin import Admin
from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import create_topic, produce, set_group_config

from .conftest import spark_env

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOB = Path(__file__).with_name("share_query_job.py")
REPO = Path(__file__).resolve().parents[2]
RECORDS = 3000


def _start_job(broker: BrokerProcess, topic: str, group: str, base: Path, mode: str, *extra: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(JOB), broker.bootstrap, topic, group, str(base / "ckpt"), str(base / "out"), mode,
            "1000", str(base / "control"), *extra]
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

    def __init__(self, broker: BrokerProcess, base: Path, mode: str) -> None:
        self.broker, self.base, self.mode = broker, base, mode
        self.topic, self.group = f"spark-crash-{mode}", f"spark-crash-{mode}-group"
        self.ckpt, self.control, self.log = base / "ckpt", base / "control", base / "jobs.log"
        self.control.mkdir(parents=True)
        create_topic(broker.bootstrap, self.topic, 3)
        set_group_config(broker.bootstrap, self.group, share_auto_offset_reset="earliest")
        self.produced = {(p, o) for p, o, _ in produce(broker.bootstrap, self.topic, RECORDS, partitions=3)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        self.proc = _start_job(self.broker, self.topic, self.group, self.base, self.mode, *extra)

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

    def check(self, spark: SparkSession) -> None:
        # The file sink's log decides which files are part of the output.
        rows = spark.read.parquet(str(self.base / "out")).select("partition", "offset", "deliveryCount").collect()
        seen = Counter((r.partition, r.offset) for r in rows)
        assert set(seen) == self.produced  # none missing
        if self.mode == "checkpoint":
            # The killed batch was replayed by offset, with the rows it had: nothing twice.
            assert all(n == 1 for n in seen.values()), [r for r, n in seen.items() if n > 1][:10]
        else:
            # Commit mode: the killed batch's records came back to the group and were read again, later.
            redelivered = {(r.partition, r.offset) for r in rows if r.deliveryCount > 1}
            in_flight_offsets = {
                (int(p), o) for parts in self.in_flight_ranges.values() for p, rs in parts.items()
                for first, last, _, _ in rs for o in range(first, last + 1)
            }
            assert in_flight_offsets <= redelivered
        with Admin(self.broker.bootstrap) as admin:
            offsets = admin.list_share_group_offsets(self.group, [self.topic])
        assert {o.lag for o in offsets.values()} == {0}


def test_killed_driver_restarts_exactly_once_in_checkpoint_mode_at_least_once_in_commit_mode(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    runs = [CrashRun(broker, tmp_path / mode, mode) for mode in ("checkpoint", "commit")]
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
        run.check(spark)
