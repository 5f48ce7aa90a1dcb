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
from typing import TYPE_CHECKING

import pytest
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


def _source_offset(ckpt: Path, batch: int) -> dict[str, object]:
    """The source's end offset for `batch` in Spark's offset log (version, metadata, then one line per source)."""
    return json.loads((ckpt / "offsets" / str(batch)).read_text().splitlines()[-1])


@pytest.mark.parametrize("mode", ["checkpoint", "commit"])
def test_killed_driver_restarts_from_its_checkpoint(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path, mode: str
) -> None:
    topic, group = f"spark-crash-{mode}", f"spark-crash-{mode}-group"
    create_topic(broker.bootstrap, topic, 3)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    produced = {(p, o) for p, o, _ in produce(broker.bootstrap, topic, RECORDS, partitions=3)}
    ckpt, out, control, log = tmp_path / "ckpt", tmp_path / "out", tmp_path / "control", tmp_path / "jobs.log"
    control.mkdir()

    # Run 1 streams until a batch has committed, then a task of the next batch stops mid-batch and the
    # job's whole process tree is SIGKILLed.
    first = _start_job(broker, topic, group, tmp_path, mode)
    try:
        deadline = time.monotonic() + 180
        while not ((ckpt / "commits").exists() and _batch_ids(ckpt, "commits")):
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "run 1 never committed a batch: " + log.read_text()[-3000:]
            time.sleep(0.2)
        (control / "hang").touch()
        while not (control / "hanging").exists():
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "run 1 never reached a batch to hang in: " + log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        _kill_session(first)
    (control / "hang").unlink()
    in_flight = _batch_ids(ckpt, "offsets") - _batch_ids(ckpt, "commits")
    assert in_flight, "the kill did not land inside a micro-batch"
    member = _source_offset(ckpt, max(in_flight))["member"]
    in_flight_ranges = _source_offset(ckpt, max(in_flight))["ranges"]
    assert in_flight_ranges  # the offset log says exactly what the batch holds

    # Run 2 from the same checkpoint drains the topic and ends by itself.
    second = _start_job(broker, topic, group, tmp_path, mode, "once")
    try:
        assert second.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            _kill_session(second)
    assert _source_offset(ckpt, max(_batch_ids(ckpt, "offsets")))["member"] == member  # rejoined as itself

    # The file sink's log decides which files are part of the output.
    rows = spark.read.parquet(str(out)).select("partition", "offset", "deliveryCount").collect()
    seen = Counter((r.partition, r.offset) for r in rows)
    assert set(seen) == produced  # none missing
    if mode == "checkpoint":
        # The killed batch was replayed by offset, with the rows it had: nothing twice.
        assert all(n == 1 for n in seen.values()), [r for r, n in seen.items() if n > 1][:10]
    else:
        # Commit mode: the killed batch's records came back to the group and were read again, later.
        redelivered = {(r.partition, r.offset) for r in rows if r.deliveryCount > 1}
        in_flight_offsets = {
            (int(p), o) for parts in in_flight_ranges.values() for p, rs in parts.items()
            for first_o, last_o, _, _ in rs for o in range(first_o, last_o + 1)
        }
        assert in_flight_offsets <= redelivered
    with Admin(broker.bootstrap) as admin:
        offsets = admin.list_share_group_offsets(group, [topic])
    assert {o.lag for o in offsets.values()} == {0}
