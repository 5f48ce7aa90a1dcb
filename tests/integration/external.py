"""External-broker mode: with SHOAL_BOOTSTRAP=host:port set, tests marked `external` use that broker instead
of starting one, and every other integration test is skipped, because it needs a broker of its own."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "SHOAL_BOOTSTRAP"
SKIP_REASON = (
    f"{ENV} is set, so only tests marked `external` run (against that broker); this one is not: it needs a "
    "broker process of its own (it kills, restarts or reconfigures it, reads its log, data directory or "
    "metrics port, or uses extra listeners), or it tests no broker at all"
)


def external_bootstrap() -> str | None:
    """host:port of the broker to test instead of a child process, or None."""
    return os.environ.get(ENV) or None


@dataclass(frozen=True, slots=True)
class ExternalBroker:
    """The part of BrokerProcess that `external` tests may use: where to connect."""

    bootstrap: str
