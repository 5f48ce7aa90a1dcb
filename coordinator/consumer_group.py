"""The KIP-848 consumer group, free of I/O: members, epochs, target assignment and reconciliation.

The persisted state is Kafka's consumer-group records on `__consumer_offsets`:
ConsumerGroupMetadata (group epoch, type 3), ConsumerGroupPartitionMetadata (subscribed topics, 4),
ConsumerGroupMemberMetadata (5), ConsumerGroupTargetAssignmentMetadata (assignment epoch, 6),
ConsumerGroupTargetAssignmentMember (7), ConsumerGroupCurrentMemberAssignment (8); the group's offset
commits (type 1) are kept beside it by the shard's `OffsetMetadataManager`. Writers plan records from
the group, append them durably, and only then `replay` them here; `replay` is also what rebuilds every
group at start-up.

Reconciliation follows Kafka's CurrentAssignmentBuilder: a member first gives up the partitions it
loses (it keeps its epoch while it revokes), and a partition goes to its new owner only once no
other member holds it, so one partition is never consumed by two members at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Protocol

import re2

from shoal.protocol import coordinator_records as cr
from shoal.protocol.coordinator_records import CoordinatorRecord

CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_PARTITION_METADATA = 4
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_RECORD_TYPES = frozenset(range(CONSUMER_GROUP_METADATA, CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT + 1))

Assignment = dict[bytes, frozenset[int]]


class MemberState(IntEnum):
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class ConsumerGroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # Not persisted: when the session ends, and when an unfinished revocation fences the member.
    session_deadline: float = 0.0
    revocation_deadline: float | None = None

    def subscribes(self, topic: str, compiled: TopicRegex | None) -> bool:
        return topic in self.subscribed_topic_names or (compiled is not None and compiled.fullmatch(topic) is not None)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """A member's next current assignment (what CurrentAssignmentBuilder computes)."""

    state: MemberState
    member_epoch: int
    previous_member_epoch: int
    assigned: Assignment
    pending_revocation: Assignment


def _key(record_type: int, group_id: str, member_id: str | None = None) -> object:
    cls = cr.key_class(record_type)
    return cls(group_id=group_id) if member_id is None else cls(group_id=group_id, member_id=member_id)


