from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from tests.integration.external import SKIP_REASON, external_bootstrap

# Property tests check invariants, not speed: a first example that pays for a lazy import (numpy, pyarrow)
# on a loaded CI machine must not fail on hypothesis's default 200 ms deadline.
settings.register_profile("shoal", deadline=None)
settings.load_profile("shoal")

SPARK_SUITE = Path(__file__).parent / "spark"
BROKER_SUITES = [Path(__file__).parent / "integration", SPARK_SUITE]


def pytest_configure(config: pytest.Config) -> None:
    # The groups go to the workers in the order group_for_xdist sorts them (the longest first), not in
    # xdist's default order by test count, which put the Spark group (a few long tests) behind every module of
    # many short unit tests and made it the tail of the run.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_for_xdist(items)
    skip_unless_external(items)


def group_for_xdist(items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup`: every test that uses the SparkSession on one worker, so one JVM
    serves them all, and each other module on one worker, so its module-scoped broker starts once.

    The Spark suite is the longest, so it goes first: a worker starts on it at once while the others work
    through the rest. Spark tests that run a job in a process (and JVM) of their own need no session and
    go to any worker.
    """
    def uses_session(item: pytest.Item) -> bool:
        return "spark" in getattr(item, "fixturenames", ())

    for item in items:
        _put_in_group(item, "spark" if uses_session(item) else item.nodeid.split("::")[0])
    items.sort(key=lambda item: (not uses_session(item), not item.path.is_relative_to(SPARK_SUITE)))


def _put_in_group(item: pytest.Item, group: str) -> None:
    """Mark the item for xdist's loadgroup, and do what xdist's worker does with the mark: loadgroup
    schedules by a "@group" suffix on the node id. xdist 3.8 appends it to `item._nodeid`, which pytest 9
    no longer reads (the node id is `item._id`), so without this every test is scheduled on its own: a
    module's broker starts on every worker that gets one of its tests, and every worker that gets a Spark
    test starts a JVM."""
    item.add_marker(pytest.mark.xdist_group(group))
    if not getattr(item.config.option, "loadgroup", False) or item.nodeid.endswith(f"@{group}"):
        return
    item._id = type(item._id).parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


def skip_unless_external(items: list[pytest.Item]) -> None:
    """With SHOAL_BOOTSTRAP set, tests that need a broker of their own are skipped, saying why."""
    if external_bootstrap() is None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("external") is None and any(item.path.is_relative_to(d) for d in BROKER_SUITES):
            item.add_marker(skip)
