"""The share coordinator: durable share-partition state on `__share_group_state` (KIP-932).

Every change goes the same way, through the coordinator runtime: the operation validates against memory
and yields its records; the runtime appends them to the state topic, waits until they are durable and
replays them into memory; then the operation answers. Memory changes only by replay, so a restart (`load`) rebuilds exactly what the answers
promised. The shard of each state-topic partition is a `ShareStateMap`, and writes hold their share
partition's key, so two changes to one key never interleave between validation, append and replay.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from shoal.persister.persister import PersistedStateBatch, SharePartitionKey
from shoal.protocol.coordinator_records import SHARE_SNAPSHOT, CoordinatorRecord, fits_key_string
from shoal.protocol.errors import ErrorCode
from shoal.protocol.share_state_rpcs import (
    DeleteRequest,
    DeleteResponse,
    Error,
    InitializeRequest,
    InitializeResponse,
    ReadRequest,
    ReadResponse,
    StatePartition,
    StateRequest,
    SummaryRequest,
    SummaryResponse,
    WriteRequest,
    WriteResponse,
    error_response,
)
from shoal.protocol.uuids import ZERO_UUID

from .placement import Placement
from .record_log import CoordinatorLogError, CoordinatorRecordLog
from .runtime import CoordinatorRuntime, Steps
from .share_state import (
    UNINITIALIZED_DELIVERY_COMPLETE_COUNT,
    UNINITIALIZED_START_OFFSET,
    ShareStateMap,
    cold_snapshot_record,
    initialize_record,
    state_batches_problem,
    state_key_string,
    tombstone_record,
    write_record,
)

log = structlog.get_logger("shoal.share_coordinator")



P = TypeVar("P", bound=StatePartition)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class ShareCoordinatorStats:
    """Counters for metrics; monotonically increasing."""

    writes: int = 0  # appends to the state topic
    records_written: int = 0
    write_latency_ms_sum: float = 0.0
    write_errors: int = 0
    snapshots_written: int = 0
    cold_snapshots_written: int = 0
    prunes: int = 0


@dataclass(slots=True)
class _Outcome:
    """Per-partition answer before it is shaped into a response struct."""

    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    extra: dict[str, Any] | None = None


class _Refused(Exception):
    def __init__(self, code: int, message: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message


class ShareCoordinator:
    def __init__(
        self,
        record_log: CoordinatorRecordLog,
        *,
        snapshot_update_records_per_snapshot: int = 500,
        cold_snapshot_interval_ms: int = 300_000,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        partition_count: Callable[[bytes], int | None] | None = None,
        placement: Placement[SharePartitionKey] | None = None,
    ):
        """`partition_count(topic_id)` gives a topic's partition count or None if it does not exist; when
        given, state RPCs for unknown topics/partitions answer UNKNOWN_TOPIC_OR_PARTITION. `placement` puts
        keys by the partition count the state topic was created with (by default, its current count)."""
        self.num_partitions = record_log.num_partitions
        self.placement = placement or Placement(self.num_partitions, state_key_string)
        self.updates_per_snapshot = snapshot_update_records_per_snapshot
        self.runtime = CoordinatorRuntime(record_log, lambda _partition: self._new_map())
        self.cold_snapshot_interval_ms = cold_snapshot_interval_ms
        self.clock_ms = clock_ms
        self.partition_count = partition_count
        self.pruned_to = [0] * self.num_partitions
        self.stats = ShareCoordinatorStats()
        # Metric hooks (milliseconds): a state partition loaded, a WriteShareGroupState call served.
        self.on_partition_load: Callable[[float], None] | None = None
        self.on_write: Callable[[float], None] | None = None
        # Busy-time accounting for the KIP's thread-idle-ratio: time with at least one operation running.
        self._active = 0
        self._busy_since = 0.0
        self._busy_total = 0.0

    @property
    def maps(self) -> list[ShareStateMap]:
        """The shard of each state-topic partition."""
        return self.runtime.shards

    @property
    def loaded(self) -> set[int]:
        return self.runtime.loaded

    # ---- loading ---------------------------------------------------------------------------------

    async def load(self) -> None:
        """Replay every state-topic partition; until a partition is done its keys answer
        COORDINATOR_LOAD_IN_PROGRESS."""
        for p in range(self.num_partitions):
            started = time.perf_counter()
            n = await self.runtime.load(p)
            if self.on_partition_load is not None:
                self.on_partition_load((time.perf_counter() - started) * 1000)
            log.debug("share state partition loaded", partition=p, records=n, keys=len(self.maps[p].states))
        self.placement.settle([m.states for m in self.maps], "share partition")

    async def stop(self) -> None:
        """Let writes in progress finish (they were started, so they are completed, not dropped)."""
        await self.runtime.drain()

    def _new_map(self) -> ShareStateMap:
        return ShareStateMap(updates_per_snapshot=self.updates_per_snapshot)

    def partition_for(self, key: SharePartitionKey) -> int:
        return self.placement.partition_for(key)

    # ---- the write path --------------------------------------------------------------------------

    def _commit(self, records: list[CoordinatorRecord]) -> Steps[None]:
        """Hand the records to the runtime, which appends them durably and replays them, and count the
        write. Callers are runtime operations holding the key (or the whole partition)."""
        started = time.perf_counter()
        try:
            yield records
        except Exception:
            self.stats.write_errors += 1
            raise
        self.stats.writes += 1
        self.stats.records_written += len(records)
        self.stats.snapshots_written += sum(
            1 for r in records if r.record_type == SHARE_SNAPSHOT and r.value is not None
        )
        self.stats.write_latency_ms_sum += (time.perf_counter() - started) * 1000

    def _per_key(
        self,
        group_id: str,
        topic_id: bytes,
        partition: int,
        action: Callable[[SharePartitionKey, int], Steps[_Outcome]],
    ) -> _Outcome | asyncio.Task[_Outcome]:
        """Common checks, then `action(key, state_partition)` started as a runtime write holding that key."""
        if not group_id or not fits_key_string(group_id):
            return _Outcome(ErrorCode.INVALID_REQUEST, "The group id must be non-empty and fit a record key.")
        if topic_id == ZERO_UUID:
            return _Outcome(ErrorCode.INVALID_REQUEST, "The topic id is null.")
        if partition < 0:
            return _Outcome(ErrorCode.INVALID_REQUEST, "The partition id is negative.")
        key = SharePartitionKey(group_id, topic_id, partition)
        sp = self.partition_for(key)
        if sp not in self.loaded:
            if sp in self.runtime.released:
                return _Outcome(ErrorCode.NOT_COORDINATOR, "This instance is not the share coordinator of the key.")
            return _Outcome(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "The share coordinator is loading.")
        if self.partition_count is not None:
            count = self.partition_count(topic_id)
            if count is None or partition >= count:
                return _Outcome(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unknown topic or partition.")

        def operation() -> Steps[_Outcome]:
            self._enter_busy()
            try:
                return (yield from action(key, sp))
            except _Refused as exc:
                return _Outcome(exc.code, exc.message)
            except CoordinatorLogError as exc:  # the log says why: not ours any more, or try again
                log.warning("share state write failed", key=str(key), error_code=exc.error_code, error=str(exc))
                return _Outcome(exc.error_code, f"Share state write failed: {exc}")
            except Exception as exc:  # a failed append: nothing was replayed, memory is unchanged
                log.exception("share state write failed", key=str(key))
                return _Outcome(ErrorCode.UNKNOWN_SERVER_ERROR, f"Share state write failed: {exc}")
            finally:
                self._leave_busy()

        return self.runtime.submit_steps(sp, key, operation)

    # ---- RPC handlers ----------------------------------------------------------------------------

    async def initialize_state(self, req: InitializeRequest) -> InitializeResponse:
        def action(key: SharePartitionKey, sp: int, p: InitializeRequest.PartitionData) -> Steps[_Outcome]:
            if p.state_epoch < 0:
                raise _Refused(ErrorCode.INVALID_REQUEST, "The state epoch is negative.")
            current = self.maps[sp].get(key)
            if current is not None:
                if current.state_epoch > p.state_epoch:
                    raise _Refused(ErrorCode.FENCED_STATE_EPOCH, "The state epoch is fenced.")
                if current.state_epoch == p.state_epoch and current.start_offset == p.start_offset:
                    return _Outcome()  # a retried initialize: already done
            yield from self._commit([initialize_record(key, current, p.state_epoch, p.start_offset, self.clock_ms())])
            return _Outcome()

        outcomes = await self._each(req, action)
        return error_response(InitializeResponse, req, _errors(outcomes))

    async def read_state(self, req: ReadRequest) -> ReadResponse:
        def action(key: SharePartitionKey, sp: int, p: ReadRequest.PartitionData) -> Steps[_Outcome]:
            if p.leader_epoch < 0:
                raise _Refused(ErrorCode.INVALID_REQUEST, "The leader epoch is negative.")
            current = self.maps[sp].get(key)
            if current is None:
                raise _Refused(ErrorCode.INVALID_REQUEST, "Read on an uninitialized share partition.")
            if current.leader_epoch > p.leader_epoch:
                raise _Refused(ErrorCode.FENCED_LEADER_EPOCH, "The leader epoch is fenced.")
            answer = {"state_epoch": current.state_epoch, "start_offset": current.start_offset,
                      "state_batches": list(current.state_batches)}
            if current.leader_epoch != p.leader_epoch:
                # A new partition leader: record its epoch so older leaders are fenced from now on.
                yield from self._commit([write_record(
                    key, current, leader_epoch=p.leader_epoch, start_offset=current.start_offset,
                    delivery_complete_count=current.delivery_complete_count, batches=[],
                    updates_per_snapshot=self.updates_per_snapshot, now_ms=self.clock_ms(),
                )])
            return _Outcome(extra=answer)

        outcomes = await self._each(req, action)
        return ReadResponse(results=[
            ReadResponse.ReadStateResult(topic_id=t.topic_id, partitions=[
                _read_partition_result(p.partition, o) for p, o in zip(t.partitions, outs, strict=True)
            ])
            for t, outs in zip(req.topics, outcomes, strict=True)
        ])

    def _enter_busy(self) -> None:
        if self._active == 0:
            self._busy_since = time.perf_counter()
        self._active += 1

    def _leave_busy(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._busy_total += time.perf_counter() - self._busy_since

    def busy_seconds(self) -> float:
        """Total seconds with work in progress; read from the metrics thread, so plain attribute reads only."""
        active, since, total = self._active, self._busy_since, self._busy_total
        return total + (time.perf_counter() - since if active else 0.0)

    async def write_state(self, req: WriteRequest) -> WriteResponse:
        started = time.perf_counter()
        try:
            return await self._write_state(req)
        finally:
            if self.on_write is not None:
                self.on_write((time.perf_counter() - started) * 1000)

    async def _write_state(self, req: WriteRequest) -> WriteResponse:
        def action(key: SharePartitionKey, sp: int, p: WriteRequest.PartitionData) -> Steps[_Outcome]:
            if p.leader_epoch < -1:
                raise _Refused(ErrorCode.INVALID_REQUEST, "The leader epoch is negative.")
            if p.state_epoch < -1:
                raise _Refused(ErrorCode.INVALID_REQUEST, "The state epoch is negative.")
            current = self.maps[sp].get(key)
            if current is None:
                raise _Refused(ErrorCode.INVALID_REQUEST, "Write on an uninitialized share partition.")
            # As Kafka: an epoch of -1 is "not known" and skips its fencing check.
            if p.leader_epoch != -1 and current.leader_epoch > p.leader_epoch:
                raise _Refused(ErrorCode.FENCED_LEADER_EPOCH, "The leader epoch is fenced.")
            if p.state_epoch != -1 and current.state_epoch > p.state_epoch:
                raise _Refused(ErrorCode.FENCED_STATE_EPOCH, "The state epoch is fenced.")
            batches = [
                PersistedStateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                for b in p.state_batches
            ]
            problem = state_batches_problem(batches)
            if problem is not None:
                raise _Refused(ErrorCode.INVALID_REQUEST, problem)
            # As in Kafka, only reads move the recorded leader epoch; writes keep the stored one.
            yield from self._commit([write_record(
                key, current, leader_epoch=current.leader_epoch, start_offset=p.start_offset,
                delivery_complete_count=p.delivery_complete_count, batches=batches,
                updates_per_snapshot=self.updates_per_snapshot, now_ms=self.clock_ms(),
            )])
            return _Outcome()

        outcomes = await self._each(req, action)
        return error_response(WriteResponse, req, _errors(outcomes))

    async def delete_state(self, req: DeleteRequest) -> DeleteResponse:
        def action(key: SharePartitionKey, sp: int, p: DeleteRequest.PartitionData) -> Steps[_Outcome]:
            if self.maps[sp].get(key) is not None:  # deleting a missing key is a successful no-op
                yield from self._commit([tombstone_record(key)])
            return _Outcome()

        outcomes = await self._each(req, action)
        return error_response(DeleteResponse, req, _errors(outcomes))

    async def read_state_summary(self, req: SummaryRequest) -> SummaryResponse:
        def action(key: SharePartitionKey, sp: int, p: SummaryRequest.PartitionData) -> Steps[_Outcome]:
            yield from ()  # a read: no records, but run like the writes, holding the key
            current = self.maps[sp].get(key)
            if current is None:  # unknown key: "not initialised", not an error
                return _Outcome(extra={"state_epoch": 0, "leader_epoch": 0,
                                       "start_offset": UNINITIALIZED_START_OFFSET,
                                       "delivery_complete_count": UNINITIALIZED_DELIVERY_COMPLETE_COUNT})
            return _Outcome(extra={"state_epoch": current.state_epoch, "leader_epoch": current.leader_epoch,
                                   "start_offset": current.start_offset,
                                   "delivery_complete_count": current.delivery_complete_count})

        outcomes = await self._each(req, action)
        return SummaryResponse(results=[
            SummaryResponse.ReadStateSummaryResult(topic_id=t.topic_id, partitions=[
                SummaryResponse.PartitionResult(partition=p.partition, error_code=o.error_code,
                                                error_message=o.error_message, **(o.extra or {}))
                for p, o in zip(t.partitions, outs, strict=True)
            ])
            for t, outs in zip(req.topics, outcomes, strict=True)
        ])

    async def _each(
        self, req: StateRequest[P], action: Callable[[SharePartitionKey, int, P], Steps[_Outcome]]
    ) -> list[list[_Outcome]]:
        """Run `action` for every (topic, partition) of a request, keys in different state partitions
        concurrently; outcomes come back in request order."""
        def bound(p: P) -> Callable[[SharePartitionKey, int], Steps[_Outcome]]:
            return lambda key, sp: action(key, sp, p)

        started = [
            self._per_key(req.group_id, t.topic_id, p.partition, bound(p))
            for t in req.topics
            for p in t.partitions
        ]
        writes = [job for job in started if isinstance(job, asyncio.Task)]
        if writes:
            # Shielded: a caller that goes away leaves the writes running (the runtime owns them).
            await asyncio.shield(asyncio.gather(*writes))
        flat = [job.result() if isinstance(job, asyncio.Task) else job for job in started]
        out: list[list[_Outcome]] = []
        for t in req.topics:
            out.append(flat[: len(t.partitions)])
            flat = flat[len(t.partitions):]
        return out

    # ---- housekeeping ----------------------------------------------------------------------------

    async def maybe_cold_snapshot(self, now_ms: int | None = None) -> int:
        """Snapshot keys whose last snapshot is older than the cold interval, so pruning can move past
        their old records. Skipped for a partition whose every key was already cold-snapshotted (a quiet
        partition gains nothing). Returns the number of snapshots written."""
        now = self.clock_ms() if now_ms is None else now_ms

        def snapshot(sp: int) -> Steps[int]:
            state = self.maps[sp]
            if all(s.create_timestamp != s.write_timestamp for _, s in state):
                return 0
            records = [
                cold_snapshot_record(key, s, now)
                for key, s in state
                if now - s.write_timestamp >= self.cold_snapshot_interval_ms
            ]
            if not records:
                return 0
            try:
                yield from self._commit(records)
            except Exception:
                log.exception("cold snapshot failed", partition=sp)
                return 0
            return len(records)

        written = 0
        for sp in sorted(self.loaded):
            written += await self.runtime.write_exclusive_steps(sp, functools.partial(snapshot, sp))
        self.stats.cold_snapshots_written += written
        return written

    async def delete_topics(self, topic_ids: set[bytes]) -> int:
        """A deleted topic's share state goes too: tombstone every key of those topics. Returns the count."""

        def tombstone(sp: int) -> Steps[int]:
            records = [tombstone_record(key) for key, _ in self.maps[sp] if key.topic_id in topic_ids]
            if records:
                yield from self._commit(records)
            return len(records)

        deleted = 0
        for sp in sorted(self.loaded):
            deleted += await self.runtime.write_exclusive_steps(sp, functools.partial(tombstone, sp))
        return deleted

    async def delete_orphaned_state(self) -> int:
        """Tombstone the state of topics that no longer exist (deleted while the broker was going down)."""
        if self.partition_count is None:
            return 0
        gone = {key.topic_id for sp in self.loaded for key, _ in self.maps[sp] if self.partition_count(key.topic_id) is None}
        if not gone:
            return 0
        deleted = await self.delete_topics(gone)
        log.info("share state of deleted topics removed", topics=len(gone), keys=deleted)
        return deleted

    async def prune(self) -> dict[int, int]:
        """Delete state-topic records no live key needs any more; returns {partition: new start}."""
        moved: dict[int, int] = {}

        async def prune_partition(sp: int) -> None:
            upto = self.maps[sp].prunable_offset()
            if upto > self.pruned_to[sp]:
                self.runtime.delete_before(sp, upto)
                self.pruned_to[sp] = upto
                moved[sp] = upto

        for sp in sorted(self.loaded):
            await self.runtime.write_exclusive(sp, functools.partial(prune_partition, sp))
        if moved:
            self.stats.prunes += 1
        return moved


def _errors(outcomes: list[list[_Outcome]]) -> list[list[Error]]:
    return [[(o.error_code, o.error_message) for o in outs] for outs in outcomes]


def _read_partition_result(partition: int, o: _Outcome) -> ReadResponse.PartitionResult:
    r = ReadResponse.PartitionResult(partition=partition, error_code=o.error_code, error_message=o.error_message)
    if o.extra is not None:
        r.state_epoch = o.extra["state_epoch"]
        r.start_offset = o.extra["start_offset"]
        r.state_batches = [
            ReadResponse.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                    delivery_state=b.delivery_state, delivery_count=b.delivery_count)
            for b in o.extra["state_batches"]
        ]
    return r
