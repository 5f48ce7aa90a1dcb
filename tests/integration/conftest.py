from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .broker_process import BrokerProcess
from .external import ExternalBroker, external_bootstrap

# The heartbeat interval is bounded by group.share.min.heartbeat.interval.ms (5000 by default), as in Kafka.
FAST_HEARTBEAT = ["group.share.min.heartbeat.interval.ms=1000", "group.share.heartbeat.interval.ms=1000"]
# A new classic group completes its first rebalance at once instead of waiting 3 s for more members.
NO_JOIN_DELAY = ["group.initial.rebalance.delay.ms=0"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess | ExternalBroker]:
    """One broker per test module (starting one takes a moment); tests use distinct topic names.
    With SHOAL_BOOTSTRAP set, the broker there instead (only `external` tests get this far)."""
    bootstrap = external_bootstrap()
    if bootstrap is not None:
        yield ExternalBroker(bootstrap)
        return
    base = tmp_path_factory.mktemp("broker")
    # A short heartbeat interval lets share consumers get their first assignment sooner.
    proc = BrokerProcess(base / "data", overrides=[*FAST_HEARTBEAT, *NO_JOIN_DELAY]).start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own, for tests that kill or reconfigure it."""
    proc = BrokerProcess(tmp_path / "data", overrides=FAST_HEARTBEAT)
    yield proc
    proc.stop()
