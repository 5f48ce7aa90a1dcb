"""KIP-848 consumer groups in the group coordinator: ConsumerGroupHeartbeat, ConsumerGroupDescribe,
session and revocation timeouts, and the checks a consumer group makes on offset commits and fetches.

Each heartbeat is handled under the group's lock as in Kafka's GroupMetadataManager: the member is
validated and updated, the group epoch is bumped when membership, subscriptions or the subscribed
topics changed, a new target assignment is computed by the server-side assignor when the group epoch
moved past the assignment epoch, and the member's current assignment is reconciled towards its
target (`consumer_group.reconcile`). Each operation runs through the coordinator runtime and only plans:
it yields its records, which the runtime appends to the group's `__consumer_offsets` partition, fsyncs and
replays into the partition's `GroupCoordinatorShard` before the operation finishes its answer.

A group id names one group of any type. As in Kafka, a member joining (epoch 0) a classic group without
members converts it: the classic group's record is tombstoned in the same write that creates the
consumer group, and the committed offsets, kept by id beside the groups, stay.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog

from shoal.protocol import messages
from shoal.protocol.coordinator_records import CoordinatorRecord, fits_key_string
from shoal.protocol.errors import ErrorCode

from .classic_group import ClassicGroup
from .consumer_assignors import ConsumerAssignor, UniformAssignor
from .consumer_group import (
    Assignment,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    Reconciled,
    RegexError,
    SubscribedTopic,
    compile_regex,
    reconcile,
)
from .group_coordinator_shard import GroupRuntime, GroupsOfOneType
from .placement import Placement
from .record_log import CoordinatorRecordLog
from .runtime import Steps

log = structlog.get_logger("shoal.consumer_groups")


HeartbeatRequest = messages.ConsumerGroupHeartbeatRequest
HeartbeatResponse = messages.ConsumerGroupHeartbeatResponse
_HbAssignment = HeartbeatResponse.Assignment
_HbTopicPartitions = HeartbeatResponse.TopicPartitions
DescribeResponse = messages.ConsumerGroupDescribeResponse
DescribedGroup = DescribeResponse.DescribedGroup
_DMember = DescribeResponse.Member
_DAssignment = DescribeResponse.Assignment
_DTopicPartitions = DescribeResponse.TopicPartitions

JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
# The member type ConsumerGroupDescribe v1 reports for members that heartbeat with KIP-848.
CONSUMER_MEMBER_TYPE = 1


@dataclass(slots=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    max_size: int = 2**31 - 1
    # A group's own consumer.session.timeout.ms / consumer.heartbeat.interval.ms (its dynamic group
    # config), or None to use the values above.
    group_override: Callable[[str, str], int | None] | None = None

    def session_timeout_for(self, group_id: str) -> int:
        own = self.group_override(group_id, "consumer.session.timeout.ms") if self.group_override else None
        return self.session_timeout_ms if own is None else own

    def heartbeat_interval_for(self, group_id: str) -> int:
        own = self.group_override(group_id, "consumer.heartbeat.interval.ms") if self.group_override else None
        return self.heartbeat_interval_ms if own is None else own


class ConsumerTopicSource(Protocol):
    """What the coordinator needs to know about topics (the broker's registry implements it)."""

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None: ...

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None: ...

    def topic_names(self) -> Iterable[str]:
        """Names of the user topics (internal ones are never matched by a regex)."""
        ...


class ConsumerGroupError(Exception):
    def __init__(self, code: int, message: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message


def _error(code: int, message: str | None = None) -> HeartbeatResponse:
    return HeartbeatResponse(error_code=code, error_message=message, member_epoch=-1, heartbeat_interval_ms=0)


def _hb_assignment(assignment: Assignment) -> _HbAssignment:
    return _HbAssignment(topic_partitions=[_HbTopicPartitions(topic_id=tid, partitions=sorted(ps))
                                           for tid, ps in sorted(assignment.items())])


def _owned(req: HeartbeatRequest) -> Assignment | None:
    if req.topic_partitions is None:
        return None
    return {bytes(t.topic_id): frozenset(t.partitions) for t in req.topic_partitions if t.partitions}


class ConsumerGroupCoordinator(GroupsOfOneType[ConsumerGroup]):
    def __init__(
        self,
        record_log: CoordinatorRecordLog | GroupRuntime,
        topics: ConsumerTopicSource,
        config: ConsumerGroupConfig | None = None,
        *,
        assignors: list[ConsumerAssignor] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        placement: Placement[str] | None = None,
    ):
        super().__init__(record_log, ConsumerGroup, placement)
        self.topics = topics
        self.config = config or ConsumerGroupConfig()
        self.assignors: list[ConsumerAssignor] = assignors or [UniformAssignor()]
        self.clock = clock
        self.wall_ms = wall_ms
        self.loaded = False

    # ---- plumbing --------------------------------------------------------------------------------

    @property
    def rebalances(self) -> int:
        return sum(shard.consumer_epoch_bumps for shard in self.runtime.shards)

    def assignor(self, name: str | None) -> ConsumerAssignor | None:
        if name is None:
            return self.assignors[0]
        return next((a for a in self.assignors if a.name == name), None)

    # ---- lifecycle -------------------------------------------------------------------------------

    async def load(self) -> None:
        """Rebuild every consumer group from `__consumer_offsets` (partitions the group coordinator loaded
        already are not read again)."""
        await self._load_shards()
        for shard in self.runtime.shards:
            shard.consumer_epoch_bumps = 0  # the rebalance count starts now
        deadline = self.clock() + self.config.session_timeout_ms / 1000
        for group in self.groups.values():
            for member in group.members.values():
                member.session_deadline = deadline
        self.loaded = True
        log.info("consumer groups loaded", groups=len(self.groups))

    def start(self) -> None:
        """Members restored from the log get a full session to come back (needs a running loop)."""
        for group in self.groups.values():
            for member in group.members.values():
                self._arm_timers(group.group_id, member)

    async def stop(self) -> None:
        await self.runtime.drain()  # operations already started finish

    # ---- timers: session and revocation timeouts (the runtime's keyed timers) ----------------------

    def _arm_timers(self, group_id: str, member: ConsumerMember) -> None:
        """(Re)start the member's session timer, and its revocation timer while it has partitions to give up."""
        partition, member_id = self.partition_for(group_id), member.member_id
        now = self.clock()
        self.runtime.schedule_steps(partition, ("consumer-session", group_id, member_id),
                                    member.session_deadline - now, group_id, lambda: self._on_timer(group_id, member_id))
        if member.revocation_deadline is not None:
            if not self.runtime.is_scheduled(partition, ("consumer-revocation", group_id, member_id)):
                self.runtime.schedule_steps(partition, ("consumer-revocation", group_id, member_id),
                                            member.revocation_deadline - now, group_id,
                                            lambda: self._on_timer(group_id, member_id))
        else:
            self.runtime.cancel(partition, ("consumer-revocation", group_id, member_id))

    def _cancel_timers(self, group_id: str, member_id: str) -> None:
        partition = self.partition_for(group_id)
        for kind in ("consumer-session", "consumer-revocation"):
            self.runtime.cancel(partition, (kind, group_id, member_id))

    def _on_timer(self, group_id: str, member_id: str) -> Steps[None]:
        """A timer fired (holding the group): the member goes if its session or revocation time is over."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return
        now = self.clock()
        if not _overdue(member, now):
            self._arm_timers(group_id, member)  # a deadline moved (or the clock is not the loop's): wait on
            return
        log.info("consumer group member expired", group_id=group_id, member_id=member_id,
                 reason="session" if member.session_deadline <= now else "revocation timeout")
        yield from self._remove_member(group, member_id)

    # ---- ConsumerGroupHeartbeat ------------------------------------------------------------------

    async def heartbeat(
        self, req: HeartbeatRequest, version: int, client_id: str, client_host: str
    ) -> HeartbeatResponse:
        invalid = self._validate(req, version)
        if invalid is not None:
            return _error(ErrorCode.INVALID_REQUEST, invalid)
        if not self.loaded:
            return _error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        def operation() -> Steps[HeartbeatResponse]:
            try:
                if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                    return (yield from self._leave(req.group_id, req.member_id, req.member_epoch))
                return (yield from self._heartbeat(req, version, client_id, client_host))
            except ConsumerGroupError as exc:
                return _error(exc.code, exc.message)
            except Exception:
                log.exception("consumer group heartbeat failed", group_id=req.group_id)
                return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator could not write")

        return await self._write_steps(req.group_id, operation)

    def _validate(self, req: HeartbeatRequest, version: int) -> str | None:
        if not req.group_id:
            return "GroupId can't be empty."
        if not fits_key_string(req.group_id) or not fits_key_string(req.member_id):
            return "GroupId and MemberId can't be longer than 32767 bytes."
        if version >= 1 and not req.member_id:
            return "MemberId can't be empty."
        if req.rack_id is not None and req.rack_id == "":
            return "RackId can't be empty."
        if req.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            return f"MemberEpoch is {req.member_epoch}, but must be greater than or equal to -2."
        regex = req.subscribed_topic_regex if version >= 1 else None
        if req.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if req.rebalance_timeout_ms == -1:
                return "RebalanceTimeoutMs must be provided in first request."
            if req.topic_partitions is None or req.topic_partitions:
                return "TopicPartitions must be empty when (re-)joining."
            if req.subscribed_topic_names is None and regex is None:
                return "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        elif req.member_epoch > 0 and not req.member_id:
            return "MemberId can't be empty."
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and req.instance_id is None:
            return "InstanceId can't be null when MemberEpoch is -2."
        return None

    def _heartbeat(
        self, req: HeartbeatRequest, version: int, client_id: str, client_host: str
    ) -> Steps[HeartbeatResponse]:
        regex = req.subscribed_topic_regex if version >= 1 else None
        if regex is not None:
            try:
                compile_regex(regex)
            except RegexError as exc:
                detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
                raise ConsumerGroupError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                         f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
                                         f"{detail}.") from None
        if req.server_assignor is not None and self.assignor(req.server_assignor) is None:
            raise ConsumerGroupError(ErrorCode.UNSUPPORTED_ASSIGNOR,
                                     f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                                     + ", ".join(a.name for a in self.assignors) + ".")
        group_id = req.group_id
        group = self.groups.get(group_id)
        records: list[CoordinatorRecord] = []
        if group is None:
            other = self.groups.any_type(group_id)
            if other is not None and not _convertible(other):
                raise ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
            if req.member_epoch != JOIN_GROUP_MEMBER_EPOCH:
                raise ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
            if isinstance(other, ClassicGroup):
                # An empty classic group becomes this consumer group; its offsets stay (Kafka's
                # maybeDeleteEmptyClassicGroup).
                records += other.tombstone_records()
                log.info("empty classic group converted to a consumer group", group_id=group_id)
            group = ConsumerGroup(group_id)
        member_id = req.member_id or str(uuid.uuid4())
        old = group.members.get(member_id)
        bump = False
        # A static member (group.instance.id) that left with epoch -2 is replaced by its successor, which
        # takes over its assignment without a rebalance.
        replaced = self._static_predecessor(group, req, member_id)
        if replaced is not None:
            records += group.member_tombstones(replaced.member_id)
            # The successor starts as a new member that inherits only the assignment (Kafka's static
            # member replacement); its own request says the rest.
            member = _copy(replaced)
            member.member_id = member_id
            member.member_epoch, member.session_deadline, member.revocation_deadline = 0, 0.0, None
            member.rack_id, member.rebalance_timeout_ms, member.server_assignor = None, -1, None
            member.subscribed_topic_names, member.subscribed_topic_regex = (), None
            records.append(group.target_member_record(member_id, group.target.get(replaced.member_id, {})))
            old = replaced
        elif req.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if old is None and len(group.members) >= self.config.max_size:
                raise ConsumerGroupError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                         f"The consumer group has reached its maximum capacity of "
                                         f"{self.config.max_size} members.")
            member = ConsumerMember(member_id) if old is None else _copy(old)
            if old is not None:  # a member rejoining with epoch 0 starts over with nothing
                member.member_epoch, member.previous_member_epoch = 0, -1
                member.assigned, member.pending_revocation, member.state = {}, {}, MemberState.STABLE
            bump = old is None
        else:
            if old is None:
                raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                         f"Member {member_id} is not a member of group {group_id}.")
            self._check_epoch(old, req.member_epoch, _owned(req))
            member = _copy(old)
        # The member's metadata: a change of subscription bumps the group epoch.
        apply_heartbeat_fields(member, req, version)
        member.client_id, member.client_host = client_id, client_host
        if old is None or replaced is not None or _metadata(old) != _metadata(member):
            records.append(group.member_record(member))
            bump = bump or old is None or _subscription(old) != _subscription(member)
        # The subscribed topics as they are now: new topics (a regex match) or partitions bump the epoch too.
        members_after = {mid: m for mid, m in group.members.items() if replaced is None or mid != replaced.member_id}
        members_after[member_id] = member
        topics = self._subscribed_topics(members_after.values())
        if topics != group.subscribed_topics:
            records.append(group.partition_metadata_record(topics))
            bump = True
        group_epoch = group.group_epoch
        if bump:
            group_epoch += 1
            records.append(group.group_epoch_record(group_epoch))
        # A new target assignment when the group epoch moved past the assignment epoch.
        target = dict(group.target)
        if replaced is not None:
            target[member_id] = target.pop(replaced.member_id, {})
        assignment_epoch = group.assignment_epoch
        if group_epoch > assignment_epoch:
            new_target = self._compute_target(members_after, topics, target, member_id)
            for mid in sorted(members_after):
                if new_target.get(mid, {}) != target.get(mid) or mid not in target:
                    records.append(group.target_member_record(mid, new_target.get(mid, {})))
            records.append(group.target_epoch_record(group_epoch))
            target, assignment_epoch = new_target, group_epoch
        # Reconcile the member towards its target.
        owned = _owned(req)
        result = reconcile(member, target.get(member_id, {}), assignment_epoch, owned,
                           group.held_by_others(member_id, *(() if replaced is None else (replaced.member_id,))))
        changed = (result.state, result.member_epoch, result.previous_member_epoch, result.assigned,
                   result.pending_revocation) != (member.state, member.member_epoch, member.previous_member_epoch,
                                                  member.assigned, member.pending_revocation)
        if changed or old is None or replaced is not None or req.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            records.append(group.current_assignment_record(member_id, result))
        yield records
        live = self.groups[group_id].members[member_id]
        now = self.clock()
        session_timeout_ms = self.config.session_timeout_for(group_id)
        live.session_deadline = now + session_timeout_ms / 1000
        if live.state == MemberState.UNREVOKED_PARTITIONS:
            if live.revocation_deadline is None:
                timeout = live.rebalance_timeout_ms if live.rebalance_timeout_ms > 0 else session_timeout_ms
                live.revocation_deadline = now + timeout / 1000
        else:
            live.revocation_deadline = None
        if replaced is not None:
            self._cancel_timers(group_id, replaced.member_id)
        self._arm_timers(group_id, live)
        if replaced is not None:
            log.info("static member replaced", group_id=group_id, instance_id=req.instance_id,
                     old_member_id=replaced.member_id, member_id=member_id)
        if bump:
            log.info("consumer group epoch bumped", group_id=group_id, epoch=group_epoch, members=len(members_after))
        send_assignment = (req.member_epoch == JOIN_GROUP_MEMBER_EPOCH or owned is not None
                           or result.assigned != member.assigned or old is None)
        return HeartbeatResponse(
            error_code=ErrorCode.NONE, member_id=member_id, member_epoch=live.member_epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_for(group_id),
            assignment=_hb_assignment(live.assigned) if send_assignment else None,
        )

    @staticmethod
    def _static_predecessor(group: ConsumerGroup, req: HeartbeatRequest, member_id: str) -> ConsumerMember | None:
        """The member a static member's join replaces; Kafka's errors when the instance id is in use."""
        if req.instance_id is None:
            return None
        prior = group.static_member(req.instance_id)
        if prior is None or prior.member_id == member_id:
            if prior is None and req.member_epoch != JOIN_GROUP_MEMBER_EPOCH and member_id in group.members:
                raise ConsumerGroupError(ErrorCode.FENCED_INSTANCE_ID,
                                         f"Static member {member_id} with instance id {req.instance_id} is not "
                                         "the member the group knows for it.")
            return None
        if req.member_epoch != JOIN_GROUP_MEMBER_EPOCH:
            raise ConsumerGroupError(ErrorCode.FENCED_INSTANCE_ID,
                                     f"Static member {member_id} with instance id {req.instance_id} was replaced "
                                     f"by {prior.member_id}.")
        if prior.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise ConsumerGroupError(ErrorCode.UNRELEASED_INSTANCE_ID,
                                     f"Static member {member_id} with instance id {req.instance_id} cannot join "
                                     f"the group because the instance id is owned by member {prior.member_id}.")
        return prior

    @staticmethod
    def _check_epoch(member: ConsumerMember, received: int, owned: Assignment | None) -> None:
        """Kafka's fencing: a newer epoch than the member's is fenced; an older one only when it is the
        previous epoch (a lost response) and the member owns nothing it no longer has."""
        if received > member.member_epoch:
            raise ConsumerGroupError(ErrorCode.FENCED_MEMBER_EPOCH,
                                     f"The consumer group member has a greater member epoch ({received}) than the "
                                     f"one known by the group coordinator ({member.member_epoch}).")
        if received < member.member_epoch:
            ok = received == member.previous_member_epoch and owned is not None and all(
                ps <= member.assigned.get(tid, frozenset()) for tid, ps in owned.items())
            if not ok:
                raise ConsumerGroupError(ErrorCode.FENCED_MEMBER_EPOCH,
                                         f"The consumer group member has a smaller member epoch ({received}) than "
                                         f"the one known by the group coordinator ({member.member_epoch}).")

    def _subscribed_topics(self, members: Iterable[ConsumerMember]) -> dict[bytes, SubscribedTopic]:
        names: set[str] = set()
        regexes: set[str] = set()
        for m in members:
            names.update(m.subscribed_topic_names)
            if m.subscribed_topic_regex:
                regexes.add(m.subscribed_topic_regex)
        if regexes:
            compiled = [compile_regex(r) for r in sorted(regexes)]
            names.update(t for t in self.topics.topic_names() if any(c is not None and c.fullmatch(t) for c in compiled))
        out: dict[bytes, SubscribedTopic] = {}
        for name in sorted(names):
            meta = self.topics.topic_by_name(name)
            if meta is not None:
                out[meta[0]] = SubscribedTopic(name, meta[1])
        return out

    def _compute_target(self, members: dict[str, ConsumerMember], topics: dict[bytes, SubscribedTopic],
                        current: dict[str, Assignment], joining: str) -> dict[str, Assignment]:
        by_name = {t.name: tid for tid, t in topics.items()}
        subscriptions: dict[str, frozenset[bytes]] = {}
        for mid, m in members.items():
            compiled = compile_regex(m.subscribed_topic_regex)
            subscriptions[mid] = frozenset(tid for name, tid in by_name.items() if m.subscribes(name, compiled))
        # The assignor named by the most members wins, else the first configured (as in Kafka).
        votes: dict[str, int] = {}
        for m in members.values():
            if m.server_assignor is not None:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        name = max(sorted(votes), key=lambda n: votes[n]) if votes else None
        assignor = self.assignor(name) or self.assignors[0]
        partitions = {tid: t.num_partitions for tid, t in topics.items()}
        return assignor.assign(subscriptions, partitions, {mid: a for mid, a in current.items() if mid in members})

    def _leave(self, group_id: str, member_id: str, epoch: int) -> Steps[HeartbeatResponse]:
        group = self.groups.get(group_id)
        if group is None:
            raise ConsumerGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
        if member_id not in group.members:
            raise ConsumerGroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"Member {member_id} is not a member of group {group_id}.")
        member = group.members[member_id]
        if epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and member.instance_id is not None:
            # A static member leaving temporarily keeps its partitions until its session ends or its
            # successor (same instance id) joins.
            yield [group.current_assignment_record(member_id, Reconciled(
                member.state, LEAVE_GROUP_STATIC_MEMBER_EPOCH, member.member_epoch, member.assigned,
                member.pending_revocation))]
            log.info("static member left consumer group temporarily", group_id=group_id, member_id=member_id)
            return HeartbeatResponse(error_code=ErrorCode.NONE, member_id=member_id, member_epoch=epoch,
                                     heartbeat_interval_ms=0)
        yield from self._remove_member(group, member_id)
        log.info("member left consumer group", group_id=group_id, member_id=member_id)
        return HeartbeatResponse(error_code=ErrorCode.NONE, member_id=member_id, member_epoch=epoch,
                                 heartbeat_interval_ms=0)

    def _remove_member(self, group: ConsumerGroup, member_id: str) -> Steps[None]:
        """The member's records go and the group epoch is bumped, so the others get its partitions."""
        self._cancel_timers(group.group_id, member_id)
        records = group.member_tombstones(member_id)
        remaining = [m for mid, m in group.members.items() if mid != member_id]
        topics = self._subscribed_topics(remaining)
        if topics != group.subscribed_topics:
            records.append(group.partition_metadata_record(topics))
        records.append(group.group_epoch_record(group.group_epoch + 1))
        yield records

    async def expire_members(self, now: float | None = None) -> list[tuple[str, str]]:
        """Remove every member whose session ended or whose revocation took longer than its rebalance
        timeout, at once (the timers do this member by member; this sweep is for a clock of one's own)."""
        now = self.clock() if now is None else now
        expired: list[tuple[str, str]] = []
        for group_id in list(self.groups):
            group = self.groups.get(group_id)
            if group is None or not any(_overdue(m, now) for m in group.members.values()):
                continue

            def sweep(group_id: str = group_id) -> Steps[None]:
                for member_id in sorted(self.groups[group_id].members if group_id in self.groups else ()):
                    current = self.groups.get(group_id)
                    member = None if current is None else current.members.get(member_id)
                    if current is None or member is None or not _overdue(member, now):
                        continue
                    log.info("consumer group member expired", group_id=group_id, member_id=member_id,
                             reason="session" if member.session_deadline <= now else "revocation timeout")
                    yield from self._remove_member(current, member_id)
                    expired.append((group_id, member_id))

            await self._write_steps(group_id, sweep)
        return expired

    # ---- ConsumerGroupDescribe / admin -----------------------------------------------------------

    def _described_assignment(self, assignment: Assignment) -> _DAssignment:
        tps = []
        for tid, ps in sorted(assignment.items()):
            meta = self.topics.topic_by_id(tid)
            if meta is not None:
                tps.append(_DTopicPartitions(topic_id=tid, topic_name=meta[0], partitions=sorted(ps)))
        return _DAssignment(topic_partitions=tps)

    def describe(self, group_id: str) -> DescribedGroup:
        group = self.groups.get(group_id)
        if group is None:
            return DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                                  error_message=f"Group {group_id} not found.", members=[])
        votes = [m.server_assignor for m in group.members.values() if m.server_assignor]
        assignor = max(sorted(set(votes)), key=votes.count) if votes else self.assignors[0].name
        members = [
            _DMember(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                     client_id=m.client_id, client_host=m.client_host,
                     subscribed_topic_names=list(m.subscribed_topic_names),
                     subscribed_topic_regex=m.subscribed_topic_regex,
                     assignment=self._described_assignment(m.assigned),
                     target_assignment=self._described_assignment(group.target.get(m.member_id, {})),
                     member_type=CONSUMER_MEMBER_TYPE)
            for m in sorted(group.members.values(), key=lambda x: x.member_id)
        ]
        return DescribedGroup(error_code=ErrorCode.NONE, group_id=group_id, group_state=group.state.value,
                              group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
                              assignor_name=assignor, members=members)

    def list_groups(self) -> list[tuple[str, str]]:
        return [(gid, g.state.value) for gid, g in sorted(self.groups.items())]

    # ---- offsets (the group coordinator's offset operations ask the group) ------------------------------

    @staticmethod
    def validate_offset_commit(group: ConsumerGroup, member_id: str, member_epoch: int, *, transactional: bool,
                               version: int) -> int:
        """Kafka's ConsumerGroup.validateOffsetCommit: without a member only while the group has no members
        (or, for TxnOffsetCommit, with no member fields at all); otherwise the member must exist and use its
        current epoch (STALE_MEMBER_EPOCH, which the caller maps for older versions)."""
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE
        if transactional and member_epoch < 0 and not member_id:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not transactional and version < 9:
            return ErrorCode.UNSUPPORTED_VERSION  # KIP-848 members commit with OffsetCommit v9+
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    @staticmethod
    def validate_offset_fetch(group: ConsumerGroup, member_id: str | None, member_epoch: int) -> int:
        """OffsetFetch v9+ names the member: it must exist and use its current epoch."""
        if member_id is None:
            return ErrorCode.NONE
        if member_epoch < 0 and not member_id:
            return ErrorCode.NONE if not group.members else ErrorCode.UNKNOWN_MEMBER_ID
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    @staticmethod
    def subscribed_topics_for_offsets(group: ConsumerGroup) -> set[str]:
        """Topics whose offsets OffsetDelete refuses and expiry keeps: those the members subscribe to."""
        return {t.name for t in group.subscribed_topics.values()} if group.members else set()


def _convertible(group: object) -> bool:
    """A classic group a KIP-848 join may take over: it has no members (only offsets, or all left)."""
    return isinstance(group, ClassicGroup) and not group.members and not group.pending_sync


def apply_heartbeat_fields(member: ConsumerMember, req: HeartbeatRequest, version: int) -> None:
    """The request's member fields onto the member, as Kafka's consumerGroupHeartbeat: a null field (or -1
    for RebalanceTimeoutMs) means unchanged, since clients send each only when it changed."""
    if req.instance_id is not None:
        member.instance_id = req.instance_id
    if req.rack_id is not None:
        member.rack_id = req.rack_id
    if req.rebalance_timeout_ms != -1:
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
    if req.subscribed_topic_names is not None:
        member.subscribed_topic_names = tuple(sorted(set(req.subscribed_topic_names)))
    # An empty regex clears the member's (Kafka: a member with an empty regex has none).
    if version >= 1 and req.subscribed_topic_regex is not None:
        member.subscribed_topic_regex = req.subscribed_topic_regex or None
    if req.server_assignor is not None:
        member.server_assignor = req.server_assignor


def _copy(m: ConsumerMember) -> ConsumerMember:
    return ConsumerMember(**{f: getattr(m, f) for f in ConsumerMember.__dataclass_fields__})


def _subscription(m: ConsumerMember) -> tuple[object, ...]:
    return (m.subscribed_topic_names, m.subscribed_topic_regex, m.server_assignor)


def _metadata(m: ConsumerMember) -> tuple[object, ...]:
    return (m.instance_id, m.rack_id, m.client_id, m.client_host, m.rebalance_timeout_ms) + _subscription(m)


def _overdue(m: ConsumerMember, now: float) -> bool:
    return m.session_deadline <= now or (m.revocation_deadline is not None and m.revocation_deadline <= now)
