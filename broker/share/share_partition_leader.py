"""Share-partition leaders: the asyncio shell around each share partition's state machine.

A leader loads its state through the persister on first use, reads its partition's records for
acquisitions through the log seam (`PartitionSource`: the local log standalone, the upstream in sidecar
mode), arms
the acquisition-lock timer, and persists every state change before it is reported: an
acknowledgement is answered only after WriteShareGroupState succeeded, and rolled back if it failed.

A change that started persisting finishes whatever happens to its caller: acknowledgements and
releases run in a task of their own (`finish`), so a caller cancelled mid-write (a shutdown) cannot
leave memory ahead of the persisted state; if that task itself is cancelled, memory is rolled back.

`lock` guards the in-memory state only while it changes; writes are ordered by `write_lock`, so a
fetch can acquire while an acknowledgement's write is under way (records that write releases are
not acquirable until it completes, as in Kafka).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import structlog

from shoal.backoff import Backoff
from shoal.broker.common.purgatory import ShareFetchKey
from shoal.broker.storage.partition_log import OffsetOutOfRange, PartitionLog
from shoal.broker.storage.partition_source import (
    EARLIEST,
    LATEST,
    LocalPartitionSource,
    PartitionSource,
    SourceUnavailable,
    undeliverable,
)
from shoal.iso_duration import parse_iso_duration_ms
from shoal.persister.persister import Persister, SharePartitionKey, WriteStateRequest
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import HEADER_SIZE

from .acquire_read import AcquireReadSize
from .dead_letter import DeadLetterWriter, NotDeadLettered, Source
from .group_configs import GroupConfigs
from .share_partition import (
    AckBatch,
    AckOutcome,
    AcquiredRange,
    AcquireMode,
    ArchivingRun,
    FetchedBatch,
    RecordState,
    SharePartition,
)

if TYPE_CHECKING:
    from shoal.broker.common.purgatory import Purgatory

log = structlog.get_logger("shoal.share_partition")

# The leader epoch of a broker that is the only leader of its share partitions (standalone).
LEADER_EPOCH = 0
_MAX_LEADER_EPOCH = 2**31 - 1


def next_leader_epoch(stored: int) -> int | None:
    """The leader epoch a new owner loads with when ownership can move (several sidecars): above the one the
    share coordinator holds, so the coordinator refuses every write of an earlier owner from the moment the
    new owner's read recorded it (FENCED_LEADER_EPOCH). Derived from the stored state, it keeps growing
    whatever happens to the sidecar group's generation. None when the int32 epoch is spent."""
    if stored < 0:
        return 0
    return stored + 1 if stored < _MAX_LEADER_EPOCH else None

# How persister (share coordinator) errors surface to clients (as Kafka maps them).
_PERSISTER_ERRORS: dict[int, ErrorCode] = {
    ErrorCode.NOT_COORDINATOR: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.GROUP_ID_NOT_FOUND: ErrorCode.GROUP_ID_NOT_FOUND,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.FENCED_STATE_EPOCH: ErrorCode.NOT_LEADER_OR_FOLLOWER,
}
# After these the in-memory share partition is dropped and rebuilt from persisted state on next use.
_FENCING = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


def map_persister_error(code: int) -> int:
    if code == ErrorCode.NONE:
        return ErrorCode.NONE
    return int(_PERSISTER_ERRORS.get(code, ErrorCode.UNKNOWN_SERVER_ERROR))


def now_ms() -> int:
    return int(time.time() * 1000)


_T = TypeVar("_T")
_finishing: set[asyncio.Task[Any]] = set()  # strong references: the loop keeps only weak ones


