"""Classic groups in the group coordinator: JoinGroup/SyncGroup/Heartbeat/LeaveGroup, the checks a
classic group makes on offset commits, and the timers that drive rebalances (join and sync deadlines,
the initial rebalance delay, sessions).

It follows Kafka's GroupMetadataManager for classic groups. Every operation on a group, a request's
or a timer's (the runtime's keyed timers), runs through the group coordinator's runtime holding the
group's key: one at a time per group, and to completion even if its caller goes away. Persisted changes
(see `classic_group`) are yielded by the operation (a `write_steps` generator); the runtime appends them to
the group's `__consumer_offsets` partition, waits for the fsync and replays them into the partition's shard
before the operation goes on, so it never appends itself. JoinGroup and SyncGroup answers that must wait for
other members are futures completed when the phase ends, awaited after the operation has released the
group. A JoinGroup for the id of a KIP-848 group without members converts it, as Kafka does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from shoal.protocol import messages
from shoal.protocol.coordinator_records import fits_key_string
from shoal.protocol.errors import ErrorCode

from .classic_group import ClassicGroup, ClassicGroupState, ClassicMember
from .consumer_group import ConsumerGroup
from .group_coordinator_shard import Group, GroupRuntime, GroupsOfOneType
from .placement import Placement
from .record_log import CoordinatorRecordLog
from .runtime import Steps

log = structlog.get_logger("shoal.classic_groups")

JoinResponse = messages.JoinGroupResponse
_JoinMember = JoinResponse.JoinGroupResponseMember
SyncResponse = messages.SyncGroupResponse
SyncRequest = messages.SyncGroupRequest
# A classic-group answer a member may wait for: JoinGroup's or SyncGroup's.
_Answer = TypeVar("_Answer", JoinResponse, SyncResponse)

Empty, Preparing, Completing, Stable, Dead = (
    ClassicGroupState.EMPTY, ClassicGroupState.PREPARING_REBALANCE, ClassicGroupState.COMPLETING_REBALANCE,
    ClassicGroupState.STABLE, ClassicGroupState.DEAD,
)
# How long a new member may wait for its first join to complete without heartbeating (Kafka's value).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
NO_OFFSET = -1



@dataclass(slots=True)
class ClassicGroupConfig:
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1


@dataclass(slots=True)
class JoinRequest:
    """A JoinGroup request in version-independent form."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    client_id: str
    client_host: str
    version: int


@dataclass(slots=True)
class OffsetToCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


def valid_group_id(group_id: str) -> bool:
    """Not empty, and short enough to be a key of `__consumer_offsets`."""
    return bool(group_id) and fits_key_string(group_id)


def _join_error(code: int, member_id: str = "") -> JoinResponse:
    return JoinResponse(error_code=code, generation_id=-1, member_id=member_id, leader="", protocol_name=None,
                        members=[])


def _resolve(fut: asyncio.Future[_Answer], value: _Answer) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail_waiter(
    waiters: dict[tuple[str, str], asyncio.Future[_Answer]], error: Callable[[int, str], _Answer],
    group_id: str, member_id: str, code: int,
) -> None:
    waiter = waiters.pop((group_id, member_id), None)
    if waiter is not None:
        _resolve(waiter, error(code, member_id))


