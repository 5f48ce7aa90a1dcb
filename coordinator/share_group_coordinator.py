"""Share groups in the group coordinator: membership, assignment and share-partition state initialisation.

Share-group records live in `__consumer_offsets` on the group's partition (placed like Kafka places
groups), in the same `GroupCoordinatorShard` as the classic and consumer groups. Each change is planned
by the pure model in `share_group` and run through the group coordinator's runtime: appended durably,
replayed into the partition's shard and only then answered, one operation at a time per group.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog

from shoal.backoff import Backoff
from shoal.persister.persister import Persister, SharePartitionKey
from shoal.protocol import messages
from shoal.protocol.coordinator_records import fits_key_string
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import MAX_MEMBER_ID_LENGTH

from .assignor import ASSIGNOR_NAME, SimpleAssignor
from .group_coordinator_shard import GroupRuntime, GroupsOfOneType
from .placement import Placement, coordinator_partition
from .record_log import CoordinatorLogError, CoordinatorRecordLog
from .runtime import Answer, AsyncSteps, Steps
from .share_group import (
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    GroupState,
    InitRequest,
    ShareGroup,
    ShareGroupError,
    TopicInit,
    TopicMetadataSource,
    group_epoch_record,
    state_partition_metadata_record,
    target_metadata_record,
)

__all__ = [
    "DescribedGroup", "GroupConfigSource", "ShareGroupConfig", "ShareGroupCoordinator", "TopicMetadataSource",
    "partition_for_group",
]

log = structlog.get_logger("shoal.share_groups")

HeartbeatRequest = messages.ShareGroupHeartbeatRequest
HeartbeatResponse = messages.ShareGroupHeartbeatResponse
DescribeResponse = messages.ShareGroupDescribeResponse
_HbAssignment = HeartbeatResponse.Assignment
_HbTopicPartitions = HeartbeatResponse.TopicPartitions
DescribedGroup = DescribeResponse.DescribedGroup
_DMember = DescribeResponse.Member
_DAssignment = DescribeResponse.Assignment
_DTopicPartitions = DescribeResponse.TopicPartitions


@dataclass(slots=True)
class ShareGroupConfig:
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    max_size: int = 200
    initialize_retry_interval_ms: int = 30000
    assignment_interval_ms: int = 1000  # group.share.assignment.interval.ms (KIP-1263)
    # How often initialisations and state deletions that failed are looked at again (a runtime timer).
    maintenance_interval_ms: int = 1000
    # A heartbeat that starts initialising partitions waits for it and answers with them assigned, instead
    # of leaving them to the member's next heartbeat as Kafka does (sidecar mode: there the wait for the
    # next heartbeat is what a new share consumer of a busy upstream notices first).
    assign_after_initialization: bool = False


class GroupConfigSource(Protocol):
    """Dynamic per-group configs (`share.session.timeout.ms`, `share.heartbeat.interval.ms`), with broker fallbacks."""

    def get_int(self, group_id: str, key: str) -> int: ...


@runtime_checkable
class TopicLearner(Protocol):
    """A topic source that may not know every topic yet (sidecar mode: the upstream's metadata, re-read
    periodically): asked to re-read it when a heartbeat names topics it does not know."""

    async def learn_topics(self, names: Iterable[str]) -> None: ...


def partition_for_group(group_id: str, num_partitions: int) -> int:
    """A group's records live on the `__consumer_offsets` partition Kafka would pick for it."""
    return coordinator_partition(group_id, num_partitions)


