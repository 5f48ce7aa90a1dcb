"""The coordinator runtime: the one way a coordinator's state changes, shared by every coordinator.

A coordinator keeps one shard per partition of its internal topic (`__consumer_offsets`, `__transaction_state`,
`__share_group_state`). A write operation runs holding its key in that partition: the shard plans
records and a response from its current state, the runtime appends the records to the partition, waits
until they are durable, replays them into the shard (the same `replay` a restart runs), and only then is
the response handed back. Memory therefore never holds anything the log does not, nor the reverse.

`write_result` is the plain form (Kafka's scheduleWriteOperation): the operation only plans, returning a
`CoordinatorResult` (the records and the response), and the runtime appends, replays and answers.
`write_steps` is for an operation that writes more than once while it holds its key (a join that completes
the rebalance, a sync whose failed write starts another): the operation is a generator that yields the
records of each step, and the runtime appends and replays them before resuming it (raising the append's
failure into it), so the operation decides what comes next from the replayed state and returns the
response. No operation appends itself: `append` is the runtime's own.

Ordering is per partition and per key (`PartitionGate`): writes for different keys overlap so their
appends share one fsync; writes for one key never overlap, because each plans from the state the
previous one replayed; partition-wide work (snapshots of every key, topic deletion, pruning) runs alone.

Cancel-safety: an operation runs in a task of its own, so a caller that goes away (a client
disconnecting cancels its request task) does not stop it half-way; and once an append has started,
it is finished and replayed even if the operation itself is cancelled (shutdown).

Timers (Kafka's CoordinatorTimer): `schedule` runs an operation after a delay as a write on its key,
under a timer key of its own that a later `schedule` replaces and `cancel` removes, so session expiry,
rebalance deadlines and offset expiry go the same way as requests.

`TransactionalCoordinatorRuntime` adds what `__consumer_offsets` needs for transactional offset commits:
records appended in a producer's transactional batch and replayed with its producer id, and end-transaction
markers replayed into the shard, at load in log order and live once a marker is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Hashable,
    Iterator,
)
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

from shoal.protocol.coordinator_records import NO_PRODUCER_ID, CoordinatorRecord, EndTransactionMarker

from .record_log import CoordinatorRecordLog, TransactionalRecordLog

log = structlog.get_logger("shoal.coordinator_runtime")

_REPLAY_YIELD_EVERY = 1000  # records replayed between yields, so a long load does not stall the loop


class Shard(Protocol):
    """The in-memory state one internal-topic partition rebuilds; it changes only by `replay`."""

    def replay(self, offset: int, record: CoordinatorRecord) -> None: ...


R = TypeVar("R")


class TransactionalShard(Shard, Protocol):
    """A shard whose records may be written in transactions: replayed with their producer id, they count
    once that producer's COMMIT marker is replayed."""

    def replay(self, offset: int, record: CoordinatorRecord, producer_id: int = -1) -> None: ...

    def replay_end_transaction(self, producer_id: int, commit: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class CoordinatorResult(Generic[R]):
    """What a planning operation returns: the records to write and the response once they are durable.
    With a producer id the records go in that producer's transactional batch (TxnOffsetCommit)."""

    records: list[CoordinatorRecord]
    response: R
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1


S = TypeVar("S", bound=Shard)
TS = TypeVar("TS", bound=TransactionalShard)
T = TypeVar("T")
TimerKey = Hashable
# An operation that writes in steps: it yields each step's records and returns its response.
Steps = Generator[list[CoordinatorRecord], None, T]
# The same for an operation that also waits on something else between its steps (a share-state RPC); an
# async generator cannot return a value, so it sets its response in the `Answer` it is given.
AsyncSteps = AsyncGenerator[list[CoordinatorRecord], None]


class Answer(Generic[T]):
    """Where an `AsyncSteps` operation leaves its response."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


class PartitionGate:
    """Concurrency for one partition: many keys at once, or the whole partition alone."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._key_locks: dict[Hashable, asyncio.Lock] = {}
        self._key_users: dict[Hashable, int] = {}

    @contextlib.asynccontextmanager
    async def key(self, key: Hashable) -> AsyncIterator[None]:
        """Hold `key` alone, alongside other keys of the partition."""
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        self._key_users[key] = self._key_users.get(key, 0) + 1
        try:
            async with lock:
                async with self._cond:
                    await self._cond.wait_for(lambda: not self._exclusive)
                    self._shared += 1
                try:
                    yield
                finally:
                    async with self._cond:
                        self._shared -= 1
                        self._cond.notify_all()
        finally:
            self._key_users[key] -= 1
            if not self._key_users[key]:
                # No one holds or waits for this key: forget its lock so the map stays small.
                del self._key_users[key]
                del self._key_locks[key]

    @contextlib.asynccontextmanager
    async def whole(self) -> AsyncIterator[None]:
        """Hold the whole partition: no key write runs meanwhile."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class CoordinatorRuntime(Generic[S]):
    """Shards of one internal topic, with the write path every coordinator shares."""

    def __init__(self, record_log: CoordinatorRecordLog, new_shard: Callable[[int], S]):
        self.record_log = record_log
        self.num_partitions = record_log.num_partitions
        self._new_shard = new_shard
        self.shards: list[S] = [new_shard(p) for p in range(self.num_partitions)]
        self.loaded: set[int] = set()
        # Partitions this instance gave up (another owns them now): their keys answer NOT_COORDINATOR.
        self.released: set[int] = set()
        self._gates = [PartitionGate() for _ in range(self.num_partitions)]
        self._operations: set[asyncio.Task[Any]] = set()
        self._timers: dict[tuple[int, TimerKey], asyncio.TimerHandle] = {}

    def shard(self, partition: int) -> S:
        return self.shards[partition]

    # ---- loading -------------------------------------------------------------------------------

    async def load(self, partition: int) -> int:
        """Rebuild the partition's shard from everything its log holds; returns the records replayed."""
        shard = self._new_shard(partition)
        n = 0
        for offset, replay in self._replays(partition, shard):
            try:
                replay()
            except Exception:  # one unusable record must not keep the broker from starting
                log.exception("skipping coordinator record that cannot be replayed", partition=partition, offset=offset)
            n += 1
            if n % _REPLAY_YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self.shards[partition] = shard
        self.loaded.add(partition)
        self.released.discard(partition)
        return n

    def unload(self, partition: int) -> None:
        """Forget the partition's shard and timers: its records are no longer this instance's to write
        (sidecar mode: another instance took the state partition). A later `load` brings it back."""
        self.loaded.discard(partition)
        self.released.add(partition)
        self.shards[partition] = self._new_shard(partition)
        for timer in [key for key in self._timers if key[0] == partition]:
            self._timers.pop(timer).cancel()

    def _replays(self, partition: int, shard: S) -> Iterator[tuple[int, Callable[[], None]]]:
        for offset, record in self.record_log.replay(partition):
            yield offset, functools.partial(shard.replay, offset, record)

    # ---- operations ----------------------------------------------------------------------------

    async def write(self, partition: int, key: Hashable, operation: Callable[[], Awaitable[T]]) -> T:
        """Run `operation` holding `key` in `partition`; it runs to completion even if the caller is
        cancelled. It only reads the shard: a write goes through `write_result` or `write_steps`."""
        return await self._outlive_caller(self.submit(partition, key, operation))

    async def write_result(self, partition: int, key: Hashable, operation: Callable[[], CoordinatorResult[T]]) -> T:
        """Run a planning `operation` holding `key`: it reads the shard and returns the records and the
        response; the runtime appends the records, replays them and only then answers."""
        async def run() -> T:
            result = operation()
            await self._append_result(partition, result)
            return result.response

        return await self.write(partition, key, run)

    async def write_steps(self, partition: int, key: Hashable, operation: Callable[[], Steps[T]]) -> T:
        """Run an operation that writes in steps holding `key`: each list of records it yields is appended
        and replayed before it resumes (a failed append is raised into it at the yield); its return value
        is the response."""
        return await self.write(partition, key, functools.partial(self._run_steps, partition, operation))

    async def write_async_steps(self, partition: int, key: Hashable, operation: Callable[[Answer[T]], AsyncSteps],
                                default: T) -> T:
        """`write_steps` for an operation that also awaits other work (share-state RPCs) between its steps;
        it sets its response in the `Answer` it is given (`default` until it does)."""
        answer = Answer(default)
        await self.write(partition, key, functools.partial(self._run_async_steps, partition, operation, answer))
        return answer.value

    async def _run_steps(self, partition: int, operation: Callable[[], Steps[T]]) -> T:
        steps = operation()
        with contextlib.closing(steps):  # cancelled mid-way (shutdown): its `finally` blocks still run
            return await self._drive(partition, steps)

    async def _drive(self, partition: int, steps: Steps[T]) -> T:
        try:
            records = next(steps)
            while True:
                try:
                    await self.append(partition, records)
                except Exception as exc:  # the operation decides what a failed write means
                    records = steps.throw(exc)
                else:
                    records = steps.send(None)
        except StopIteration as done:
            result: T = done.value
            return result

    async def _run_async_steps(self, partition: int, operation: Callable[[Answer[T]], AsyncSteps],
                               answer: Answer[T]) -> None:
        steps = operation(answer)
        async with contextlib.aclosing(steps):
            await self._drive_async(partition, steps)

    async def _drive_async(self, partition: int, steps: AsyncSteps) -> None:
        try:
            records = await steps.__anext__()
            while True:
                try:
                    await self.append(partition, records)
                except Exception as exc:
                    records = await steps.athrow(exc)
                else:
                    records = await steps.asend(None)
        except StopAsyncIteration:
            return

    async def _append_result(self, partition: int, result: CoordinatorResult[T]) -> None:
        if result.producer_id != NO_PRODUCER_ID:
            raise TypeError("transactional records need a TransactionalCoordinatorRuntime")
        await self.append(partition, result.records)

    def submit(self, partition: int, key: Hashable, operation: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Start `operation` as `write` does, without waiting for it: for callers that start several
        writes and wait for them together (shielded, so that their cancellation does not reach here)."""
        return self._start(self._holding_key(partition, key, operation))

    def submit_steps(self, partition: int, key: Hashable, operation: Callable[[], Steps[T]]) -> asyncio.Task[T]:
        """`submit` for an operation that writes in steps (`write_steps`)."""
        return self.submit(partition, key, functools.partial(self._run_steps, partition, operation))

    async def write_exclusive(self, partition: int, operation: Callable[[], Awaitable[T]]) -> T:
        """Like `write`, holding the whole partition (for work that reads or changes every key)."""
        return await self._outlive_caller(self._start(self._holding_partition(partition, operation)))

    async def write_exclusive_steps(self, partition: int, operation: Callable[[], Steps[T]]) -> T:
        """`write_steps` holding the whole partition (a rewrite of every live key)."""
        return await self.write_exclusive(partition, functools.partial(self._run_steps, partition, operation))

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> None:
        """Append records durably, then replay them into the partition's shard.

        Call it from inside an operation, which holds the keys the records change. Once the append has
        started it finishes and is replayed even if this call is cancelled; the cancellation is raised
        afterwards, so memory and log agree whatever happens to the caller.
        """
        if not records:
            return
        first = self.record_log.append_nowait(partition, records)
        cancelled = False
        while True:
            try:
                await self.record_log.flush(partition, first + len(records))
                break
            except asyncio.CancelledError:
                cancelled = True  # the records are in the log: they must reach memory too
        shard = self.shards[partition]
        for i, record in enumerate(records):
            shard.replay(first + i, record)
        if cancelled:
            raise asyncio.CancelledError

    # ---- timers ----------------------------------------------------------------------------------

    def schedule(self, partition: int, timer: TimerKey, delay_s: float, key: Hashable,
                 operation: Callable[[], Awaitable[None]]) -> None:
        """Run `operation` after `delay_s` as a write holding `key`; replaces the timer of the same name."""
        self.cancel(partition, timer)
        loop = asyncio.get_running_loop()
        self._timers[(partition, timer)] = loop.call_later(max(delay_s, 0.0), self._fire, partition, timer, key,
                                                          operation)

    def schedule_steps(self, partition: int, timer: TimerKey, delay_s: float, key: Hashable,
                       operation: Callable[[], Steps[None]]) -> None:
        """`schedule` for an operation that writes in steps (`write_steps`)."""
        self.schedule(partition, timer, delay_s, key, functools.partial(self._run_steps, partition, operation))

    def cancel(self, partition: int, timer: TimerKey) -> None:
        handle = self._timers.pop((partition, timer), None)
        if handle is not None:
            handle.cancel()

    def is_scheduled(self, partition: int, timer: TimerKey) -> bool:
        return (partition, timer) in self._timers

    def cancel_all_timers(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _fire(self, partition: int, timer: TimerKey, key: Hashable, operation: Callable[[], Awaitable[None]]) -> None:
        self._timers.pop((partition, timer), None)
        self.submit(partition, key, operation).add_done_callback(_log_timer_failure)

    def hold(self, partition: int, key: Hashable) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold `key` as a write does, without writing: writes of that key wait until it is released."""
        return self._gates[partition].key(key)

    def delete_before(self, partition: int, offset: int) -> None:
        """Drop records no shard needs any more (call from a `write_exclusive` operation)."""
        self.record_log.delete_before(partition, offset)

    async def drain(self) -> None:
        """Wait until every operation in progress has finished (shutdown)."""
        while self._operations:
            await asyncio.gather(*list(self._operations), return_exceptions=True)

    def _start(self, work: Coroutine[object, None, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work)
        self._operations.add(task)
        task.add_done_callback(self._operations.discard)
        return task

    async def _holding_key(self, partition: int, key: Hashable, operation: Callable[[], Awaitable[T]]) -> T:
        async with self._gates[partition].key(key):
            return await operation()

    async def _holding_partition(self, partition: int, operation: Callable[[], Awaitable[T]]) -> T:
        async with self._gates[partition].whole():
            return await operation()

    @staticmethod
    async def _outlive_caller(task: asyncio.Task[T]) -> T:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                # The caller left; the operation goes on, and nobody else will see how it ended.
                task.add_done_callback(_log_orphan_failure)
            raise


class TransactionalCoordinatorRuntime(CoordinatorRuntime[TS]):
    """The runtime over `__consumer_offsets`: also transactional appends and end-transaction markers."""

    def __init__(self, record_log: CoordinatorRecordLog, new_shard: Callable[[int], TS]):
        super().__init__(record_log, new_shard)

    def _replays(self, partition: int, shard: TS) -> Iterator[tuple[int, Callable[[], None]]]:
        if not isinstance(self.record_log, TransactionalRecordLog):
            yield from super()._replays(partition, shard)
            return
        for item in self.record_log.replay_transactional(partition):
            if isinstance(item, EndTransactionMarker):
                yield item.offset, functools.partial(shard.replay_end_transaction, item.producer_id, item.commit)
            else:
                yield item.offset, functools.partial(shard.replay, item.offset, item.record, item.producer_id)

    async def append_transactional(self, partition: int, records: list[CoordinatorRecord], producer_id: int,
                                   producer_epoch: int) -> None:
        """`append` in the producer's transactional batch: replayed as pending until its marker."""
        if not records:
            return
        record_log = self.record_log
        assert isinstance(record_log, TransactionalRecordLog)
        first = record_log.append_transactional_nowait(partition, records, producer_id, producer_epoch)
        cancelled = False
        while True:
            try:
                await record_log.flush(partition, first + len(records))
                break
            except asyncio.CancelledError:
                cancelled = True  # the records are in the log: they must reach memory too
        shard = self.shards[partition]
        for i, record in enumerate(records):
            shard.replay(first + i, record, producer_id)
        if cancelled:
            raise asyncio.CancelledError

    async def _append_result(self, partition: int, result: CoordinatorResult[T]) -> None:
        if result.producer_id == NO_PRODUCER_ID:
            await self.append(partition, result.records)
        else:
            await self.append_transactional(partition, result.records, result.producer_id, result.producer_epoch)

    def replay_end_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """The producer's marker is durable on the partition: its pending records count, or go."""
        self.shards[partition].replay_end_transaction(producer_id, commit)


def _log_timer_failure(task: asyncio.Task[T]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("coordinator timer operation failed", exc_info=task.exception())


def _log_orphan_failure(task: asyncio.Task[T]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("coordinator operation failed after its caller left", exc_info=task.exception())
