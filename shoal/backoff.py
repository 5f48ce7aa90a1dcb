"""Exponential backoff for background retries (any layer), which also decides when a failure is worth a log line.

A retry that keeps failing (a persister that is down, a partition that is gone) must neither spin nor
flood the log: each key waits twice as long after every failure, up to a ceiling, and its failures are
logged at the first one and then at most once per ceiling interval.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _State:
    delay: float
    next_attempt: float
    last_logged: float | None = None
    suppressed: int = 0


class Backoff:
    def __init__(self, initial: float = 1.0, maximum: float = 60.0):
        self.initial = initial
        self.maximum = maximum
        self._keys: dict[Hashable, _State] = {}

    def ready(self, key: Hashable, now: float) -> bool:
        """Whether a retry for `key` may run now (keys that never failed always may)."""
        state = self._keys.get(key)
        return state is None or now >= state.next_attempt

    def next_attempt(self, key: Hashable) -> float | None:
        """When a retry for `key` may run next (None: it never failed)."""
        state = self._keys.get(key)
        return None if state is None else state.next_attempt

    def failed(self, key: Hashable, now: float) -> int | None:
        """Record a failure; returns how many failures went unlogged since the last line if this one should
        be logged, else None."""
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _State(self.initial, now + self.initial)
        else:
            state.delay = min(state.delay * 2, self.maximum)
            state.next_attempt = now + state.delay
        if state.last_logged is None or now - state.last_logged >= self.maximum:
            suppressed, state.suppressed, state.last_logged = state.suppressed, 0, now
            return suppressed
        state.suppressed += 1
        return None

    def succeeded(self, key: Hashable) -> None:
        self._keys.pop(key, None)

    def forget(self, key: Hashable) -> None:
        self._keys.pop(key, None)
