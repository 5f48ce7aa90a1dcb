"""Kafka's exponential backoff, for reconnects and for connection setup timeouts."""

from __future__ import annotations

import random


def exponential_backoff_ms(initial_ms: float, max_ms: float, attempts: int, jitter: float = 0.2) -> float:
    """Kafka's ExponentialBackoff: `initial_ms` doubled `attempts` times, at most `max_ms`, then spread by
    up to `jitter` either way so that clients failing together do not retry together."""
    term = min(initial_ms * 2 ** min(attempts, 32), max_ms)
    return term * random.uniform(1 - jitter, 1 + jitter) if jitter > 0 else term