class ClassicGroupCoordinator(GroupsOfOneType[ClassicGroup]):
    def __init__(
        self,
        record_log: CoordinatorRecordLog | GroupRuntime,
        config: ClassicGroupConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        placement: Placement[str] | None = None,
    ):
        super().__init__(record_log, ClassicGroup, placement)
        self.config = config or ClassicGroupConfig()
        self.clock = clock
        self.wall_ms = wall_ms
        self.loaded = False
        self.rebalances = 0
        self._join_waiters: dict[tuple[str, str], asyncio.Future[JoinResponse]] = {}
        self._sync_waiters: dict[tuple[str, str], asyncio.Future[SyncResponse]] = {}
        self._pending_deadlines: dict[tuple[str, str], float] = {}

    # ---- plumbing --------------------------------------------------------------------------------

    def _held(self, group_id: str) -> dict[str, Group]:
        """The groups of `group_id`'s shard, for creating or forgetting a group not yet (or no longer) in
        the log; call it from an operation holding `group_id`."""
        return self.shard_of(group_id).groups

    def _has_offsets(self, group_id: str) -> bool:
        return self.shard_of(group_id).offsets.has_offsets(group_id)

    def _schedule(self, key: tuple[str, ...], delay_s: float, work: Callable[[], Steps[None]]) -> None:
        """Run `work` after `delay_s` as an operation on the group `key[1]` names (a runtime timer)."""
        self.runtime.schedule_steps(self.partition_for(key[1]), ("classic", *key), delay_s, key[1], work)

    def _cancel(self, key: tuple[str, ...]) -> None:
        self.runtime.cancel(self.partition_for(key[1]), ("classic", *key))

    def _is_scheduled(self, key: tuple[str, ...]) -> bool:
        return self.runtime.is_scheduled(self.partition_for(key[1]), ("classic", *key))

    def _forget_if_unused(self, group: ClassicGroup) -> None:
        """A group that never got past creation (no members, offsets or generation) is not kept."""
        if (group.state == Empty and not group.members and not group.pending_members
                and not self._has_offsets(group.group_id) and group.generation_id == 0
                and self.groups.get(group.group_id) is group):
            del self._held(group.group_id)[group.group_id]

    # ---- lifecycle -------------------------------------------------------------------------------

    async def load(self) -> None:
        """Rebuild every classic group from `__consumer_offsets` (partitions the group coordinator loaded
        already are not read again)."""
        await self._load_shards()
        self.loaded = True
        log.info("classic groups loaded", groups=len(self.groups))

    def start(self) -> None:
        """Members restored from the log get a full session to come back (needs a running loop)."""
        for group in self.groups.values():
            for member in group.members.values():
                self._arm_heartbeat(group, member)

    def unload(self) -> None:
        """Shutdown: no more timers, and requests waiting for a rebalance are told NOT_COORDINATOR (as Kafka
        answers when it unloads a group), so the broker does not wait for phases that will not end."""
        self.runtime.cancel_all_timers()
        for (_group_id, member_id), waiter in list(self._join_waiters.items()):
            _resolve(waiter, _join_error(ErrorCode.NOT_COORDINATOR, member_id))
        for sync_waiter in self._sync_waiters.values():
            _resolve(sync_waiter, _sync_error(ErrorCode.NOT_COORDINATOR))
        self._join_waiters.clear()
        self._sync_waiters.clear()

    async def stop(self) -> None:
        self.unload()
        await self.runtime.drain()  # operations already started finish (and replay what they appended)
        self.unload()  # and any timer or waiter they left behind goes too

    # ---- heartbeats and sessions -------------------------------------------------------------------

    def _arm_heartbeat(self, group: ClassicGroup, member: ClassicMember, timeout_ms: int | None = None) -> None:
        """Move the member's session deadline; the timer re-arms itself lazily unless it must fire sooner."""
        timeout = (member.session_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        deadline = self.clock() + timeout
        sooner = deadline < member.heartbeat_deadline
        member.heartbeat_deadline = deadline
        group_id, member_id = group.group_id, member.member_id
        key = ("hb", group_id, member_id)
        if sooner or not self._is_scheduled(key):
            self._schedule(key, timeout, lambda: self._on_heartbeat_deadline(group_id, member_id))

    def _on_heartbeat_deadline(self, group_id: str, member_id: str) -> Steps[None]:
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return
        remaining = member.heartbeat_deadline - self.clock()
        satisfied = not member.is_new and (member.awaiting_join or member.awaiting_sync)
        if remaining > 0 or satisfied:
            delay = remaining if remaining > 0 else member.session_timeout_ms / 1000
            self._schedule(("hb", group_id, member_id), delay,
                           lambda: self._on_heartbeat_deadline(group_id, member_id))
            return
        log.info("classic group member session expired", group_id=group_id, member_id=member_id)
        yield from self._remove_members(group, [member_id], "session expired")

    def _on_pending_deadline(self, group_id: str, member_id: str) -> Steps[None]:
        self._pending_deadlines.pop((group_id, member_id), None)
        group = self.groups.get(group_id)
        if group is None or member_id not in group.pending_members:
            return
        group.pending_members.discard(member_id)
        if group.state == Preparing:
            yield from self._maybe_complete_join(group)
        self._forget_if_unused(group)

    # ---- JoinGroup ---------------------------------------------------------------------------------

    async def join_group(self, req: JoinRequest) -> JoinResponse:
        if not valid_group_id(req.group_id):
            return _join_error(ErrorCode.INVALID_GROUP_ID, req.member_id)
        # Everything the group's metadata record will carry must fit its string fields.
        if not all(fits_key_string(text) for text in (
            f"{req.group_instance_id or req.client_id}-{uuid.UUID(int=0)}", req.member_id, req.client_host,
            req.protocol_type, *(name for name, _ in req.protocols),
        )):
            return _join_error(ErrorCode.INVALID_REQUEST, req.member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return _join_error(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id)
        if not self.loaded:
            return _join_error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, req.member_id)
        waiter: asyncio.Future[JoinResponse] = asyncio.get_running_loop().create_future()
        def operation() -> Steps[None]:
            try:
                yield from self._join(req, waiter)
            except Exception:
                log.exception("join group failed", group_id=req.group_id)
                _resolve(waiter, _join_error(ErrorCode.UNKNOWN_SERVER_ERROR, req.member_id))

        await self._write_steps(req.group_id, operation)
        # Shielded: a client that disconnects does not cancel what other members wait for.
        return await asyncio.shield(waiter)

    def _join(self, req: JoinRequest, waiter: asyncio.Future[JoinResponse]) -> Steps[None]:
        group = self.groups.get(req.group_id)
        if group is None:
            other = self.groups.any_type(req.group_id)
            if other is not None and not _convertible(other):
                _resolve(waiter, _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
                return
            if req.member_id:
                _resolve(waiter, _join_error(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id))
                return
            if isinstance(other, ConsumerGroup):
                # A KIP-848 group without members gives way to this classic group; its offsets stay
                # (Kafka's maybeDeleteEmptyConsumerGroup).
                yield other.delete_records()
                log.info("empty consumer group converted to a classic group", group_id=req.group_id)
            group = self._held(req.group_id)[req.group_id] = ClassicGroup(req.group_id)
        if not self._accepts_joining_member(group, req.member_id):
            _resolve(waiter, _join_error(ErrorCode.GROUP_MAX_SIZE_REACHED, req.member_id))
        elif not req.member_id:
            yield from self._join_new_member(group, req, waiter)
        else:
            yield from self._join_existing_member(group, req, waiter)
        self._forget_if_unused(group)

    def _accepts_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self.config.max_size
        member = group.members.get(member_id)
        if group.state in (Empty, Dead):
            return True
        if group.state == Preparing:
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < max_size
        return member is not None or len(group.members) < max_size

    def _join_new_member(self, group: ClassicGroup, req: JoinRequest, waiter: asyncio.Future[JoinResponse]) -> Steps[None]:
        if group.state == Dead:
            _resolve(waiter, _join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(req.protocol_type, req.protocols):
            _resolve(waiter, _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        new_id = f"{req.group_instance_id or req.client_id}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            yield from self._join_new_static_member(group, req, new_id, waiter)
        elif req.version >= 4:
            # KIP-394: the member learns its id first and joins with it, so a lost response leaves no ghost.
            group.pending_members.add(new_id)
            self._pending_deadlines[(group.group_id, new_id)] = self.clock() + req.session_timeout_ms / 1000
            self._schedule(("pending", group.group_id, new_id), req.session_timeout_ms / 1000,
                           lambda: self._on_pending_deadline(group.group_id, new_id))
            _resolve(waiter, _join_error(ErrorCode.MEMBER_ID_REQUIRED, new_id))
        else:
            yield from self._add_member_and_rebalance(group, req, new_id, waiter)

    def _join_new_static_member(
        self, group: ClassicGroup, req: JoinRequest, new_id: str, waiter: asyncio.Future[JoinResponse]
    ) -> Steps[None]:
        assert req.group_instance_id is not None
        old_id = group.static_members.get(req.group_instance_id)
        if old_id is None:
            yield from self._add_member_and_rebalance(group, req, new_id, waiter)
            return
        # A known static member restarted: it takes over its old member id's place.
        old_leader = group.leader_id
        self._fence_waiters(group.group_id, old_id)
        self._cancel(("hb", group.group_id, old_id))
        member = group.replace_static_member(req.group_instance_id, old_id, new_id)
        old_state = (list(member.protocols), member.rebalance_timeout_ms, member.session_timeout_ms)
        member.protocols = req.protocols
        member.rebalance_timeout_ms, member.session_timeout_ms = req.rebalance_timeout_ms, req.session_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        self._arm_heartbeat(group, member)
        if group.state == Stable:
            if group.select_protocol() != group.protocol_name:
                member.awaiting_join = True
                self._join_waiters[(group.group_id, new_id)] = waiter
                yield from self._maybe_prepare_rebalance_or_complete_join(group, "static member changed protocols")
                return
            try:
                yield [group.metadata_record(None, self.wall_ms())]
            except Exception:
                log.exception("persisting a replaced static member failed", group_id=group.group_id)
                member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms = old_state
                self._cancel(("hb", group.group_id, new_id))
                restored = group.replace_static_member(req.group_instance_id, new_id, old_id)
                self._arm_heartbeat(group, restored)
                _resolve(waiter, _join_error(ErrorCode.UNKNOWN_SERVER_ERROR))
                return
            live = group.members[new_id]
            live.protocols = req.protocols  # replay keeps only the selected protocol's metadata
            is_leader = group.is_leader(new_id)
            skip = req.version >= 9 and is_leader
            log.info("static member rejoined without a rebalance", group_id=group.group_id,
                     instance_id=req.group_instance_id, member_id=new_id)
            _resolve(waiter, JoinResponse(
                error_code=ErrorCode.NONE, generation_id=group.generation_id, protocol_type=group.protocol_type,
                protocol_name=group.protocol_name, leader=(group.leader_id if skip else old_leader) or "",
                skip_assignment=skip, member_id=new_id, members=self._leader_view(group) if skip else [],
            ))
            return
        member.awaiting_join = True
        self._join_waiters[(group.group_id, new_id)] = waiter
        if group.state == Completing:
            # The leader may already have been given the old member id: assign again.
            yield from self._prepare_rebalance(group, "static member replaced during CompletingRebalance")
        else:
            yield from self._maybe_complete_join(group)

    def _join_existing_member(self, group: ClassicGroup, req: JoinRequest, waiter: asyncio.Future[JoinResponse]) -> Steps[None]:
        if group.state == Dead:
            _resolve(waiter, _join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id))
            return
        if not group.supports_protocols(req.protocol_type, req.protocols):
            _resolve(waiter, _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
            return
        if req.member_id in group.pending_members:
            self._cancel(("pending", group.group_id, req.member_id))
            self._pending_deadlines.pop((group.group_id, req.member_id), None)
            yield from self._add_member_and_rebalance(group, req, req.member_id, waiter)
            return
        error = self._validate_member(group, req.member_id, req.group_instance_id)
        if error != ErrorCode.NONE:
            _resolve(waiter, _join_error(error, req.member_id))
            return
        member = group.members[req.member_id]
        if group.state == Preparing:
            yield from self._update_member_and_rebalance(group, member, req, waiter, "member rejoined")
        elif group.state == Completing:
            if member.matches(req.protocols):
                # Its JoinGroup response was lost: answer again with the current generation.
                _resolve(waiter, self._join_response(group, member.member_id))
            else:
                yield from self._update_member_and_rebalance(group, member, req, waiter, "member changed protocols")
        elif group.state == Stable:
            if group.is_leader(member.member_id) or not member.matches(req.protocols):
                yield from self._update_member_and_rebalance(group, member, req, waiter, "leader or changed member rejoined")
            else:
                self._arm_heartbeat(group, member)
                _resolve(waiter, self._join_response(group, member.member_id, with_members=False))
        else:
            _resolve(waiter, _join_error(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id))

    @staticmethod
    def _validate_member(group: ClassicGroup, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
            return ErrorCode.NONE
        return ErrorCode.NONE if member_id in group.members else ErrorCode.UNKNOWN_MEMBER_ID

    def _add_member_and_rebalance(
        self, group: ClassicGroup, req: JoinRequest, member_id: str, waiter: asyncio.Future[JoinResponse]
    ) -> Steps[None]:
        member = ClassicMember(
            member_id=member_id, group_instance_id=req.group_instance_id, client_id=req.client_id,
            client_host=req.client_host, rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms, protocol_type=req.protocol_type, protocols=req.protocols,
            awaiting_join=True, is_new=True,
        )
        group.add_member(member)
        self._join_waiters[(group.group_id, member_id)] = waiter
        self._arm_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        yield from self._maybe_prepare_rebalance_or_complete_join(group, f"member {member_id} joined")

    def _update_member_and_rebalance(
        self, group: ClassicGroup, member: ClassicMember, req: JoinRequest, waiter: asyncio.Future[JoinResponse], reason: str
    ) -> Steps[None]:
        member.protocols = req.protocols
        member.rebalance_timeout_ms, member.session_timeout_ms = req.rebalance_timeout_ms, req.session_timeout_ms
        previous = self._join_waiters.pop((group.group_id, member.member_id), None)
        if previous is not None:
            _resolve(previous, _join_error(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.awaiting_join = True
        self._join_waiters[(group.group_id, member.member_id)] = waiter
        self._arm_heartbeat(group, member)
        yield from self._maybe_prepare_rebalance_or_complete_join(group, reason)

    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, reason: str) -> Steps[None]:
        if group.state in (Stable, Completing, Empty):
            yield from self._prepare_rebalance(group, reason)
        elif group.state == Preparing:
            yield from self._maybe_complete_join(group)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> Steps[None]:
        gid = group.group_id
        if group.state == Completing:
            for m in group.members.values():
                m.assignment = b""
            self._fail_sync_waiters(group, ErrorCode.REBALANCE_IN_PROGRESS)
            self._cancel(("sync", gid))
        initial = group.state == Empty
        group.state = Preparing
        group.state_timestamp_ms = self.wall_ms()
        self.rebalances += 1
        log.info("preparing to rebalance classic group", group_id=gid, generation=group.generation_id, reason=reason)
        delay_ms = self.config.initial_rebalance_delay_ms
        if initial and delay_ms > 0:
            timeout = group.rebalance_timeout_ms
            first = min(delay_ms, timeout)
            group.initial_delay_running, group.new_member_added = True, False
            group.initial_delay_remaining_ms = max(timeout - first, 0)
            self._schedule(("join", gid), first / 1000, lambda: self._on_initial_delay(gid))
            return
        generation = group.generation_id
        self._schedule(("join", gid), group.rebalance_timeout_ms / 1000, lambda: self._on_join_deadline(gid, generation))
        yield from self._maybe_complete_join(group)

    def _on_initial_delay(self, group_id: str) -> Steps[None]:
        group = self.groups.get(group_id)
        if group is None or group.state != Preparing or not group.initial_delay_running:
            return
        if group.new_member_added and group.initial_delay_remaining_ms > 0:
            # Members keep arriving: wait another delay, within the rebalance timeout.
            delay = min(self.config.initial_rebalance_delay_ms, group.initial_delay_remaining_ms)
            group.initial_delay_remaining_ms -= delay
            group.new_member_added = False
            self._schedule(("join", group_id), delay / 1000, lambda: self._on_initial_delay(group_id))
            return
        group.initial_delay_running = False
        yield from self._complete_join(group)

    def _on_join_deadline(self, group_id: str, generation: int) -> Steps[None]:
        group = self.groups.get(group_id)
        if group is not None and group.state == Preparing and group.generation_id == generation:
            yield from self._complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> Steps[None]:
        if group.state == Preparing and not group.initial_delay_running and group.has_all_members_joined():
            yield from self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> Steps[None]:
        gid = group.group_id
        self._cancel(("join", gid))
        group.initial_delay_running = False
        for member in list(group.members.values()):
            if not member.awaiting_join:
                log.info("classic group member did not rejoin in time", group_id=gid, member_id=member.member_id)
                group.remove_member(member.member_id)
                self._cancel(("hb", gid, member.member_id))
        now_ms = self.wall_ms()
        group.init_next_generation(now_ms)
        if group.state == Empty:
            try:
                yield [group.metadata_record(None, now_ms, empty=True)]
            except Exception:
                log.exception("persisting an empty classic group failed", group_id=gid)
            log.info("classic group is empty", group_id=gid, generation=group.generation_id)
            return
        log.info("classic group join phase complete", group_id=gid, generation=group.generation_id,
                 protocol=group.protocol_name, members=len(group.members))
        for member in group.members.values():
            member.awaiting_join = False
            member.is_new = False
            waiter = self._join_waiters.pop((gid, member.member_id), None)
            if waiter is not None:
                _resolve(waiter, self._join_response(group, member.member_id))
            self._arm_heartbeat(group, member)
        generation = group.generation_id
        self._schedule(("sync", gid), group.rebalance_timeout_ms / 1000, lambda: self._on_sync_deadline(gid, generation))

    def _leader_view(self, group: ClassicGroup) -> list[_JoinMember]:
        return [_JoinMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                            metadata=m.metadata(group.protocol_name)) for m in group.members.values()]

    def _join_response(self, group: ClassicGroup, member_id: str, *, with_members: bool = True) -> JoinResponse:
        leader = group.is_leader(member_id) and with_members
        return JoinResponse(
            error_code=ErrorCode.NONE, generation_id=group.generation_id, protocol_type=group.protocol_type,
            protocol_name=group.protocol_name, leader=group.leader_id or "", skip_assignment=False,
            member_id=member_id, members=self._leader_view(group) if leader else [],
        )

    def _on_sync_deadline(self, group_id: str, generation: int) -> Steps[None]:
        group = self.groups.get(group_id)
        if group is None or group.state != Completing or group.generation_id != generation:
            return
        missing = sorted(group.pending_sync)
        log.info("classic group members did not sync in time", group_id=group_id, members=missing)
        for member_id in missing:
            group.remove_member(member_id)
            self._cancel(("hb", group_id, member_id))
        yield from self._prepare_rebalance(group, "members did not sync in time")

    def _fence_waiters(self, group_id: str, member_id: str) -> None:
        _fail_waiter(self._join_waiters, _join_error, group_id, member_id, ErrorCode.FENCED_INSTANCE_ID)
        _fail_waiter(self._sync_waiters, _sync_error, group_id, member_id, ErrorCode.FENCED_INSTANCE_ID)

    def _fail_sync_waiters(self, group: ClassicGroup, code: int) -> None:
        for member_id in list(group.members):
            waiter = self._sync_waiters.pop((group.group_id, member_id), None)
            if waiter is not None:
                _resolve(waiter, _sync_error(code))

    def _remove_members(self, group: ClassicGroup, member_ids: Iterable[str], reason: str) -> Steps[None]:
        removed = False
        for member_id in member_ids:
            member = group.remove_member(member_id)
            self._cancel(("hb", group.group_id, member_id))
            if member is None:
                continue
            removed = True
            _fail_waiter(self._join_waiters, _join_error, group.group_id, member_id, ErrorCode.UNKNOWN_MEMBER_ID)
            _fail_waiter(self._sync_waiters, _sync_error, group.group_id, member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        if not removed:
            return
        if group.state in (Stable, Completing):
            yield from self._prepare_rebalance(group, reason)
        elif group.state == Preparing:
            yield from self._maybe_complete_join(group)

    # ---- SyncGroup ---------------------------------------------------------------------------------

    async def sync_group(self, req: SyncRequest, version: int) -> SyncResponse:
        if not valid_group_id(req.group_id):
            return _sync_error(ErrorCode.INVALID_GROUP_ID)
        if not self.loaded:
            return _sync_error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        waiter: asyncio.Future[SyncResponse] = asyncio.get_running_loop().create_future()
        def operation() -> Steps[None]:
            try:
                yield from self._sync(req, version, waiter)
            except Exception:
                log.exception("sync group failed", group_id=req.group_id)
                _resolve(waiter, _sync_error(ErrorCode.UNKNOWN_SERVER_ERROR))

        await self._write_steps(req.group_id, operation)
        return await asyncio.shield(waiter)

    def _sync(self, req: SyncRequest, version: int, waiter: asyncio.Future[SyncResponse]) -> Steps[None]:
        group = self.groups.get(req.group_id)
        if group is None:
            _resolve(waiter, _sync_error(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        error = self._validate_sync(group, req, version)
        if error != ErrorCode.NONE:
            _resolve(waiter, _sync_error(error))
            return
        member = group.members[req.member_id]
        if group.state == Preparing:
            _resolve(waiter, _sync_error(ErrorCode.REBALANCE_IN_PROGRESS))
        elif group.state == Stable:
            self._arm_heartbeat(group, member)
            _resolve(waiter, self._sync_response(group, member))
        elif group.state == Completing:
            key = (group.group_id, member.member_id)
            previous = self._sync_waiters.pop(key, None)
            if previous is not None:
                _resolve(previous, _sync_error(ErrorCode.REBALANCE_IN_PROGRESS))
            self._sync_waiters[key] = waiter
            member.awaiting_sync = True
            group.pending_sync.discard(member.member_id)
            self._arm_heartbeat(group, member)
            if group.is_leader(member.member_id):
                yield from self._store_assignment(group, req)
        else:
            _resolve(waiter, _sync_error(ErrorCode.UNKNOWN_MEMBER_ID))

    def _validate_sync(self, group: ClassicGroup, req: SyncRequest, version: int) -> int:
        if group.state == Dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        instance_id = req.group_instance_id if version >= 3 else None
        error = self._validate_member(group, req.member_id, instance_id)
        if error != ErrorCode.NONE:
            return error
        if req.generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if version >= 5 and (
            (req.protocol_type is not None and req.protocol_type != group.protocol_type)
            or (req.protocol_name is not None and req.protocol_name != group.protocol_name)
        ):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return ErrorCode.NONE

    def _store_assignment(self, group: ClassicGroup, req: SyncRequest) -> Steps[None]:
        given = {a.member_id: bytes(a.assignment) for a in req.assignments or () if a.member_id in group.members}
        assignments = {mid: given.get(mid, b"") for mid in group.members}
        try:
            yield [group.metadata_record(assignments, self.wall_ms())]
        except Exception:
            log.exception("persisting the group assignment failed", group_id=group.group_id)
            yield from self._prepare_rebalance(group, "the assignment could not be persisted")
            return
        self._cancel(("sync", group.group_id))
        log.info("classic group stable", group_id=group.group_id, generation=group.generation_id)
        for member in group.members.values():
            waiter = self._sync_waiters.pop((group.group_id, member.member_id), None)
            if waiter is not None:
                _resolve(waiter, self._sync_response(group, member))

    @staticmethod
    def _sync_response(group: ClassicGroup, member: ClassicMember) -> SyncResponse:
        return SyncResponse(error_code=ErrorCode.NONE, protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name, assignment=member.assignment)

    # ---- Heartbeat / LeaveGroup ----------------------------------------------------------------------

    async def heartbeat(self, group_id: str, member_id: str, generation_id: int, instance_id: str | None) -> int:
        if not valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == Dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(group, member_id, instance_id)
        if error != ErrorCode.NONE:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == Empty:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._arm_heartbeat(group, group.members[member_id])
        return ErrorCode.REBALANCE_IN_PROGRESS if group.state == Preparing else ErrorCode.NONE

    async def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """LeaveGroup for (member id, group instance id) pairs: the group error and one code per member."""
        if not valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID, []
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        if group_id not in self.groups:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        def operation() -> Steps[tuple[int, list[int]]]:
            group = self.groups.get(group_id)
            if group is None:
                return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
            if group.state == Dead:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
            codes: list[int] = []
            to_remove: list[str] = []
            pending_left = False
            for member_id, instance_id in leaving:
                if instance_id is not None:
                    known = group.static_members.get(instance_id)
                    if known is None:
                        codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    elif member_id and member_id != known:
                        codes.append(ErrorCode.FENCED_INSTANCE_ID)
                    else:
                        codes.append(ErrorCode.NONE)
                        to_remove.append(known)
                elif member_id in group.pending_members:
                    group.pending_members.discard(member_id)
                    self._cancel(("pending", group_id, member_id))
                    pending_left = True
                    codes.append(ErrorCode.NONE)
                elif member_id in group.members:
                    codes.append(ErrorCode.NONE)
                    to_remove.append(member_id)
                else:
                    codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
            if to_remove:
                log.info("classic group members left", group_id=group_id, members=to_remove)
                yield from self._remove_members(group, to_remove, "members left the group")
            elif pending_left and group.state == Preparing:
                yield from self._maybe_complete_join(group)
            self._forget_if_unused(group)
            return ErrorCode.NONE, codes

        return await self._write_steps(group_id, operation)

    # ---- offsets (the group coordinator's offset operations ask the group) ----------------------------

    @classmethod
    def validate_offset_commit(cls, group: ClassicGroup, member_id: str, instance_id: str | None,
                               generation_id: int, *, transactional: bool) -> int:
        """Kafka's ClassicGroup.validateOffsetCommit, for OffsetCommit and (KIP-447) TxnOffsetCommit."""
        if group.state == Dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state == Empty:
            return ErrorCode.NONE  # a consumer without group management, or an admin client
        if generation_id >= 0 or member_id or instance_id is not None:
            error = cls._validate_member(group, member_id, instance_id)
            if error != ErrorCode.NONE:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif not transactional and group.state != Empty:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not transactional and group.state == Completing:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def touch_member(self, group: ClassicGroup, member_id: str) -> None:
        """An offset commit from a member counts as its heartbeat."""
        member = group.members.get(member_id)
        if member is not None:
            self._arm_heartbeat(group, member)

    @staticmethod
    def subscribed_topics_for_offsets(group: ClassicGroup) -> set[str] | None:
        """Topics whose offsets OffsetDelete refuses: none while Empty; None (all) when the members'
        subscriptions cannot be read."""
        return set() if group.state == Empty else group.subscribed_topics()

    # ---- admin -------------------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every classic group."""
        return [(gid, g.protocol_type or "", g.state.value) for gid, g in sorted(self.groups.items())]


def _convertible(group: object) -> bool:
    """A KIP-848 group a JoinGroup may take over: it has no members."""
    return isinstance(group, ConsumerGroup) and not group.members


def _sync_error(code: int, _member_id: str = "") -> SyncResponse:
    return SyncResponse(error_code=code, assignment=b"")