def _response_assignment(assignment: dict[bytes, frozenset[int]] | None) -> HeartbeatResponse.Assignment | None:
    if assignment is None:
        return None
    return _HbAssignment(topic_partitions=[
        _HbTopicPartitions(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(assignment.items())
    ])


def _error_response(code: ErrorCode, message: str | None = None) -> HeartbeatResponse:
    return HeartbeatResponse(error_code=code, error_message=message)


class ShareGroupCoordinator(GroupsOfOneType[ShareGroup]):
    def __init__(
        self,
        record_log: CoordinatorRecordLog | GroupRuntime,
        topics: TopicMetadataSource,
        persister: Persister,
        config: ShareGroupConfig | None = None,
        *,
        group_configs: GroupConfigSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        placement: Placement[str] | None = None,
    ):
        super().__init__(record_log, ShareGroup, placement)
        self.topics = topics
        self.persister = persister
        self.config = config or ShareGroupConfig()
        self.group_configs = group_configs
        self.clock = clock
        self.wall_clock = wall_clock  # seconds since the epoch; assignment timestamps are persisted
        self.assignor = SimpleAssignor()
        self.loaded = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self._init_inflight: set[tuple[str, bytes, int]] = set()
        # Initialisations under way per group, which a heartbeat that started one waits for.
        self._init_tasks: dict[str, set[asyncio.Task[None]]] = {}
        # Partitions of deleted topics whose persisted state still has to be deleted, per group.
        self._pending_state_deletes: dict[str, dict[bytes, set[int]]] = {}
        # Background retries (initialisations, state deletions) back off and log sparingly.
        self._retries = Backoff()
        self._retry_timer: asyncio.TimerHandle | None = None
        self._retrying: asyncio.Task[None] | None = None

    # ---- placement, operations, writing -----------------------------------------------------------

    @property
    def rebalances(self) -> int:
        """Group epoch bumps since start."""
        return sum(shard.share_epoch_bumps for shard in self.runtime.shards)

    def session_timeout(self, group_id: str) -> float:
        """Seconds a member may stay silent (group config `share.session.timeout.ms` wins)."""
        if self.group_configs is not None:
            return self.group_configs.get_int(group_id, "share.session.timeout.ms") / 1000
        return self.config.session_timeout_ms / 1000

    def heartbeat_interval_ms(self, group_id: str) -> int:
        if self.group_configs is not None:
            return self.group_configs.get_int(group_id, "share.heartbeat.interval.ms")
        return self.config.heartbeat_interval_ms

    def assignment_interval_ms(self, group_id: str) -> int:
        if self.group_configs is not None:
            return self.group_configs.get_int(group_id, "share.assignment.interval.ms")
        return self.config.assignment_interval_ms

    def _spawn(self, coro: Coroutine[object, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spawn_initialize(self, req: InitRequest) -> None:
        tasks = self._init_tasks.setdefault(req.group_id, set())
        task = self._spawn(self._initialize(req))
        tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            if not tasks and self._init_tasks.get(req.group_id) is tasks:
                del self._init_tasks[req.group_id]

        task.add_done_callback(done)

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def load(self) -> None:
        """Rebuild every share group from `__consumer_offsets` (partitions the group coordinator loaded
        already are not read again)."""
        await self._load_shards()
        for shard in self.runtime.shards:
            shard.share_epoch_bumps = 0  # the rebalance count starts now
        now = self.clock()
        for group in self.groups.values():
            deadline = now + self.session_timeout(group.group_id)
            for member in group.members.values():
                member.session_deadline = deadline
        self.loaded = True
        log.info("share groups loaded", groups=len(self.groups))

    def start(self) -> None:
        """Session timers for the members restored from the log, and the retry timer (needs a running loop)."""
        self._started = True
        for group in self.groups.values():
            for member in group.members.values():
                self._arm_session(group.group_id, member.member_id, member.session_deadline - self.clock())
        self._schedule_retries()

    async def stop(self) -> None:
        self._started = False
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runtime.drain()  # operations already started finish

    async def wait_for_background(self) -> None:
        """Wait until spawned work (initialisations, topic refreshes) has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ---- timers: sessions and retries (the runtime's keyed timers) ----------------------------------

    def _arm_session(self, group_id: str, member_id: str, delay_s: float) -> None:
        self.runtime.schedule_steps(self.partition_for(group_id), ("share-session", group_id, member_id), delay_s,
                                    group_id, lambda: self._on_session_timer(group_id, member_id))

    def _on_session_timer(self, group_id: str, member_id: str) -> Steps[None]:
        """The member's session timer fired (holding the group): it goes unless it heartbeat meanwhile."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return
        remaining = member.session_deadline - self.clock()
        if remaining > 0:
            self._arm_session(group_id, member_id, remaining)  # the clock is not the loop's: wait on
            return
        yield group.plan_remove_member(member_id, self.topics)
        log.info("share group member session expired", group_id=group_id, member_id=member_id)

    def _schedule_retries(self) -> None:
        """Initialisations and state deletions that failed are retried on a timer of this coordinator's own
        (the retry walks every group; each group's work then runs as that group's operation). It is no
        partition's timer: in sidecar mode a partition given to another instance takes its timers along,
        and the groups of the partitions kept here would never be retried again."""
        if not self._started:
            return
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._retry_timer = asyncio.get_running_loop().call_later(self.config.maintenance_interval_ms / 1000,
                                                                  self._fire_retries)

    def _fire_retries(self) -> None:
        self._retry_timer = None
        if self._retrying is not None and not self._retrying.done():
            return  # still running: it schedules the next one when it ends
        self._retrying = self._spawn(self._retry())

    async def _retry(self) -> None:
        try:
            await self.retry_pending()
            self._retries.succeeded("retry")
        except Exception:
            suppressed = self._retries.failed("retry", self.clock())
            if suppressed is not None:
                log.exception("share group retries failed", failures_not_logged=suppressed)
        finally:
            self._schedule_retries()

    # ---- heartbeat ---------------------------------------------------------------------------------

    async def heartbeat(self, req: HeartbeatRequest, client_id: str, client_host: str) -> HeartbeatResponse:
        """ShareGroupHeartbeat (KIP-932): join with epoch 0, leave with -1, otherwise keep-alive."""
        invalid = self._validate(req)
        if invalid is not None:
            return _error_response(ErrorCode.INVALID_REQUEST, invalid)
        if not self.loaded:
            return _error_response(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if self.released(req.group_id):
            return _error_response(ErrorCode.NOT_COORDINATOR)

        if req.member_epoch != LEAVE_GROUP_MEMBER_EPOCH and isinstance(self.topics, TopicLearner):
            await self._learn_topics(self.topics, req)

        def guarded(steps: Callable[[], Steps[HeartbeatResponse]]) -> Steps[HeartbeatResponse]:
            try:
                return (yield from steps())
            except ShareGroupError as exc:
                return _error_response(exc.code, exc.message)
            except CoordinatorLogError as exc:  # the state log says why (not ours any more, or try again)
                log.warning("share group heartbeat not written", group_id=req.group_id, error=str(exc))
                return _error_response(ErrorCode(exc.error_code), str(exc))
            except Exception:
                log.exception("share group heartbeat failed", group_id=req.group_id)
                return _error_response(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator could not write")

        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            return await self._write_steps(req.group_id, lambda: guarded(
                lambda: self._leave(req.group_id, req.member_id)))
        response = await self._write_steps(req.group_id, lambda: guarded(
            lambda: self._heartbeat(req, client_id, client_host)))
        initializing = self._init_tasks.get(req.group_id)
        if response.error_code != ErrorCode.NONE or not initializing or not self.config.assign_after_initialization:
            return response
        # Partitions of the group's subscriptions are being initialised: Kafka assigns only initialised
        # partitions, and hands them out at the member's next heartbeat, one heartbeat interval later. Here
        # the heartbeat waits for the initialisation and then takes the step that next heartbeat would, so
        # the member gets them in this response.
        # Bounded by the heartbeat interval: an initialisation that hangs (the state log away) leaves the
        # assignment to the member's next heartbeat, as in Kafka.
        await asyncio.wait(set(initializing), timeout=self.heartbeat_interval_ms(req.group_id) / 1000)
        return await self._write_steps(req.group_id, lambda: guarded(
            lambda: self._after_initialization(req, response, client_id, client_host)))

    async def _learn_topics(self, topics: TopicLearner, req: HeartbeatRequest) -> None:
        names = req.subscribed_topic_names
        if names is None:
            return  # a regular heartbeat; a topic created later reaches the group through its listener
        try:
            # Bounded, as the wait for an initialisation is: an upstream that does not answer leaves the
            # topic to a later heartbeat, not this one hanging.
            await asyncio.wait_for(topics.learn_topics(names), self.heartbeat_interval_ms(req.group_id) / 1000)
        except Exception as exc:  # the heartbeat goes on with what is known
            log.warning("topic metadata refresh for a share group heartbeat failed", group_id=req.group_id,
                        error=str(exc))

    def _after_initialization(self, req: HeartbeatRequest, response: HeartbeatResponse, client_id: str,
                              client_host: str) -> Steps[HeartbeatResponse]:
        """The member's heartbeat taken again once the initialisation it waited for has finished: the
        newly initialised partitions bump the group epoch and are assigned."""
        group = self.groups.get(req.group_id)
        member = None if group is None else group.members.get(req.member_id)
        if group is None or member is None or member.member_epoch != response.member_epoch:
            return response  # left, fenced or moved on meanwhile: what was answered stands
        if not group.initialized_assignment_pending(group.subscribed_topic_names(), self.topics):
            return response
        again = HeartbeatRequest(group_id=req.group_id, member_id=req.member_id, member_epoch=response.member_epoch,
                                 rack_id=None, subscribed_topic_names=None)
        # The target computed a moment ago by this heartbeat lacked only these partitions: the assignment
        # interval, which bounds assignor runs across heartbeats, does not hold this one back.
        followed = yield from self._heartbeat(again, client_id, client_host, assignment_interval_ms=0)
        if followed.assignment is None:
            followed.assignment = response.assignment
        return followed

    @staticmethod
    def _validate(req: HeartbeatRequest) -> str | None:
        if not req.member_id:
            return "MemberId can't be empty."
        if len(req.member_id) > MAX_MEMBER_ID_LENGTH:
            return f"MemberId can't be longer than {MAX_MEMBER_ID_LENGTH} characters."
        if not req.group_id:
            return "GroupId can't be empty."
        if not fits_key_string(req.group_id):
            return "GroupId can't be longer than 32767 bytes."
        if req.rack_id is not None and req.rack_id == "":
            return "RackId can't be empty."
        if req.member_epoch == JOIN_GROUP_MEMBER_EPOCH and not req.subscribed_topic_names:
            return "SubscribedTopicNames must be set in first request."
        if req.member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
            return f"MemberEpoch is {req.member_epoch}, but must be greater than or equal to -1."
        return None

    def _heartbeat(self, req: HeartbeatRequest, client_id: str, client_host: str, *,
                   assignment_interval_ms: int | None = None) -> Steps[HeartbeatResponse]:
        group = self.groups.get(req.group_id)
        if group is None:
            if self.groups.held_by_other_type(req.group_id):
                raise ShareGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a share group.")
            if req.member_epoch != JOIN_GROUP_MEMBER_EPOCH:
                raise ShareGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Share group {req.group_id} not found.")
            group = ShareGroup(req.group_id)
        if group.deleting_group:
            raise ShareGroupError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group is being deleted")
        now = self.clock()
        plan = group.plan_heartbeat(
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            rack_id=req.rack_id,
            subscribed_topic_names=req.subscribed_topic_names,
            client_id=client_id,
            client_host=client_host,
            topics=self.topics,
            assignor=self.assignor,
            max_size=self.config.max_size,
            now=now,
            init_retry_interval=self.config.initialize_retry_interval_ms / 1000,
            now_ms=int(self.wall_clock() * 1000),
            assignment_interval_ms=(self.assignment_interval_ms(req.group_id) if assignment_interval_ms is None
                                    else assignment_interval_ms),
        )
        yield plan.records
        live = self.groups[req.group_id]
        live.members[req.member_id].session_deadline = now + self.session_timeout(req.group_id)
        self._arm_session(req.group_id, req.member_id, self.session_timeout(req.group_id))
        if plan.init is not None:
            self._mark_initializing(live, plan.init, now)
            self._spawn_initialize(plan.init)
        return HeartbeatResponse(
            error_code=ErrorCode.NONE,
            member_id=plan.member_id,
            member_epoch=plan.member_epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms(req.group_id),
            assignment=_response_assignment(plan.assignment),
        )

    def _leave(self, group_id: str, member_id: str) -> Steps[HeartbeatResponse]:
        group = self.groups.get(group_id)
        if group is None:
            raise ShareGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Share group {group_id} not found.")
        if member_id not in group.members:
            raise ShareGroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
        yield group.plan_remove_member(member_id, self.topics)
        self.runtime.cancel(self.partition_for(group_id), ("share-session", group_id, member_id))
        log.info("member left share group", group_id=group_id, member_id=member_id)
        return HeartbeatResponse(error_code=ErrorCode.NONE, member_id=member_id, member_epoch=LEAVE_GROUP_MEMBER_EPOCH)

    # ---- session timeouts ----------------------------------------------------------------------------

    async def expire_members(self, now: float | None = None) -> list[tuple[str, str]]:
        """Remove every member whose session deadline passed, at once; returns the (group, member) pairs
        removed (the session timers do this member by member; this sweep is for a clock of one's own)."""
        now = self.clock() if now is None else now
        expired: list[tuple[str, str]] = []

        def expire(group_id: str, candidates: list[str]) -> Steps[None]:
            for member_id in candidates:
                current = self.groups.get(group_id)
                member = None if current is None else current.members.get(member_id)
                if current is None or member is None or member.session_deadline > now:
                    continue
                yield current.plan_remove_member(member_id, self.topics)
                expired.append((group_id, member_id))
                log.info("share group member session expired", group_id=group_id, member_id=member_id)

        for group_id in list(self.groups):
            group = self.groups.get(group_id)
            if group is None or not any(m.session_deadline <= now for m in group.members.values()):
                continue
            await self._write_steps(group_id, functools.partial(expire, group_id, sorted(group.members)))
        return expired

    # ---- share-partition state initialisation ----------------------------------------------------------

    def _mark_initializing(self, group: ShareGroup, req: InitRequest, now: float) -> None:
        for tid, parts in req.topics.items():
            info = group.initializing.get(tid)
            if info is not None:
                info.timestamp = now
            for p in parts:
                self._init_inflight.add((req.group_id, tid, p))

    async def _initialize(self, req: InitRequest) -> None:
        """Create persisted state for new share partitions, then record them as initialised."""
        keys = [(tid, p) for tid, parts in sorted(req.topics.items()) for p in sorted(parts)]
        try:
            results = await asyncio.gather(
                *(self.persister.initialize_state(SharePartitionKey(req.group_id, tid, p), req.state_epoch, -1)
                  for tid, p in keys),
                return_exceptions=True,
            )
            done: dict[bytes, set[int]] = {}
            failed = 0
            first_error: object = None
            for (tid, p), result in zip(keys, results, strict=True):
                if isinstance(result, BaseException) or result != ErrorCode.NONE:
                    failed += 1
                    first_error = result if first_error is None else first_error
                else:
                    done.setdefault(tid, set()).add(p)
            if failed:
                # One line per group, and repeated failures back off and are logged sparingly.
                suppressed = self._retries.failed(("initialize", req.group_id), self.clock())
                if suppressed is not None:
                    log.warning("share partition state initialisation failed", group_id=req.group_id,
                                partitions=failed, error=repr(first_error), failures_not_logged=suppressed)
            else:
                self._retries.succeeded(("initialize", req.group_id))

            def record_outcome() -> Steps[None]:
                group = self.groups.get(req.group_id)
                if group is None:
                    return
                if done:
                    record = group.initialized_record(done)
                    if record is not None:
                        yield [record]
                if failed:
                    # Failed partitions stay "initializing", and become due again when the backoff allows, at
                    # most one retry interval on: Kafka uninitialises them, so its next heartbeat retries them.
                    now = self.clock()
                    interval = self.config.initialize_retry_interval_ms / 1000
                    due = self._retries.next_attempt(("initialize", req.group_id))
                    retry_at = now + interval if due is None else min(due, now + interval)
                    for tid in req.topics:
                        info = group.initializing.get(tid)
                        if info is not None:
                            info.timestamp = retry_at - interval

            await self._write_steps(req.group_id, record_outcome)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("share partition initialisation failed", group_id=req.group_id)
        finally:
            for tid, p in keys:
                self._init_inflight.discard((req.group_id, tid, p))

    async def retry_pending(self, now: float | None = None) -> None:
        """Retry stale initialisations and leftover state deletions."""
        now = self.clock() if now is None else now
        interval = self.config.initialize_retry_interval_ms / 1000
        for group_id in list(self.groups):
            group = self.groups.get(group_id)
            if group is None or group.deleting_group or not self._retries.ready(("initialize", group_id), now):
                continue
            topics: dict[bytes, set[int]] = {}
            for tid, info in group.initializing.items():
                if now - info.timestamp < interval or self.topics.topic_by_id(tid) is None:
                    continue
                parts = {p for p in info.partitions if (group_id, tid, p) not in self._init_inflight}
                if parts:
                    topics[tid] = parts
            if topics:
                req = InitRequest(group_id, group.group_epoch, topics)
                self._mark_initializing(group, req, now)
                self._spawn_initialize(req)
        for group_id in list(self._pending_state_deletes):
            if self._retries.ready(("delete-state", group_id), now):
                await self._delete_topic_state(group_id)

    # ---- topic changes -------------------------------------------------------------------------------

    def on_topics_changed(self, event: str | None = None, *_args: object) -> None:
        """Broker hook (topic created/deleted, partitions added); the work runs as a task."""
        if event == "log_start_moved":
            return  # not a metadata change
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._spawn(self.refresh_topic_metadata())

    def on_upstream_topics_changed(self) -> None:
        """Sidecar mode: the upstream's metadata changed. Groups subscribed to a topic created or grown there
        bump their epoch and initialise its partitions now, not at their next heartbeat; a topic missing
        from the upstream's answer keeps its state (one metadata answer is not a deletion)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._spawn(self.refresh_topic_metadata(forget_deleted=False))

    async def refresh_topic_metadata(self, *, forget_deleted: bool = True) -> None:
        """Handle deleted topics, bump epochs of groups whose subscribed metadata changed, start
        initialising new partitions."""
        if not self.loaded:
            return
        now = self.clock()

        def refresh(group_id: str) -> Steps[None]:
            group = self.groups.get(group_id)
            if group is None or group.deleting_group:
                return
            if forget_deleted:
                yield from self._move_deleted_topics(group)
            group = self.groups[group_id]
            records = group.plan_metadata_refresh(self.topics)
            missing = group.uninitialized_partitions(
                group.subscribed_topic_names(), self.topics, now, self.config.initialize_retry_interval_ms / 1000
            ) if group.members else {}
            if missing:
                records.append(group.initializing_record(missing))
            yield records
            if missing:
                live = self.groups[group_id]
                req = InitRequest(group_id, live.group_epoch, {tid: set(ti.partitions) for tid, ti in missing.items()})
                self._mark_initializing(live, req, now)
                self._spawn_initialize(req)

        for group_id in list(self.groups):
            await self._write_steps(group_id, functools.partial(refresh, group_id))
            if group_id in self._pending_state_deletes:
                await self._delete_topic_state(group_id)

    def _move_deleted_topics(self, group: ShareGroup) -> Steps[None]:
        """Forget deleted topics (caller holds the lock), as Kafka does: they leave every state map of the
        group, and their persisted state is tombstoned by the share coordinator when the topic goes, so
        there is nothing left to delete and nothing to retry."""
        def alive(tid: bytes) -> bool:
            return self.topics.topic_by_id(tid) is not None

        phases = (group.initializing, group.initialized, group.deleting)
        if all(alive(tid) for phase in phases for tid in phase):
            return
        initializing = {tid: ti for tid, ti in group.initializing.items() if alive(tid)}
        initialized = {tid: ti for tid, ti in group.initialized.items() if alive(tid)}
        deleting = {tid: name for tid, name in group.deleting.items() if alive(tid)}
        yield [state_partition_metadata_record(group.group_id, initializing, initialized, deleting)]
        pending = self._pending_state_deletes.get(group.group_id)
        if pending is not None:
            for tid in [tid for tid in pending if not alive(tid)]:
                del pending[tid]
            if not pending:
                self._pending_state_deletes.pop(group.group_id, None)
                self._retries.forget(("delete-state", group.group_id))

    async def _delete_topic_state(self, group_id: str) -> None:
        """Phase two: delete the persisted state, then drop the topics from "deleting"."""
        pending = self._pending_state_deletes.get(group_id, {})
        finished: set[bytes] = set()
        for tid, parts in list(pending.items()):
            if await self._delete_state(group_id, {tid: parts}, retrying=True) == ErrorCode.NONE:
                finished.add(tid)
        if finished == set(pending):
            self._retries.succeeded(("delete-state", group_id))
        if not finished:
            return
        for tid in finished:
            pending.pop(tid, None)
        if not pending:
            self._pending_state_deletes.pop(group_id, None)

        def forget_deleted() -> Steps[None]:
            group = self.groups.get(group_id)
            if group is None or not finished & set(group.deleting):
                return
            deleting = {tid: name for tid, name in group.deleting.items() if tid not in finished}
            yield [state_partition_metadata_record(group_id, group.initializing, group.initialized, deleting)]

        await self._write_steps(group_id, forget_deleted)

    async def _delete_state(self, group_id: str, topics: dict[bytes, set[int]], *, retrying: bool = False) -> int:
        """Delete the persisted state of the partitions; a topic deleted meanwhile counts as done (its state
        was tombstoned with it). Failures of background retries back off and are logged sparingly."""
        keys = [SharePartitionKey(group_id, tid, p) for tid, parts in sorted(topics.items()) for p in sorted(parts)]
        results = await asyncio.gather(*(self.persister.delete_state(k) for k in keys), return_exceptions=True)
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, BaseException) or result != ErrorCode.NONE:
                if result == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and self.topics.topic_by_id(key.topic_id) is None:
                    continue
                code = result if isinstance(result, int) and not isinstance(result, bool) else ErrorCode.UNKNOWN_SERVER_ERROR
                suppressed = self._retries.failed(("delete-state", group_id), self.clock()) if retrying else 0
                if suppressed is not None:
                    log.warning("share partition state deletion failed", group_id=group_id, partition=key.partition,
                                error=repr(result), failures_not_logged=suppressed)
                return code
        return ErrorCode.NONE

    # ---- admin ---------------------------------------------------------------------------------------

    def describe(self, group_ids: Iterable[str]) -> list[DescribeResponse.DescribedGroup]:
        """ShareGroupDescribe v1 bodies, one per requested group."""
        out = []
        for group_id in group_ids:
            if self.released(group_id):  # sidecar mode: another instance holds the group's partition now
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.NOT_COORDINATOR, members=[]))
                continue
            group = self.groups.get(group_id)
            if group is None:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                                          error_message=f"Group {group_id} not found.", members=[]))
                continue
            members = []
            for m in sorted(group.members.values(), key=lambda x: x.member_id):
                tps = []
                for tid, ps in sorted(m.assigned_partitions.items()):
                    meta = self.topics.topic_by_id(tid)
                    if meta is not None:
                        tps.append(_DTopicPartitions(topic_id=tid, topic_name=meta[0], partitions=sorted(ps)))
                members.append(_DMember(
                    member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                    client_host=m.client_host, subscribed_topic_names=sorted(m.subscribed_topic_names),
                    assignment=_DAssignment(topic_partitions=tps),
                ))
            out.append(DescribedGroup(
                error_code=ErrorCode.NONE, group_id=group_id, group_state=group.state.value,
                group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
                assignor_name=ASSIGNOR_NAME, members=members,
            ))
        return out

    def list_groups(self) -> list[tuple[str, str]]:
        return [(gid, g.state.value) for gid, g in sorted(self.groups.items())]

    def group_ids(self) -> list[str]:
        return sorted(self.groups)

    def is_empty(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is None or not group.members

    def groups_by_state(self) -> dict[str, int]:
        counts = {s.value: 0 for s in GroupState}
        for g in self.groups.values():
            counts[g.state.value] += 1
        return counts

    def assigned_partitions(self, group_id: str, member_id: str) -> dict[bytes, frozenset[int]]:
        """The member's current assignment (empty if unknown) — for share-fetch validation."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        return {} if member is None else dict(member.assigned_partitions)

    async def delete_group(self, group_id: str) -> int:
        """DeleteGroups for a share group: must be empty; its persisted share state goes first."""
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

        async def operation(answer: Answer[int]) -> AsyncSteps:
            group = self.groups.get(group_id)
            if group is None:
                answer.value = ErrorCode.GROUP_ID_NOT_FOUND
                return
            if group.members:
                answer.value = ErrorCode.NON_EMPTY_GROUP
                return
            # Everything with state becomes "deleting" first, so a crash mid-way leaves a trace to retry.
            targets: dict[bytes, set[int]] = {}
            names: dict[bytes, str] = {}
            for phase in (group.initialized, group.initializing):
                for tid, info in phase.items():
                    targets.setdefault(tid, set()).update(info.partitions)
                    names[tid] = info.name
            for tid, name in group.deleting.items():
                meta = self.topics.topic_by_id(tid)
                if meta is not None:
                    targets.setdefault(tid, set()).update(range(meta[1]))
                names.setdefault(tid, name)
            for tid, parts in self._pending_state_deletes.get(group_id, {}).items():
                targets.setdefault(tid, set()).update(parts)
            try:
                if names:
                    yield [state_partition_metadata_record(group_id, {}, {}, names)]
                    group = self.groups[group_id]
                group.deleting_group = True
                code = await self._delete_state(group_id, targets) if targets else ErrorCode.NONE
                if code != ErrorCode.NONE:
                    answer.value = code
                    return
                yield group.plan_delete()
            except Exception:
                log.exception("share group deletion failed", group_id=group_id)
                answer.value = ErrorCode.UNKNOWN_SERVER_ERROR
                return
            finally:
                group.deleting_group = False
            self._pending_state_deletes.pop(group_id, None)
            log.info("share group deleted", group_id=group_id)
            answer.value = ErrorCode.NONE

        return await self._write_async_steps(group_id, operation, ErrorCode.UNKNOWN_SERVER_ERROR)


    # ---- share-group offsets admin (Describe/Alter/DeleteShareGroupOffsets) ---------------------------

    def initialized_partitions(self, group_id: str) -> dict[bytes, set[int]] | None:
        """Partitions with initialised share state, per topic id; None when the group does not exist."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        return {tid: set(info.partitions) for tid, info in group.initialized.items() if info.partitions}

    async def alter_offsets(
        self, group_id: str, offsets: dict[bytes, dict[int, int]], *, min_state_epoch: int = 0
    ) -> tuple[int, dict[tuple[bytes, int], int]]:
        """AlterShareGroupOffsets: re-initialise each partition's state at the given start offset.

        As in Kafka the group epoch stays as it is and is the state epoch of the re-initialisation
        (raised to `min_state_epoch`, the highest state epoch the share coordinator holds, so the
        re-initialisation is not fenced). The group is created (empty) when it does not exist yet, so
        the offsets are what its first consumers start from. Returns the group-level error and a
        per-partition error map.
        """
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, {}
        if self.groups.held_by_other_type(group_id):
            return ErrorCode.GROUP_ID_NOT_FOUND, {}

        async def operation(answer: Answer[tuple[int, dict[tuple[bytes, int], int]]]) -> AsyncSteps:
            existing = self.groups.get(group_id)
            group = existing or ShareGroup(group_id)
            if group.members:
                answer.value = ErrorCode.NON_EMPTY_GROUP, {}
                return
            if group.deleting_group:
                answer.value = ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
                return
            epoch = max(group.group_epoch, min_state_epoch)
            if existing is None:
                # A new, empty group, whose (empty) target assignment is current at its epoch.
                yield [
                    group_epoch_record(group_id, epoch, group.metadata_hash),
                    target_metadata_record(group_id, epoch),
                ]
            keys = [(tid, p, offset) for tid, parts in sorted(offsets.items()) for p, offset in sorted(parts.items())]
            results = await asyncio.gather(
                *(self.persister.initialize_state(SharePartitionKey(group_id, tid, p), epoch, offset)
                  for tid, p, offset in keys),
                return_exceptions=True,
            )
            errors: dict[tuple[bytes, int], int] = {}
            done: dict[bytes, set[int]] = {}
            for (tid, p, _offset), result in zip(keys, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("share offsets alteration failed", group_id=group_id, partition=p, error=repr(result))
                    errors[(tid, p)] = ErrorCode.UNKNOWN_SERVER_ERROR
                else:
                    errors[(tid, p)] = int(result)
                    if result == ErrorCode.NONE:
                        done.setdefault(tid, set()).add(p)
            if done:
                group = self.groups[group_id]
                initializing = {tid: TopicInit(ti.name, set(ti.partitions), ti.timestamp)
                                for tid, ti in group.initializing.items()}
                initialized = {tid: TopicInit(ti.name, set(ti.partitions)) for tid, ti in group.initialized.items()}
                for tid, parts in done.items():
                    meta = self.topics.topic_by_id(tid)
                    name = meta[0] if meta is not None else group.deleting.get(tid, "")
                    if tid in initializing:
                        initializing[tid].partitions -= parts
                        if not initializing[tid].partitions:
                            del initializing[tid]
                    initialized.setdefault(tid, TopicInit(name, set())).partitions |= parts
                deleting = {tid: n for tid, n in group.deleting.items() if tid not in done}
                yield [state_partition_metadata_record(group_id, initializing, initialized, deleting)]
            log.info("share group offsets altered", group_id=group_id, state_epoch=epoch,
                     partitions=sum(len(ps) for ps in done.values()))
            answer.value = ErrorCode.NONE, errors
            return

        return await self._write_async_steps(group_id, operation, (ErrorCode.UNKNOWN_SERVER_ERROR, {}))

    async def delete_offsets(self, group_id: str, topic_ids: Iterable[bytes]) -> tuple[int, dict[bytes, int]]:
        """DeleteShareGroupOffsets: forget the topics' share state so the next consumption starts from
        `share.auto.offset.reset`. Two-phase like Kafka: the topics move to "deleting" first, their
        persisted state is deleted, then they leave "deleting"; a failure leaves a trace that
        `retry_pending` completes."""
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, {}

        async def operation(answer: Answer[tuple[int, dict[bytes, int]]]) -> AsyncSteps:
            group = self.groups.get(group_id)
            if group is None:
                answer.value = ErrorCode.GROUP_ID_NOT_FOUND, {}
                return
            if group.members:
                answer.value = ErrorCode.NON_EMPTY_GROUP, {}
                return
            if group.deleting_group:
                answer.value = ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
                return
            # As Kafka: an initialised topic has its initialised partitions deleted, a topic still being
            # deleted is deleted again (every partition), and any other topic has no state to delete.
            targets: dict[bytes, set[int]] = {}
            names: dict[bytes, str] = {}
            errors: dict[bytes, int] = {}
            for tid in topic_ids:
                meta = self.topics.topic_by_id(tid)
                if tid in group.initialized:
                    targets[tid] = set(group.initialized[tid].partitions)
                    names[tid] = group.initialized[tid].name
                elif tid in group.deleting:
                    targets[tid] = set(range(meta[1])) if meta is not None else set()
                    names[tid] = group.deleting[tid]
                else:
                    errors[tid] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if not targets:
                answer.value = ErrorCode.NONE, errors
                return
            initialized = {t: ti for t, ti in group.initialized.items() if t not in targets}
            deleting = dict(group.deleting) | names
            yield [state_partition_metadata_record(group_id, group.initializing, initialized, deleting)]
            for tid, parts in sorted(targets.items()):
                errors[tid] = await self._delete_state(group_id, {tid: parts}) if parts else ErrorCode.NONE
            finished = {tid for tid in targets if errors[tid] == ErrorCode.NONE}
            pending = self._pending_state_deletes.setdefault(group_id, {})
            for tid in set(targets) - finished:
                pending.setdefault(tid, set()).update(targets[tid])
            if not pending:
                self._pending_state_deletes.pop(group_id, None)
            if finished:
                group = self.groups[group_id]
                remaining = {tid: n for tid, n in group.deleting.items() if tid not in finished}
                yield [state_partition_metadata_record(group_id, group.initializing, group.initialized, remaining)]
            log.info("share group offsets deleted", group_id=group_id, topics=len(finished))
            answer.value = ErrorCode.NONE, errors
            return

        return await self._write_async_steps(group_id, operation, (ErrorCode.UNKNOWN_SERVER_ERROR, {}))