def _tps(assignment: Assignment, cls: type) -> list[object]:
    return [cls(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(assignment.items()) if ps]


class AssignedPartitions(Protocol):
    """A topic's partitions in an assignment record: the records of several specs (target and current
    assignments, consumer and share groups) use structs of these two fields under different names."""

    @property
    def topic_id(self) -> bytes: ...
    @property
    def partitions(self) -> list[int]: ...


def _from_tps(items: Iterable[AssignedPartitions] | None) -> Assignment:
    return {bytes(t.topic_id): frozenset(t.partitions) for t in items or () if t.partitions}


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the client's error, answered; not a broker log line

RegexError = re2.error


class TopicRegex(Protocol):
    """What the coordinator uses of a compiled RE2 pattern (re2 ships no type information)."""

    def fullmatch(self, text: str) -> object | None: ...


def compile_regex(regex: str | None) -> TopicRegex | None:
    """The member's topic regex, in RE2 syntax as Kafka's (RE2/J) and matched in full; matching takes
    linear time, so no pattern can stall the broker. Raises `RegexError` for a bad pattern."""
    if not regex:
        return None
    compiled: TopicRegex = re2.compile(regex, _RE2_OPTIONS)
    return compiled


def diff(a: Assignment, b: Assignment) -> Assignment:
    out = {tid: ps - b.get(tid, frozenset()) for tid, ps in a.items()}
    return {tid: ps for tid, ps in out.items() if ps}


def intersect(a: Assignment, b: Assignment) -> Assignment:
    out = {tid: ps & b.get(tid, frozenset()) for tid, ps in a.items()}
    return {tid: ps for tid, ps in out.items() if ps}


def reconcile(member: ConsumerMember, target: Assignment, target_epoch: int,
              owned: Assignment | None, held_by_others: set[tuple[bytes, int]]) -> Reconciled:
    """The member's next state given the group's target for it (Kafka's CurrentAssignmentBuilder).

    `owned` is what the member reported owning in this heartbeat (None if it did not say);
    `held_by_others` are the partitions another member still has assigned or pending revocation.
    """
    current = Reconciled(member.state, member.member_epoch, member.previous_member_epoch, member.assigned,
                         member.pending_revocation)
    if member.state == MemberState.UNREVOKED_PARTITIONS:
        still_owned = owned is None or any(
            p in owned.get(tid, frozenset()) for tid, ps in member.pending_revocation.items() for p in ps)
        if still_owned:
            return current
    elif member.state == MemberState.STABLE and member.member_epoch == target_epoch:
        return current
    retained = intersect(member.assigned, target)
    revoke = diff(member.assigned, target)
    if revoke:
        # Revocation first: the epoch stays until the member confirms it let go.
        return Reconciled(MemberState.UNREVOKED_PARTITIONS, member.member_epoch, member.previous_member_epoch,
                          retained, revoke)
    assigned = {tid: set(ps) for tid, ps in retained.items()}
    unreleased = False
    for tid, ps in diff(target, member.assigned).items():
        for p in ps:
            if (tid, p) in held_by_others:
                unreleased = True
            else:
                assigned.setdefault(tid, set()).add(p)
    frozen = {tid: frozenset(ps) for tid, ps in assigned.items() if ps}
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return Reconciled(state, target_epoch, member.member_epoch, frozen, {})


@dataclass(frozen=True, slots=True)
class SubscribedTopic:
    name: str
    num_partitions: int


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    metadata_hash: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    subscribed_topics: dict[bytes, SubscribedTopic] = field(default_factory=dict)
    deleted: bool = False

    # ---- views ---------------------------------------------------------------------------------------

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def held_by_others(self, *member_ids: str) -> set[tuple[bytes, int]]:
        held: set[tuple[bytes, int]] = set()
        for mid, m in self.members.items():
            if mid in member_ids:
                continue
            for assignment in (m.assigned, m.pending_revocation):
                held.update((tid, p) for tid, ps in assignment.items() for p in ps)
        return held

    def subscribed_topic_names(self) -> set[str]:
        """Topics any member subscribes to by name (regex members are resolved by the coordinator)."""
        return {t for m in self.members.values() for t in m.subscribed_topic_names}

    # ---- records ---------------------------------------------------------------------------------------

    def group_epoch_record(self, epoch: int, metadata_hash: int = 0) -> CoordinatorRecord:
        value = cr.value_class(CONSUMER_GROUP_METADATA)(epoch=epoch, metadata_hash=metadata_hash)
        return CoordinatorRecord(CONSUMER_GROUP_METADATA, _key(CONSUMER_GROUP_METADATA, self.group_id), value)

    def partition_metadata_record(self, topics: dict[bytes, SubscribedTopic]) -> CoordinatorRecord:
        vcls = cr.value_class(CONSUMER_GROUP_PARTITION_METADATA)
        value = vcls(topics=[vcls.TopicMetadata(topic_id=tid, topic_name=t.name, num_partitions=t.num_partitions,
                                                partition_metadata=[])
                             for tid, t in sorted(topics.items())])
        return CoordinatorRecord(CONSUMER_GROUP_PARTITION_METADATA,
                                 _key(CONSUMER_GROUP_PARTITION_METADATA, self.group_id), value)

    def member_record(self, m: ConsumerMember) -> CoordinatorRecord:
        value = cr.value_class(CONSUMER_GROUP_MEMBER_METADATA)(
            instance_id=m.instance_id, rack_id=m.rack_id, client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=list(m.subscribed_topic_names), subscribed_topic_regex=m.subscribed_topic_regex,
            rebalance_timeout_ms=m.rebalance_timeout_ms, server_assignor=m.server_assignor,
        )
        return CoordinatorRecord(CONSUMER_GROUP_MEMBER_METADATA,
                                 _key(CONSUMER_GROUP_MEMBER_METADATA, self.group_id, m.member_id), value)

    def target_member_record(self, member_id: str, assignment: Assignment) -> CoordinatorRecord:
        vcls = cr.value_class(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER)
        value = vcls(topic_partitions=_tps(assignment, vcls.TopicPartition))
        return CoordinatorRecord(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
                                 _key(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER, self.group_id, member_id), value)

    def target_epoch_record(self, epoch: int) -> CoordinatorRecord:
        value = cr.value_class(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA)(assignment_epoch=epoch)
        return CoordinatorRecord(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
                                 _key(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, self.group_id), value)

    def current_assignment_record(self, member_id: str, r: Reconciled) -> CoordinatorRecord:
        vcls = cr.value_class(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT)
        value = vcls(member_epoch=r.member_epoch, previous_member_epoch=r.previous_member_epoch, state=int(r.state),
                     assigned_partitions=_tps(r.assigned, vcls.TopicPartitions),
                     partitions_pending_revocation=_tps(r.pending_revocation, vcls.TopicPartitions))
        return CoordinatorRecord(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                                 _key(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, self.group_id, member_id), value)

    def member_tombstones(self, member_id: str) -> list[CoordinatorRecord]:
        """A member leaves: its current assignment, target and metadata go, in Kafka's order."""
        return [CoordinatorRecord(t, _key(t, self.group_id, member_id), None) for t in (
            CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
            CONSUMER_GROUP_MEMBER_METADATA)]

    def delete_records(self) -> list[CoordinatorRecord]:
        """An empty group's own records go (DeleteGroups writes the offsets' tombstones before them)."""
        return [CoordinatorRecord(t, _key(t, self.group_id), None) for t in (
            CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, CONSUMER_GROUP_PARTITION_METADATA, CONSUMER_GROUP_METADATA)]

    # ---- replay ----------------------------------------------------------------------------------------

    def replay(self, record: CoordinatorRecord) -> None:
        t, v = record.record_type, record.value
        if t == CONSUMER_GROUP_METADATA:
            if v is None:
                self.deleted = True
            else:
                self.group_epoch, self.metadata_hash = v.epoch, v.metadata_hash
        elif t == CONSUMER_GROUP_PARTITION_METADATA:
            self.subscribed_topics = {} if v is None else {
                bytes(tm.topic_id): SubscribedTopic(tm.topic_name, tm.num_partitions) for tm in v.topics}
        elif t == CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = 0 if v is None else v.assignment_epoch
        else:
            self._replay_member(record)

    def _replay_member(self, record: CoordinatorRecord) -> None:
        t, v, member_id = record.record_type, record.value, record.key.member_id
        if t == CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER:
            if v is None:
                self.target.pop(member_id, None)
            else:
                self.target[member_id] = _from_tps(v.topic_partitions)
            return
        if v is None:
            if t == CONSUMER_GROUP_MEMBER_METADATA:
                self.members.pop(member_id, None)
            elif member_id in self.members:
                m = self.members[member_id]
                m.assigned, m.pending_revocation, m.member_epoch = {}, {}, 0
            return
        m = self.members.get(member_id) or ConsumerMember(member_id)
        self.members[member_id] = m
        if t == CONSUMER_GROUP_MEMBER_METADATA:
            m.instance_id, m.rack_id, m.client_id, m.client_host = v.instance_id, v.rack_id, v.client_id, v.client_host
            m.subscribed_topic_names = tuple(v.subscribed_topic_names)
            m.subscribed_topic_regex = v.subscribed_topic_regex
            m.rebalance_timeout_ms, m.server_assignor = v.rebalance_timeout_ms, v.server_assignor
        else:  # current member assignment
            m.member_epoch, m.previous_member_epoch = v.member_epoch, v.previous_member_epoch
            m.state = MemberState(v.state) if v.state in MemberState._value2member_map_ else MemberState.UNKNOWN
            m.assigned = _from_tps(v.assigned_partitions)
            m.pending_revocation = _from_tps(v.partitions_pending_revocation)
