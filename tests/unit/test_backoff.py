"""Backoff for background retries: delays grow to a ceiling, and failures are logged at a bounded rate."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from shoal.backoff import Backoff


@given(st.lists(st.floats(0.0, 30.0), min_size=1, max_size=300))
def test_log_lines_and_attempts_are_bounded(gaps: list[float]) -> None:
    """Whatever the tick pattern, a key that keeps failing is logged at most once per ceiling interval
    (plus the first), every failure is accounted for, and attempts are never closer than the initial delay."""
    backoff = Backoff(initial=1.0, maximum=60.0)
    now = 0.0
    logged_at: list[float] = []
    attempts: list[float] = []
    accounted = 0
    for gap in gaps:
        now += gap
        if not backoff.ready("k", now):
            continue
        attempts.append(now)
        suppressed = backoff.failed("k", now)
        if suppressed is not None:
            logged_at.append(now)
            accounted += suppressed + 1
    # The backoff compares `now` with a deadline it summed the same way; the test's subtraction can come out
    # one float step short (0.9 + 1.0 - 0.9 < 1.0), which is rounding, not an early attempt.
    eps = 1e-9
    assert all(b - a >= 60.0 - eps for a, b in pairwise(logged_at))
    assert all(b - a >= 1.0 - eps for a, b in pairwise(attempts))
    assert accounted <= len(attempts)


def test_delay_doubles_to_the_ceiling_and_resets_on_success() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0)
    now = 0.0
    waits = []
    for _ in range(6):
        backoff.failed("k", now)
        start = now
        while not backoff.ready("k", now):
            now += 0.5
        waits.append(now - start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    backoff.succeeded("k")
    assert backoff.ready("k", now) and backoff.failed("k", now) == 0
