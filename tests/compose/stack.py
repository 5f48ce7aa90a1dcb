"""Driving a docker-compose project from a test: the real images, containers and volumes.

The compose CLI is `docker compose` (v2) when the Docker CLI has it, else `docker-compose` (v1.29, which
Debian ships); SHOAL_COMPOSE names another. Every project gets `-p`, so it never shares containers or volumes
with the main stack (`shoal`) or the test stack (`shoal-test`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MAIN_COMPOSE = REPO / "docker" / "docker-compose.yml"
SIDECAR_COMPOSE = REPO / "docker" / "docker-compose.sidecar.yml"
# On top of SIDECAR_COMPOSE where the apache/kafka image cannot be had: a standalone Shoal broker upstream.
SIDECAR_SHOAL_UPSTREAM = REPO / "docker" / "docker-compose.sidecar.shoal-upstream.yml"
ENABLE_ENV = "SHOAL_COMPOSE_TESTS"


def compose_command() -> list[str]:
    named = os.environ.get("SHOAL_COMPOSE")
    if named:
        return shlex.split(named)
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def docker(*args: str, timeout: float = 120) -> str:
    run = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"docker {' '.join(args)}: {run.stderr[-2000:]}"
    return run.stdout


@dataclass
class Stack:
    """One compose project over `files` (a file and its overrides, in that order), with its host ports moved
    to free ones through the environment."""

    project: str
    files: tuple[Path, ...] = (MAIN_COMPOSE,)
    env: dict[str, str] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [*compose_command(), "-p", self.project, *(a for f in self.files for a in ("-f", str(f))), *args]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                             env={**os.environ, **self.env})
        if check:
            assert run.returncode == 0, f"{' '.join(argv)}: {run.stdout[-3000:]}{run.stderr[-3000:]}"
        return run

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        [info] = json.loads(docker("inspect", self.container(service)))
        assert isinstance(info, dict)
        return info

    def state(self, service: str) -> tuple[str, str, int, bool]:
        """Container id, start time, restart count, running: all four stay equal while it runs on untouched."""
        info = self.inspect(service)
        return info["Id"], info["State"]["StartedAt"], int(info["RestartCount"]), bool(info["State"]["Running"])

    def wait_healthy(self, service: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        status = ""
        while time.monotonic() < deadline:
            state = self.inspect(service)["State"]
            status = state.get("Health", {}).get("Status", "")
            if status == "healthy":
                return
            time.sleep(1)
        raise AssertionError(f"{service} not healthy ({status}): {self.logs(service)[-3000:]}")

    def logs(self, service: str) -> str:
        run = self.compose("logs", "--no-color", service, check=False)
        return run.stdout + run.stderr

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", check=False, timeout=300)


def main_stack(project: str, extra_env: Mapping[str, str] | None = None) -> Stack:
    """The main stack (docker/docker-compose.yml) with its published ports on free loopback ports."""
    env = {"SHOAL_PORT": str(free_port()), "SHOAL_METRICS_PORT": str(free_port()),
           "PROMETHEUS_PORT": str(free_port()), "GRAFANA_PORT": str(free_port()), **(extra_env or {})}
    return Stack(project, (MAIN_COMPOSE,), env)


def kafka_image() -> str:
    """The apache/kafka image the sidecar stack's brokers run."""
    services = yaml.safe_load(SIDECAR_COMPOSE.read_text())["services"]
    return next(str(s["image"]) for s in services.values() if str(s.get("image", "")).startswith("apache/kafka:"))


def sidecar_stack(project: str) -> Stack:
    """The sidecar stack (docker/docker-compose.sidecar.yml) with its sidecars' ports on free loopback ports:
    over Apache Kafka where its image is on this engine (`make compose-test` pulls it first if it can), else
    over the standalone Shoal upstream of docker-compose.sidecar.shoal-upstream.yml."""
    env = {f"SHOAL_{n}_{kind}PORT": str(free_port()) for n in (1, 2) for kind in ("", "METRICS_")}
    have_kafka = subprocess.run(["docker", "image", "inspect", kafka_image()], capture_output=True).returncode == 0
    return Stack(project, (SIDECAR_COMPOSE,) if have_kafka else (SIDECAR_COMPOSE, SIDECAR_SHOAL_UPSTREAM), env)
