"""Runs the real broker as a child process on a free loopback port, as a user would start it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

READY_PREFIX = "SHOAL_READY "

# Internal topics with a few partitions instead of Kafka's 50: each partition is a directory, a log and a
# coordinator shard to create and load at every start. A test about those counts overrides them.
SMALL_INTERNAL_TOPICS = (
    "offsets.topic.num.partitions=4",
    "share.coordinator.state.topic.num.partitions=4",
    "transaction.state.log.num.partitions=4",
)


class BrokerProcess:
    def __init__(self, data_dir: Path, overrides: Iterable[str] = (), log_path: Path | None = None,
                 extra_listeners: Iterable[str] = (), config_file: Path | None = None,
                 command: Iterable[str] | None = None):
        self.data_dir = data_dir
        # A server.properties of its own: then its listeners and log.dirs are used as they are.
        self.config_file = config_file
        # A complete command line instead of the default one (which picks listeners and log.dirs itself).
        self.command = None if command is None else list(command)
        self.overrides = list(overrides)
        # More listeners after the PLAINTEXT one, as NAME://host:port (port 0 picks a free one).
        self.extra_listeners = list(extra_listeners)
        # Bound port of every listener by name, from the SHOAL_READY line.
        self.ports: dict[str, int] = {}
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-broker.log"
        self.proc: subprocess.Popen[str] | None = None
        self.port: int = 0
        self.metrics_port: int | None = None
        self._log_file: IO[str] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def address(self, listener: str) -> str:
        """host:port of a listener by name (e.g. "SASL_SSL")."""
        return f"127.0.0.1:{self.ports[listener.upper()]}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        # Reuse the previous port on restart so clients holding the old address reconnect.
        listener = f"PLAINTEXT://127.0.0.1:{self.port}"
        for extra in self.extra_listeners:
            name, _, rest = extra.partition("://")
            host, _, port = rest.rpartition(":")
            listener += f",{name}://{host}:{self.ports.get(name.upper(), int(port))}"
        args = [sys.executable, "-m", "shoal.broker.server.main"]
        if self.config_file is not None:
            args.append(str(self.config_file))
        else:
            args += ["--override", f"listeners={listener}", "--override", f"log.dirs={self.data_dir}"]
        args += ["--override", "metrics.port=0"]
        # The test's own overrides come after these defaults, so they win.
        for item in [*SMALL_INTERNAL_TOPICS, *self.overrides]:
            args += ["--override", item]
        if self.command is not None:
            args = self.command
        self._log_file = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._log_file, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(READY_PREFIX):
                break
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}; see {self.log_path}")
        else:
            raise RuntimeError(f"broker not ready after {timeout}s; see {self.log_path}")
        info: dict[str, Any] = json.loads(line[len(READY_PREFIX) :])
        self.port = int(info["listeners"][0]["port"])
        self.ports = {lst["name"]: int(lst["port"]) for lst in info["listeners"]}
        self.metrics_port = info.get("metrics_port")
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        return self

    @staticmethod
    def _drain(stream: IO[str]) -> None:
        for _ in stream:
            pass

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final flush, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log_file is not None:
            self._log_file.close()
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
