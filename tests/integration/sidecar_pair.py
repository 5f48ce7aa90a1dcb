"""A standalone Shoal broker process as the upstream and a second Shoal process as its sidecar."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY


@contextmanager
def upstream_and_sidecar(base: Path, *, upstream_overrides: Iterable[str] = (),
                         sidecar_overrides: Iterable[str] = ()) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    upstream = BrokerProcess(base / "upstream", overrides=[*NO_JOIN_DELAY, *upstream_overrides]).start()
    try:
        sidecar = BrokerProcess(base / "sidecar", overrides=[
            "node.id=7", f"upstream.bootstrap.servers={upstream.bootstrap}", *FAST_HEARTBEAT,
            *sidecar_overrides]).start()
        try:
            yield upstream, sidecar
        finally:
            sidecar.stop()
    finally:
        upstream.stop()
