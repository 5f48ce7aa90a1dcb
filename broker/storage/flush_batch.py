"""Group commit across logs: the fsync jobs of flush rounds that fall due in one pass of the event loop run
together.

Each `PartitionLog` keeps its own group commit (one round at a time, later callers share the next round). A
coordinator write that touches several partitions (a ShareFetch acknowledging four share partitions writes to
four `__share_group_state` partitions) would otherwise start one executor job per partition, each finishing
with its own wake-up of the loop, and jobs queued behind other logs' fsyncs in the shared default executor.
Here the rounds submitted in one pass are planned together at the start of the next and go to the executor
as one job, which runs them concurrently on a pool of its own (concurrent fsyncs of different files share the
filesystem's journal commit; sequential ones pay for one each) and comes back once with every job's outcome:
a failed job fails only its own round.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

Job = Callable[[], None]

# Workers for all but the first job of a batch (the executor job runs that one itself). They never wait on
# anything but the disk, so the executor job waiting for them cannot deadlock.
_HELPER_WORKERS = 8
_helpers: ThreadPoolExecutor | None = None

_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FlushBatcher] = weakref.WeakKeyDictionary()


def _helper_pool() -> ThreadPoolExecutor:
    global _helpers
    if _helpers is None:
        _helpers = ThreadPoolExecutor(max_workers=_HELPER_WORKERS, thread_name_prefix="log-flush")
    return _helpers


def run_together(jobs: list[Job]) -> list[BaseException | None]:
    """Run `jobs` concurrently (the first in this thread) and return each one's error, or None; blocking."""
    pending: list[Future[None]] = [_helper_pool().submit(job) for job in jobs[1:]]
    outcomes: list[BaseException | None] = []
    try:
        jobs[0]()
        outcomes.append(None)
    except Exception as exc:  # reported to the job's own round
        outcomes.append(exc)
    outcomes.extend(f.exception() for f in pending)  # waits for each
    return outcomes


class FlushBatcher:
    """The jobs submitted in one pass of `loop`, run as one executor job in the next."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: list[tuple[Callable[[], Job], asyncio.Future[None]]] = []
        self.batches = 0  # executor jobs started (for tests and metrics)

    def submit(self, prepare: Callable[[], Job]) -> asyncio.Future[None]:
        """A future done once the job `prepare` returns ran in a worker thread, with its error if it raised.

        `prepare` runs on the loop when the batch starts (the next pass), so a log's round covers what was
        appended until then, as when each round planned in its own task."""
        done: asyncio.Future[None] = self._loop.create_future()
        self._pending.append((prepare, done))
        if len(self._pending) == 1:
            self._loop.call_soon(self._dispatch)
        return done

    def _dispatch(self) -> None:
        pending, self._pending = self._pending, []
        batch: list[tuple[Job, asyncio.Future[None]]] = []
        for prepare, done in pending:
            if done.done():
                continue  # its round was cancelled before it started
            try:
                batch.append((prepare(), done))
            except Exception as exc:  # e.g. no fd left to dup: that round fails, the others go on
                done.set_exception(exc)
        if not batch:
            return
        self.batches += 1
        outcome = self._loop.run_in_executor(None, run_together, [job for job, _ in batch])
        outcome.add_done_callback(lambda f: _settle(batch, f))


def _settle(batch: list[tuple[Job, asyncio.Future[None]]], outcome: asyncio.Future[list[BaseException | None]]) -> None:
    if outcome.cancelled():
        for _, done in batch:
            done.cancel()
        return
    error = outcome.exception()
    errors = [error] * len(batch) if error is not None else outcome.result()
    for (_, done), err in zip(batch, errors, strict=True):
        if done.done():
            continue
        if err is None:
            done.set_result(None)
        else:
            done.set_exception(err)


def batcher_for(loop: asyncio.AbstractEventLoop) -> FlushBatcher:
    """The running loop's batcher (one per loop, so every log on it shares batches)."""
    batcher = _batchers.get(loop)
    if batcher is None:
        batcher = _batchers[loop] = FlushBatcher(loop)
    return batcher