def finish(work: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
    """Start `work` now in a task of its own; cancelling whoever awaits the result does not cancel it."""
    task = asyncio.get_running_loop().create_task(work)
    _finishing.add(task)
    task.add_done_callback(_finished)
    return asyncio.shield(task)


def _finished(task: asyncio.Task[Any]) -> None:
    _finishing.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("share partition change failed", error=repr(task.exception()))


class PendingAcknowledgement(NamedTuple):
    """An acknowledgement under way: `applied` completes once memory holds it (or it was refused),
    `done` with its error code once it is written."""

    applied: asyncio.Future[None]
    done: asyncio.Future[int]


@dataclass(slots=True)
class Acquisition:
    records: bytes  # whole stored batches, or only their headers when asked for (`headers_only`)
    acquired: list[AcquiredRange]
    error_code: int = ErrorCode.NONE


class SharePartitionLeader:
    def __init__(
        self,
        key: SharePartitionKey,
        source: PartitionSource,
        persister: Persister,
        group_configs: GroupConfigs,
        purgatory: Purgatory,
        on_change: Callable[[SharePartitionLeader], None] | None = None,
        dead_letters: DeadLetterWriter | None = None,
        *,
        bump_leader_epoch: bool = False,
    ):
        self.dead_letters = dead_letters
        # When leadership can move between instances, each load takes a leader epoch above the stored one
        # (`next_leader_epoch`); otherwise the one leader keeps LEADER_EPOCH.
        self.bump_leader_epoch = bump_leader_epoch
        self.leader_epoch = LEADER_EPOCH
        self._dead_letter_task: asyncio.Future[None] | None = None
        # Set when a loaded state holds ARCHIVING records: their dead-letter records may already exist.
        self._dead_letter_recovering = False
        # False after a failed state write until the next one succeeds: memory may then hold ARCHIVING
        # that is not on disk, and a dead-letter record for it could be written twice after a crash.
        self._state_durable = True
        self.key = key
        self.source = source
        # The local log behind the source (dead letters copy records from it); None in sidecar mode.
        self.plog: PartitionLog | None = source.plog if isinstance(source, LocalPartitionSource) else None
        self.persister = persister
        self.group_configs = group_configs
        self.purgatory = purgatory
        self.on_change = on_change
        self.state: SharePartition | None = None
        self.lock = asyncio.Lock()
        self.write_lock = asyncio.Lock()
        self.writes_in_flight = 0
        # Group commit of state writes (`_persist`): requests numbered in order, the last one a finished
        # write covered, and that write's outcome.
        self._write_requests = 0
        self._written_through = 0
        self._last_write_code: int = ErrorCode.NONE
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self.load_time_ms: float = 0.0
        self._load_failures = Backoff()
        self.on_load: Callable[[float], None] | None = None  # metric hook, load time in ms
        # Published for the metrics thread, which may only read plain attributes (see _publish).
        self.published_delivery_complete = 0
        self.published_oldest_lock_ms: int | None = None
        self._read_size = AcquireReadSize()

    @property
    def wake_key(self) -> ShareFetchKey:
        return ShareFetchKey(self.key.group_id, self.key.topic_id, self.key.partition)

    # ---- loading ------------------------------------------------------------------------------

    async def load(self) -> int:
        """Load persisted state now (under the lock acquisitions take); returns a client-facing error code."""
        async with self.lock:
            return await self.ensure_loaded()

    async def ensure_loaded(self) -> int:
        """Load persisted state once; returns a client-facing error code."""
        if self.state is not None:
            return ErrorCode.NONE
        started = time.monotonic()
        epoch_error, epoch = await self._load_epoch()
        if epoch_error != ErrorCode.NONE:
            return epoch_error
        result = await self.persister.read_state(self.key, epoch)
        if result.error_code != ErrorCode.NONE:
            # Consumers retry at their poll rate: the failure is logged once, then at most once a minute.
            suppressed = self._load_failures.failed("load", time.monotonic())
            if suppressed is not None:
                log.warning("share partition state load failed", group=self.key.group_id,
                            partition=self.key.partition, error_code=result.error_code, error=result.error_message,
                            failures_not_logged=suppressed)
            return map_persister_error(result.error_code)
        start = result.start_offset
        try:
            if start < 0:
                start = await self._reset_offset()
            start = max(start, await self.source.list_offset(EARLIEST))
        except SourceUnavailable as exc:
            log.warning("share partition's log unavailable", group=self.key.group_id,
                        partition=self.key.partition, error=str(exc))
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        self._load_failures.succeeded("load")
        # The read recorded the epoch: from now on an earlier owner's writes are refused, and ours carry it.
        self.leader_epoch = epoch
        group = self.key.group_id
        self.state = SharePartition(
            group,
            self.key.topic_id,
            self.key.partition,
            start_offset=start,
            state_epoch=result.state_epoch,
            state_batches=result.state_batches,
            lock_duration_ms=self.group_configs.get_int(group, "share.record.lock.duration.ms"),
            delivery_count_limit=self.group_configs.get_int(group, "share.delivery.count.limit"),
            max_in_flight_records=self.group_configs.get_int(group, "share.partition.max.record.locks"),
            leader_epoch=epoch,
            dead_letter=self._dead_letter_enabled(),
        )
        # Only ARCHIVING found on disk may already be in the dead-letter topic (a crash mid-way).
        self._dead_letter_recovering = any(b.delivery_state == RecordState.ARCHIVING for b in result.state_batches)
        if result.start_offset >= 0 and self.state.unwritten:
            # The load sent records over a lowered delivery limit to ARCHIVING: durable before they are
            # dead-lettered. A failed write leaves them for the next write, and dead-lettering waits for it.
            await self._persist_standing(self.state)
        if result.start_offset < 0:
            # Record the offset share.auto.offset.reset chose, so a restart resumes from it instead of
            # resolving "latest" again and skipping what was produced in between.
            write_err: int = ErrorCode.UNKNOWN_SERVER_ERROR
            try:
                write_err = await self._persist()
            finally:
                if write_err != ErrorCode.NONE:
                    self.state = None  # not recorded (or cancelled): load afresh next time
            if write_err != ErrorCode.NONE:
                return write_err
        self.load_time_ms = (time.monotonic() - started) * 1000
        if self.on_load is not None:
            self.on_load(self.load_time_ms)
        self._publish()
        self._maybe_dead_letter()
        log.info("share partition loaded", group=group, partition=self.key.partition, spso=start, leader_epoch=epoch,
                 batches=len(result.state_batches), dead_letters_pending=self._dead_letter_recovering)
        return ErrorCode.NONE

    async def _load_epoch(self) -> tuple[int, int]:
        """(error code, the leader epoch to read the state with)."""
        if not self.bump_leader_epoch:
            return ErrorCode.NONE, LEADER_EPOCH
        summary = await self.persister.read_state_summary(self.key, LEADER_EPOCH)
        if summary.error_code != ErrorCode.NONE:
            log.warning("share partition leader epoch not read", group=self.key.group_id,
                        partition=self.key.partition, error_code=summary.error_code, error=summary.error_message)
            return map_persister_error(summary.error_code), LEADER_EPOCH
        epoch = next_leader_epoch(summary.leader_epoch)
        if epoch is None:
            log.error("share partition leader epoch exhausted", group=self.key.group_id, partition=self.key.partition)
            return ErrorCode.UNKNOWN_SERVER_ERROR, LEADER_EPOCH
        return ErrorCode.NONE, epoch

    async def _reset_offset(self) -> int:
        """Resolve an uninitialised start offset through the group's share.auto.offset.reset."""
        # The policy may have been set through another sidecar just before this first fetch: read it as
        # the upstream has it now, or "latest" would skip what was produced for the group meanwhile.
        await self.group_configs.refresh()
        policy = self.group_configs.get(self.key.group_id, "share.auto.offset.reset")
        if policy == "earliest":
            return await self.source.list_offset(EARLIEST)
        if policy.startswith("by_duration:"):
            return await self.source.list_offset(now_ms() - parse_iso_duration_ms(policy.split(":", 1)[1]))
        return await self.source.list_offset(LATEST)

    def apply_group_config(self) -> None:
        """Dynamic group configs change lock duration and limits for what comes next."""
        if self.state is None:
            return
        group = self.key.group_id
        self.state.lock_duration_ms = self.group_configs.get_int(group, "share.record.lock.duration.ms")
        self.state.delivery_count_limit = self.group_configs.get_int(group, "share.delivery.count.limit")
        self.state.max_in_flight_records = self.group_configs.get_int(group, "share.partition.max.record.locks")
        self.state.dead_letter = self._dead_letter_enabled()

    def drop(self) -> None:
        self.state = None
        self._cancel_timer()

    async def drop_if_state_changed(self) -> bool:
        """KIP-932: when a share session starts using this share partition, check that the stored state is
        still the one loaded. An alter of the group's offsets (a higher state epoch) or their deletion
        (no state, or state not initialised yet) made by a group coordinator elsewhere (another sidecar)
        means memory is stale: it is dropped and the next use loads the stored state. Returns whether it
        was dropped; an unanswered check keeps it (a stale write is still fenced, FENCED_STATE_EPOCH)."""
        state = self.state
        if state is None:
            return False
        summary = await self.persister.read_state_summary(self.key, LEADER_EPOCH)
        if summary.error_code != ErrorCode.NONE:
            return False
        if summary.start_offset >= 0 and summary.state_epoch == state.state_epoch:
            return False
        async with self.lock:
            if self.state is not state:
                return False  # dropped or loaded again meanwhile
            log.info("share partition state changed under its leader; loading it again", group=self.key.group_id,
                     partition=self.key.partition, state_epoch=state.state_epoch,
                     stored_state_epoch=summary.state_epoch, stored_start_offset=summary.start_offset)
            self.drop()
        return True

    @property
    def idle(self) -> bool:
        """Nothing is loading, acquiring, acknowledging, writing or dead-lettering. Records in ARCHIVING keep
        the share partition in memory: dropped, their dead-letter records would wait for the next load,
        which an idle group may never bring."""
        busy = self._dead_letter_task is not None or (self.state is not None and self.state.archiving_count > 0)
        return not self.lock.locked() and self.writes_in_flight == 0 and not busy

    # ---- acquisition --------------------------------------------------------------------------

    async def acquire(self, member_id: str, *, max_records: int, batch_size: int, max_bytes: int,
                      mode: AcquireMode, headers_only: bool = False) -> Acquisition:
        # read_committed reads the last stable offset: a first build of the producer state runs in slices.
        if self.plog is not None:
            await self.plog.load_producer_state(only_for_transactions=True)
        async with self.lock:
            err = await self.ensure_loaded()
            sp = self.state
            if err != ErrorCode.NONE or sp is None:
                return Acquisition(b"", [], err)
            if not sp.can_acquire():
                return Acquisition(b"", [])
            archiving = sp.archiving_count
            try:
                return await self._acquire(sp, member_id, max_records=max_records, batch_size=batch_size,
                                     max_bytes=max_bytes, mode=mode, headers_only=headers_only)
            finally:
                if sp.archiving_count > archiving and self.state is sp:
                    # Records over a lowered delivery count limit went to ARCHIVING: like an
                    # acknowledgement's, the change is persisted first, then dead-lettered (`_write`).
                    finish(self._persist_standing(sp))

    async def _acquire(self, sp: SharePartition, member_id: str, *, max_records: int, batch_size: int, max_bytes: int,
                 mode: AcquireMode, headers_only: bool) -> Acquisition:
        """The acquisition itself, under `lock`, once the state is loaded."""
        read_committed = self.group_configs.get(self.key.group_id, "share.isolation.level") == "read_committed"
        while True:
            fetch_offset = sp.next_fetch_offset()
            try:
                read_bytes = self._read_size.bytes_for(sp.acquirable(max_records), max_bytes)
                read = await self.source.read(fetch_offset, read_bytes, read_committed=read_committed)
            except OffsetOutOfRange as exc:
                # The log start moved past the fetch offset: archive what is gone and start again from the log
                # start. Only then, as in Kafka; records still acquired below it can be acknowledged until then.
                sp.on_log_start_offset_moved(exc.log_start_offset)
                return Acquisition(b"", [])
            except SourceUnavailable as exc:
                log.warning("share partition's log unavailable", group=self.key.group_id,
                            partition=self.key.partition, error=str(exc))
                return Acquisition(b"", [], ErrorCode.NOT_LEADER_OR_FOLLOWER)
            # read_committed acquires only below the last stable offset (KIP-932).
            limit = read.last_stable_offset if read_committed else read.high_watermark
            batches = [(h, v) for h, v in read.batches if h.base_offset < limit]
            if not batches:
                return Acquisition(b"", [])
            self._read_size.observe(h for h, _ in batches)
            skipped = undeliverable(read) if read_committed else {
                (h.base_offset, h.last_offset) for h, _ in batches if h.is_control}
            if skipped:
                sp.archive_undeliverable(sorted(skipped))
                batches = [(h, v) for h, v in batches if (h.base_offset, h.last_offset) not in skipped]
            fetched = [FetchedBatch(h.base_offset, h.last_offset) for h, _ in batches]
            ranges = sp.acquire(member_id, fetched, max_records=max_records, batch_size=batch_size,
                                now_ms=now_ms(), mode=mode, fetch_offset=fetch_offset) if fetched else []
            if ranges:
                break
            if not skipped or not sp.can_acquire():
                return Acquisition(b"", [])
            # Only markers or aborted records were read: read on rather than wait for new data.
        self._arm_timer()
        self._publish()
        first, last = ranges[0].first_offset, ranges[-1].last_offset
        # Whole stored batches from the one holding the first acquired offset to the one holding the last.
        # The views are adjacent slices of one read, so joining them copies the bytes once. `headers_only`
        # sends each batch's header alone: the same acquisition, none of its payload.
        chosen = [view[:HEADER_SIZE] if headers_only else view
                  for h, view in batches if h.last_offset >= first and h.base_offset <= last]
        return Acquisition(b"".join(chosen), ranges)

    async def fetchable_bytes(self, enough: int) -> int:
        """Log bytes from the next fetch offset on, counted up to `enough`: what a long poll weighs
        against MinBytes before acquiring anything (`enough` when loading failed: a fetch reports why)."""
        if self.plog is not None:
            await self.plog.load_producer_state(only_for_transactions=True)
        async with self.lock:
            if await self.ensure_loaded() != ErrorCode.NONE or self.state is None:
                return enough
            sp = self.state
            if not sp.can_acquire():
                return 0
            read_committed = self.group_configs.get(self.key.group_id, "share.isolation.level") == "read_committed"
            try:
                # read_committed: 0 when only an open transaction's records lie ahead (nothing to acquire yet).
                return await self.source.bytes_from(sp.next_fetch_offset(), enough, read_committed=read_committed)
            except SourceUnavailable:
                return enough  # the fetch reports it

    # ---- acknowledgement and release ------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: list[AckBatch]) -> asyncio.Future[int]:
        return self.start_acknowledge(member_id, batches).done

    def start_acknowledge(self, member_id: str, batches: list[AckBatch]) -> PendingAcknowledgement:
        """Start an acknowledgement now; a fetch that waits for `applied` acquires with it in memory."""
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done = finish(self._acknowledge(member_id, batches, applied))
        # A task cancelled before it ever ran never reaches the `finally` that settles `applied`.
        done.add_done_callback(lambda _done: None if applied.done() else applied.set_result(None))
        return PendingAcknowledgement(applied, done)

    async def _acknowledge(self, member_id: str, batches: list[AckBatch], applied: asyncio.Future[None]) -> int:
        try:
            async with self.lock:
                err = await self.ensure_loaded()
                sp = self.state
                if err != ErrorCode.NONE or sp is None:
                    return err
                if any(AcknowledgeType.RENEW in b.ack_types for b in batches) and not self.group_configs.get_bool(
                        self.key.group_id, "share.renew.acknowledge.enable"):
                    # KIP-1240: the group refuses RENEW; the records stay as they are. INVALID_RECORD_STATE is
                    # what Kafka 4.3 answers (its ShareConsumerRenewTest.testRenewAcknowledgementDisabled).
                    return ErrorCode.INVALID_RECORD_STATE
                outcome = sp.acknowledge(member_id, batches, now_ms=now_ms(), until_written=True)
                if outcome.error_code != ErrorCode.NONE:
                    return outcome.error_code
                if not outcome.persist_required:
                    self._arm_timer()
        finally:
            # Also on refusal or cancellation: whoever waits for memory to hold it may go on.
            if not applied.done():
                applied.set_result(None)
        code = await self._write_outcome(sp, outcome) if outcome.persist_required else ErrorCode.NONE
        self._changed()
        return code

    def release_member(self, member_id: str) -> asyncio.Future[None]:
        """Release the member's acquired records; started at once, so it runs even if never awaited."""
        return finish(self._release_member(member_id))

    async def _release_member(self, member_id: str) -> None:
        async with self.lock:
            sp = self.state
            if sp is None:
                return
            outcome = sp.release_member(member_id, now_ms=now_ms(), until_written=True)
        if outcome is not None:
            await self._write_outcome(sp, outcome)
        self._changed()

    async def _write_outcome(self, sp: SharePartition, outcome: AckOutcome) -> int:
        """Persist an applied transition; complete it when written, roll it back (records back to
        ACQUIRED) when not, so memory matches what is durable."""
        write_err: int = ErrorCode.UNKNOWN_SERVER_ERROR
        try:
            write_err = await self._persist()
        finally:
            # Also when cancelled mid-write: not known to be durable, so rolled back.
            if self.state is sp:
                if write_err != ErrorCode.NONE:
                    sp.rollback(outcome, now_ms=now_ms())
                    self._after_failed_write(write_err)
                    self._cancel_timer()
                else:
                    sp.written(outcome)
                self._arm_timer()
        return write_err

    async def _expire_locks(self) -> None:
        async with self.lock:
            sp = self.state
            if sp is None:
                return
            expired = sp.expire_locks(now_ms())
            self._timer_at = None
            self._arm_timer()
        if expired and self.state is sp:
            # The transition stands even if the write fails (as in Kafka); the next write carries it.
            await self._persist_standing(sp)
        self._changed()

    async def _persist_standing(self, sp: SharePartition) -> None:
        """Persist a transition that stands in memory whether or not the write succeeds: a failed (or
        cancelled) write marks the state so the next write carries it."""
        write_err: int = ErrorCode.UNKNOWN_SERVER_ERROR
        try:
            write_err = await self._persist()
        finally:
            if write_err != ErrorCode.NONE and self.state is sp:
                sp.mark_write_failed()

    async def _persist(self) -> int:
        """Write what changed, in order with every other write of this share partition.

        Group commit: each caller has applied its change in memory before it asks, and a write carries the
        whole state as it is when the write starts. So the writes that queued behind one in flight are all
        covered by the next one to start, and share its outcome, instead of each waiting for a write (and
        an fsync) of its own in turn."""
        self.writes_in_flight += 1
        self._write_requests += 1
        ticket = self._write_requests
        try:
            async with self.write_lock:
                if self._written_through >= ticket:
                    return self._last_write_code
                through = self._write_requests
                code = await self._write()
                self._written_through, self._last_write_code = through, code
                return code
        finally:
            self.writes_in_flight -= 1

    async def _write(self) -> int:
        sp = self.state
        if sp is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER  # dropped while the write waited its turn
        snap = sp.write_state()
        request = WriteStateRequest(
            key=self.key,
            state_epoch=snap.state_epoch,
            leader_epoch=self.leader_epoch,
            start_offset=snap.start_offset,
            delivery_complete_count=snap.delivery_complete_count,
            state_batches=list(snap.state_batches),
        )
        try:
            code = await self.persister.write_state(request)
        except Exception:
            log.exception("share state write failed", group=self.key.group_id, partition=self.key.partition)
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        self._state_durable = code == ErrorCode.NONE
        if self._state_durable:
            # ARCHIVING is durable now, so its dead-letter records may be written.
            self._maybe_dead_letter()
        return map_persister_error(code)

    # ---- dead-lettering (KIP-1191) ---------------------------------------------------------------

    def _dead_letter_enabled(self) -> bool:
        return self.dead_letters is not None and self.dead_letters.enabled(self.key.group_id)

    def _maybe_dead_letter(self) -> None:
        sp = self.state
        if sp is None or sp.archiving_count == 0 or self._dead_letter_task is not None:
            return
        self._dead_letter_task = finish(self._dead_letter_loop(sp))

    async def _dead_letter_loop(self, sp: SharePartition) -> None:
        """Write the dead-letter records of ARCHIVING runs, then persist them ARCHIVED; until none is left.

        Only runs known to be durable are taken: none while a state write is in flight (it may carry
        ARCHIVING that could still be rolled back) or after a failed write; the next successful write
        starts this loop again.
        """
        try:
            while True:
                async with self.lock:
                    durable = self.state is sp and self.writes_in_flight == 0 and self._state_durable
                    runs = sp.archiving_runs() if durable else []
                    if not runs:
                        self._dead_letter_task = None
                        return
                    recovering = self._dead_letter_recovering
                await self._write_dead_letters(sp, runs, recovering)
                async with self.lock:
                    if self.state is not sp:
                        self._dead_letter_task = None
                        return
                    self._dead_letter_recovering = False
                    sp.complete_archiving(runs)
                # Memory says ARCHIVED; a crash before the next write leaves ARCHIVING on disk,
                # and the load then skips the records already in the dead-letter topic.
                await self._persist_standing(sp)
                self._changed()
        except BaseException:
            self._dead_letter_task = None
            raise

    async def _write_dead_letters(self, sp: SharePartition, runs: list[ArchivingRun],
                                  recovering: bool) -> None:
        writer = self.dead_letters
        group = self.key.group_id
        topic = writer.topic_name(self.key.topic_id) if writer is not None else None
        if writer is None or topic is None:
            return
        # The local log, or in sidecar mode the upstream partition, which copies are read from.
        source = Source(group, topic, self.key.partition, self.plog if self.plog is not None else self.source)
        try:
            written = await writer.write(source, runs, skip_existing=recovering)
            log.debug("records dead-lettered", group=group, topic=topic, partition=self.key.partition,
                      records=written)
        except NotDeadLettered as exc:
            log.warning("records archived without a dead-letter record", group=group, topic=topic,
                        partition=self.key.partition, reason=str(exc))
        except Exception:
            # As Kafka does once its retries are spent: the records are archived all the same.
            log.exception("dead-letter write failed; records archived", group=group, topic=topic,
                          partition=self.key.partition)

    def _after_failed_write(self, code: int) -> None:
        if code in _FENCING:
            log.warning("share partition fenced; dropping in-memory state", group=self.key.group_id,
                        partition=self.key.partition, error_code=code)
            self.drop()

    def _publish(self) -> None:
        """Compute, on the event loop, the values the metrics thread cannot safely derive itself."""
        sp = self.state
        if sp is None:
            self.published_delivery_complete, self.published_oldest_lock_ms = 0, None
            return
        self.published_delivery_complete = sp.delivery_complete_count
        self.published_oldest_lock_ms = sp.oldest_lock_start_ms()

    def _changed(self) -> None:
        self._publish()
        self.purgatory.notify(self.wake_key)
        if self.on_change is not None:
            self.on_change(self)

    # ---- acquisition-lock timer ------------------------------------------------------------------

    def _arm_timer(self) -> None:
        sp = self.state
        if sp is None:
            return
        deadline = sp.next_lock_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline - now_ms()) / 1000)
        self._timer_at = deadline
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        asyncio.get_running_loop().create_task(self._expire_locks())

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None


