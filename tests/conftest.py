from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from tests.integration.external import SKIP_REASON, external_bootstrap

# Property tests check invariants, not speed: a first example that pays for a lazy import (numpy, pyarrow)
# on a loaded CI machine must not fail on hypothesis's default 200 ms deadline.
settings.register_profile("shoal", deadline=None)
settings.load_profile("shoal")

BROKER_SUITES = [Path(__file__).parent / "integration", Path(__file__).parent / "spark"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With SHOAL_BOOTSTRAP set, tests that need a broker of their own are skipped, saying why."""
    if external_bootstrap() is None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("external") is None and any(item.path.is_relative_to(d) for d in BROKER_SUITES):
            item.add_marker(skip)
