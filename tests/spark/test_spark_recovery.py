"""At-least-once across a killed Spark driver: kill the query's whole process tree mid-stream, restart it
from the same checkpoint, and check that nothing is lost and nothing already accepted comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from shoal.client.admin import Admin
from tests.integration.broker_process import BrokerProcess
from tests.integration.share_clients import create_topic, produce, set_group_config

from .conftest import spark_env

JOB = Path(__file__).with_name("share_query_job.py")
REPO = Path(__file__).resolve().parents[2]


def _start_job(broker: BrokerProcess, topic: str, group: str, ckpt: Path, out: Path, run: str, log: Path,
               *extra: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(JOB), broker.bootstrap, topic, group, str(ckpt), str(out), run, "300", *extra]
    env = {**os.environ, **spark_env(), "PYTHONPATH": str(REPO)}
    with open(log, "ab") as log_file:
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


def _batches(out: Path, run: str) -> dict[int, list[tuple[int, int, int]]]:
    found = {}
    for path in out.glob(f"{run}-batch-*.json"):
        found[int(path.stem.rsplit("-", 1)[1])] = [tuple(r) for r in json.loads(path.read_text())]
    return found


def _source_offset(ckpt: Path, batch: int) -> dict[str, object]:
    """The source's end offset for `batch` from Spark's offset log (version line, metadata line, then one
    line per source)."""
    lines = (ckpt / "offsets" / str(batch)).read_text().splitlines()
    return json.loads(lines[-1])


def test_killed_driver_restarts_from_checkpoint_without_loss(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "spark-crash", "spark-crash-group"
    create_topic(broker.bootstrap, topic, 3)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="earliest")
    produced = {(p, o) for p, o, _ in produce(broker.bootstrap, topic, 6000, partitions=3)}
    ckpt, out, log = tmp_path / "ckpt", tmp_path / "out", tmp_path / "jobs.log"
    out.mkdir()

    # The first run hangs inside its 4th data batch (batch ids start at 0, which comes out empty), after
    # the sink has seen its rows but before Spark commits it; then its whole process tree is SIGKILLed.
    first = _start_job(broker, topic, group, ckpt, out, "run1", log, "4")
    hanging = out / "run1-hanging.json"
    try:
        deadline = time.monotonic() + 180
        while not hanging.exists():
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run never got going: " + log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        _kill_session(first)
    in_flight = json.loads(hanging.read_text())
    assert in_flight["rows"] > 0

    # What the checkpoint says at the moment of the crash. latestOffset accepts batch N before Spark can
    # write offsets/N+1, so every batch followed by another planned batch had been accepted.
    planned = {int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit()}
    committed = {int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit()}
    assert in_flight["batch"] in planned - committed
    run1 = _batches(out, "run1")
    accepted_batches = {n for n in run1 if n + 1 in planned}
    assert accepted_batches, "nothing was accepted before the kill; the test proves nothing"
    accepted = [(p, o) for n in accepted_batches for p, o, _ in run1[n]]
    # The share-group member id is checkpointed with every offset.
    member = _source_offset(ckpt, max(planned))["member"]
    assert member and all(_source_offset(ckpt, n)["member"] == member for n in planned)

    # The restarted query rejoins as the killed query's member, so it holds every partition from its first
    # batch on: it must not wait for the killed member's session (45 s) to time out.
    second = _start_job(broker, topic, group, ckpt, out, "run2", log)
    checked_members = False
    try:
        deadline = time.monotonic() + 120
        while True:
            if not checked_members and any(_batches(out, "run2").values()):
                with Admin(broker.bootstrap) as admin:
                    members = admin.describe_share_groups([group])[group].members
                assert [m.member_id for m in members] == [member]
                assert members[0].assignment == [(topic, p) for p in range(3)]
                checked_members = True
            seen_now = {(p, o) for rows in [*run1.values(), *_batches(out, "run2").values()] for p, o, _ in rows}
            if seen_now >= produced:
                break
            assert second.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{len(produced - seen_now)} records never arrived"
            time.sleep(0.5)
    finally:
        _kill_session(second)
    run2 = _batches(out, "run2")
    assert checked_members
    later = {int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit()} - planned
    assert later and all(_source_offset(ckpt, n)["member"] == member for n in later)

    seen = Counter((p, o) for rows in [*run1.values(), *run2.values()] for p, o, _ in rows)
    assert set(seen) == produced
    assert all(seen[r] == 1 for r in accepted), "a record accepted before the kill was delivered again"
    assert sum(len(rows) for rows in run2.values()) > 0
    # A batch planned but not committed at the crash is replayed with the same offsets: it comes out empty,
    # since its records were never accepted and the broker hands them out again in later batches.
    for n in planned - committed:
        assert run2.get(n) == [], f"replayed batch {n} was not empty"
    # The in-flight batch's records came back, with a higher delivery count.
    first_count = {(p, o): d for rows in run1.values() for p, o, d in rows}
    again = {(p, o): d for rows in run2.values() for p, o, d in rows if (p, o) in first_count}
    assert {(p, o) for p, o, _ in run1[in_flight["batch"]]} <= set(again)
    assert all(d > first_count[r] for r, d in again.items())