class SharePartitionLeaders:
    """Every share partition this broker leads, created on first use."""

    def __init__(self, persister: Persister, group_configs: GroupConfigs, purgatory: Purgatory,
                 dead_letters: DeadLetterWriter | None = None):
        self.dead_letters = dead_letters
        self.persister = persister
        self.group_configs = group_configs
        self.purgatory = purgatory
        self._leaders: dict[SharePartitionKey, SharePartitionLeader] = {}
        self.on_load: Callable[[float], None] | None = None  # metric hook for every leader's state load
        # Set in several-sidecar mode, where share-partition leadership moves between instances without a
        # take: each load then fences the previous leader through a higher leader epoch.
        self.bump_leader_epoch = False
        # Set in several-sidecar mode, where a share group's coordinator may run in another instance: a share
        # session that starts using a partition checks it against its stored state (`drop_if_state_changed`).
        # Standalone, the coordinator drops the partitions itself when it alters or deletes their state.
        self.check_stored_state = False
        # Whether this broker leads a (topic id, partition): always standalone; in sidecar mode only the
        # partitions the sidecar group assigned to this instance.
        self.leads: Callable[[bytes, int], bool] = lambda _topic_id, _partition: True

    def get(self, key: SharePartitionKey) -> SharePartitionLeader | None:
        return self._leaders.get(key)

    def get_or_create(self, key: SharePartitionKey, source: PartitionSource) -> SharePartitionLeader:
        leader = self._leaders.get(key)
        if leader is None or leader.source is not source:
            leader = SharePartitionLeader(key, source, self.persister, self.group_configs, self.purgatory,
                                          dead_letters=self.dead_letters, bump_leader_epoch=self.bump_leader_epoch)
            leader.on_load = self.on_load
            self._leaders[key] = leader
        return leader

    def all(self) -> list[SharePartitionLeader]:
        return list(self._leaders.values())

    @staticmethod
    def changes_in_progress() -> set[asyncio.Task[Any]]:
        """Acknowledgements and releases still running (the broker lets them finish before it stops)."""
        return set(_finishing)

    def of_group(self, group_id: str) -> list[SharePartitionLeader]:
        return [leader for key, leader in self._leaders.items() if key.group_id == group_id]

    def drop_group(self, group_id: str) -> None:
        for key in [k for k in self._leaders if k.group_id == group_id]:
            self._leaders.pop(key).drop()

    def drop_idle_group(self, group_id: str) -> int:
        """Forget the group's share partitions that nothing is using (their state is durable and is
        loaded again on next use); returns how many went."""
        keys = [k for k, leader in self._leaders.items() if k.group_id == group_id and leader.idle]
        for key in keys:
            self._leaders.pop(key).drop()
        return len(keys)

    def drop_unled(self) -> int:
        """Forget the share partitions this broker no longer leads (their state is durable: the new leader
        loads it); returns how many went."""
        keys = [k for k in self._leaders if not self.leads(k.topic_id, k.partition)]
        for key in keys:
            self._leaders.pop(key).drop()
        return len(keys)

    def drop_topic(self, topic_id: bytes) -> None:
        for key in [k for k in self._leaders if k.topic_id == topic_id]:
            self._leaders.pop(key).drop()

    def drop_where(self, predicate: Callable[[SharePartitionKey], bool]) -> int:
        """Forget the share partitions whose key matches (their state partition was lost to another
        instance: they hand out nothing until their state is read again); returns how many went."""
        keys = [k for k in self._leaders if predicate(k)]
        for key in keys:
            self._leaders.pop(key).drop()
        return len(keys)

    def group_config_changed(self, group_id: str) -> None:
        for key, leader in self._leaders.items():
            if key.group_id == group_id:
                leader.apply_group_config()
