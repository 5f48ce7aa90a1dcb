"""Client-side sensors: totals, averages, maxima and rates over a sliding window, as Kafka's client metrics."""

from __future__ import annotations

import time
from collections import deque

# Kafka's clients compute rates and windowed averages over 2 samples of 30 s each.
WINDOW_S = 30.0


class Sensor:
    """Records values; gives the lifetime total/count and windowed avg/max/rate."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.total = 0.0
        self.count = 0
        self._samples: deque[tuple[float, float]] = deque()
        self._created = time.monotonic()

    def record(self, value: float = 1.0) -> None:
        now = time.monotonic()
        self.total += value
        self.count += 1
        self._samples.append((now, value))
        self._expire(now)

    def _expire(self, now: float) -> None:
        cutoff = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] < cutoff:
            samples.popleft()

    def avg(self) -> float:
        self._expire(time.monotonic())
        if not self._samples:
            return 0.0
        return sum(v for _, v in self._samples) / len(self._samples)

    def max(self) -> float:
        self._expire(time.monotonic())
        return max((v for _, v in self._samples), default=0.0)

    def rate(self) -> float:
        """Sum of values per second over the window (or over the sensor's life if that is shorter)."""
        now = time.monotonic()
        self._expire(now)
        elapsed = min(self.window_s, max(now - self._created, 1e-3))
        return sum(v for _, v in self._samples) / elapsed

    def count_rate(self) -> float:
        """Events per second over the window."""
        now = time.monotonic()
        self._expire(now)
        elapsed = min(self.window_s, max(now - self._created, 1e-3))
        return len(self._samples) / elapsed
