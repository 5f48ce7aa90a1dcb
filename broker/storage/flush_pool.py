"""The thread pool every log's group-commit fsync runs on.

Each `PartitionLog` keeps its own group commit (one round at a time, later callers share the next round).
A coordinator write that touches several partitions (a ShareFetch acknowledging four share partitions
writes to four `__share_group_state` partitions) starts several rounds at once, next to the rounds of
acks=all produces. On the loop's default executor (min(32, cores + 4) workers, 6 on two cores, shared with
any other blocking work) the rounds past its size waited for earlier fsyncs to finish, one after another.
Here they run on a pool of their own, sized for the rounds that fall due together, so they fsync
concurrently (concurrent fsyncs of different files share the filesystem's journal commit) and each round
completes, and releases its own waiters, as soon as its own fsync is done.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

# Threads blocked in fsync use no CPU; more than this many rounds due at once share the workers in turn.
FLUSH_WORKERS = 32

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def flush_executor() -> ThreadPoolExecutor:
    """The process's flush pool (threads start on demand, so an idle broker holds few)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=FLUSH_WORKERS, thread_name_prefix="log-flush")
        return _pool
