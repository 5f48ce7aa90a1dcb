"""The brokers the benchmarks drive: a Shoal process, and librdkafka's mock cluster as a reference peer.

Both run as child processes on loopback. Run `python bench/peers.py --run-mock` to host the mock by hand.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

READY_PREFIX = "SHOAL_READY "


def start_shoal(data_dir: str, overrides: Iterable[str] = (), stderr: IO[str] | int = subprocess.DEVNULL
                ) -> tuple[subprocess.Popen[str], str]:
    """Start `shoal-broker` on a free port; returns the process and its bootstrap address. Overrides after
    the defaults win (e.g. log.level=info with `stderr` a file to read the broker's log)."""
    args = [
        sys.executable, "-m", "shoal.broker.server.main",
        "--override", "listeners=PLAINTEXT://127.0.0.1:0",
        "--override", f"log.dirs={data_dir}",
        "--override", "log.level=WARNING",
    ]
    for item in overrides:
        args += ["--override", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX):
            port = json.loads(line[len(READY_PREFIX):])["listeners"][0]["port"]
            # Keep reading stdout so the broker never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return proc, f"127.0.0.1:{port}"
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("shoal broker did not start")


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run_mock_forever() -> None:
    """Child-process mode: host librdkafka's mock cluster, print its bootstrap servers, serve until killed."""
    from confluent_kafka import Producer

    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("mock")
    logger.addHandler(Capture())
    logger.setLevel(logging.DEBUG)
    holder = Producer({"test.mock.num.brokers": 1, "debug": "mock", "logger": logger})
    bootstrap = None
    deadline = time.monotonic() + 10
    while bootstrap is None and time.monotonic() < deadline:
        holder.poll(0.1)
        for line in lines:
            m = re.search(r"bootstrap\.servers=(\S+)", line)
            if m:
                bootstrap = m.group(1)
                break
    if bootstrap is None:
        sys.exit("mock cluster did not report its bootstrap servers")
    lines.clear()
    print(bootstrap, flush=True)
    while True:
        holder.poll(1.0)
        lines.clear()


def start_mock() -> tuple[subprocess.Popen[str], str]:
    """librdkafka's mock cluster in its own process; returns the process and its bootstrap address."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__)), "--run-mock"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise RuntimeError("mock cluster did not start")
    return proc, line


if __name__ == "__main__" and "--run-mock" in sys.argv:
    run_mock_forever()
