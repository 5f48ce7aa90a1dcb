"""Which compacted log to clean next, and the cleaner's background task (Kafka's LogCleanerManager and
the CleanerThread loop).

The filthiest log goes first: any log past max.compaction.lag.ms, else the one with the highest dirty
ratio at or above min.cleanable.dirty.ratio, else one whose kept tombstones reached their delete
horizon. The clean itself runs on a dedicated thread; only planning (dup'ing a few fds) and the swap
(renames and list updates) happen on the event loop. With nothing to clean the task sleeps
log.cleaner.backoff.ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import structlog

from shoal.backoff import Backoff
from shoal.broker.storage.log_cleaner import (
    OFFSET_MAP_ENTRY_BYTES,
    CleanAborted,
    CleanPlan,
    CleanResult,
    Throttler,
    clean,
    dirty_ratio,
    first_dirty_offset,
    plan_clean,
    swap_in,
)
from shoal.broker.storage.partition_log import LogClosed, PartitionLog

log = structlog.get_logger(__name__)

_SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class CleanerConfig:
    """Kafka's log.cleaner.* broker keys that apply here."""

    enable: bool = True
    threads: int = 1
    backoff_ms: int = 15000
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = 1.7976931348623157e308

    @property
    def max_map_entries(self) -> int:
        per_thread = self.dedupe_buffer_size // max(1, self.threads)
        return max(1, int(per_thread * self.io_buffer_load_factor) // OFFSET_MAP_ENTRY_BYTES)


def grab_filthiest(logs: Iterable[PartitionLog], now_ms: int, busy: set[int]) -> PartitionLog | None:
    """The compacted log to clean next, or None."""
    overdue: list[tuple[int, PartitionLog]] = []
    ratios: list[tuple[float, PartitionLog]] = []
    expiring: list[PartitionLog] = []
    for plog in logs:
        cfg = plog.config
        if not cfg.compact or id(plog) in busy or plog.closed:
            continue
        ratio, dirty_bytes = dirty_ratio(plog, now_ms)
        if dirty_bytes > 0:
            delay = _compaction_delay(plog, now_ms)
            if delay > 0:
                overdue.append((delay, plog))
            elif ratio >= cfg.min_cleanable_dirty_ratio:
                ratios.append((ratio, plog))
        elif plog.tombstone_horizon_ms is not None and plog.tombstone_horizon_ms <= now_ms:
            expiring.append(plog)
    if overdue:
        return max(overdue, key=lambda item: item[0])[1]
    if ratios:
        return max(ratios, key=lambda item: item[0])[1]
    return expiring[0] if expiring else None


def _compaction_delay(plog: PartitionLog, now_ms: int) -> int:
    """How long past max.compaction.lag.ms the oldest dirty record is (<= 0: not overdue)."""
    lag = plog.config.max_compaction_lag_ms
    if lag >= 2**63 - 1:
        return 0
    dirty = first_dirty_offset(plog)
    for seg in plog.segments[:-1]:
        if seg.next_offset > dirty:
            first = seg.first_batch_timestamp()
            return now_ms - first - lag if first >= 0 else 0
    return 0


class LogCleanerManager:
    def __init__(self, config: CleanerConfig, logs: Callable[[], Iterable[PartitionLog]]) -> None:
        self.config = config
        self._logs = logs
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._busy: set[int] = set()
        self._plans: list[CleanPlan] = []
        self._throttler = Throttler(config.io_max_bytes_per_second)
        self.cleans = 0  # finished cleans, for tests and metrics

    def start(self) -> None:
        if not self.config.enable or self._tasks:
            return
        # A cleaner thread runs Python code; the event loop, at each wake-up, would wait up to the default
        # 5 ms switch interval for the GIL. A shorter interval keeps produce and fetch latency flat.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        self._executor = ThreadPoolExecutor(max_workers=self.config.threads, thread_name_prefix="log-cleaner")
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run()) for _ in range(self.config.threads)]

    async def stop(self) -> None:
        for plan in self._plans:
            plan.abort.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._executor is not None:
            # The thread stops at its next chunk; what it wrote is dropped or finished at start-up.
            await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
            self._executor = None

    async def _run(self) -> None:
        failures = Backoff(initial=self.config.backoff_ms / 1000, maximum=max(self.config.backoff_ms / 1000, 300.0))
        while True:
            cleaned = False
            try:
                cleaned = await self.clean_once(failures)
            except Exception:
                log.exception("log cleaner failed")
            if not cleaned:
                await asyncio.sleep(self.config.backoff_ms / 1000)

    async def clean_once(self, failures: Backoff | None = None) -> bool:
        """Clean the filthiest log if there is one; True if a clean ran."""
        now_ms = int(time.time() * 1000)
        candidates = [p for p in self._logs() if failures is None or failures.ready(str(p.directory), time.monotonic())]
        plog = grab_filthiest(candidates, now_ms, self._busy)
        if plog is None:
            return False
        plan = plan_clean(plog, now_ms, self.config.max_map_entries, self._throttler)
        if plan is None:
            return False
        self._busy.add(id(plog))
        log.info("log.cleaning", dir=str(plog.directory), first_dirty_offset=plan.first_dirty_offset,
                 segments=len(plan.sources))
        self._plans.append(plan)
        loop = asyncio.get_running_loop()
        try:
            try:
                result = await loop.run_in_executor(self._executor, clean, plan)
            except CleanAborted:
                return False
            except Exception as exc:
                # A disk error or a batch that cannot be read. Kafka marks the partition uncleanable;
                # here it is retried later and later, and logged at most once per backoff ceiling.
                suppressed = None if failures is None else failures.failed(str(plog.directory), time.monotonic())
                if failures is None or suppressed is not None:
                    log.error("log.clean_failed", dir=str(plog.directory), error=repr(exc),
                              failures_not_logged=suppressed or 0)
                return False
            await self._swap(plog, result)
            if failures is not None:
                failures.succeeded(str(plog.directory))
            return True
        finally:
            self._plans.remove(plan)
            self._busy.discard(id(plog))

    async def _swap(self, plog: PartitionLog, result: CleanResult) -> None:
        if swap_in(plog, result):
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, plog.write_cleaner_checkpoint, result.end_offset)
            except (OSError, LogClosed) as exc:
                log.warning("log.cleaner_checkpoint_failed", dir=str(plog.directory), error=repr(exc))
        self.cleans += 1
        log.info("log.cleaned", dir=str(plog.directory), groups=len(result.groups), end_offset=result.end_offset,
                 bytes_read=result.bytes_read, bytes_written=result.bytes_written,
                 records_removed=result.records_removed)
