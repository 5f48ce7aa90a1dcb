"""The share-group model and its membership state machine, free of I/O.

Every change is planned as a list of coordinator records (what Kafka writes to `__consumer_offsets`);
the coordinator appends them and only then replays them into these objects, so the in-memory state is
always exactly what a restart would rebuild from the log.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from shoal.protocol import coordinator_records as cr
from shoal.protocol.codec import MessageBase
from shoal.protocol.coordinator_records import CoordinatorRecord
from shoal.protocol.errors import ErrorCode
from shoal.protocol.messages import ShareGroupStatePartitionMetadataValue

from .assignor import SimpleAssignor
from .consumer_group import AssignedPartitions

_PartitionsInfo = ShareGroupStatePartitionMetadataValue.TopicPartitionsInfo

LEAVE_GROUP_MEMBER_EPOCH = -1
JOIN_GROUP_MEMBER_EPOCH = 0
MEMBER_STATE_STABLE = 0  # share members are always written STABLE (one-step reconciliation)

SHARE_RECORD_TYPES = frozenset({
    cr.SHARE_GROUP_MEMBER_METADATA,
    cr.SHARE_GROUP_METADATA,
    cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
    cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
    cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    cr.SHARE_GROUP_STATE_PARTITION_METADATA,
})

TopicAssignment = dict[bytes, frozenset[int]]


class TopicMetadataSource(Protocol):
    """What the coordinator needs to know about topics (the broker's registry implements it)."""

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        """(topic id, partition count), or None if the topic does not exist."""
        ...

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        """(topic name, partition count), or None if the topic does not exist."""
        ...


class GroupState(Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


class ShareGroupError(Exception):
    """A request that fails with a Kafka error code; nothing has been written."""

    def __init__(self, code: ErrorCode, message: str | None = None):
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@dataclass(slots=True)
class ShareMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    assigned_partitions: TopicAssignment = field(default_factory=dict)
    # Not persisted: a member restored from the log gets a fresh session.
    session_deadline: float = 0.0

    def same_metadata(self, other: ShareMember) -> bool:
        return (
            self.rack_id == other.rack_id
            and self.client_id == other.client_id
            and self.client_host == other.client_host
            and self.subscribed_topic_names == other.subscribed_topic_names
        )


@dataclass(slots=True)
class TopicInit:
    """A topic's share partitions in one initialisation phase; `timestamp` (clock seconds) is in-memory only."""

    name: str
    partitions: set[int]
    timestamp: float = float("-inf")


@dataclass(slots=True)
class InitRequest:
    """Share partitions whose state the persister must create: group, state epoch, topic -> partitions."""

    group_id: str
    state_epoch: int
    topics: dict[bytes, set[int]]


@dataclass(slots=True)
class HeartbeatPlan:
    records: list[CoordinatorRecord]
    member_id: str
    member_epoch: int
    assignment: TopicAssignment | None  # None = leave the response's Assignment null
    init: InitRequest | None = None


def metadata_hash(topic_names: Iterable[str], topics: TopicMetadataSource) -> int:
    """A 64-bit digest of the subscribed topics' ids and partition counts; 0 when none exist.

    Kafka's exact hash function is irrelevant on the wire; what matters is that it changes when a
    subscribed topic is created, deleted or gains partitions.
    """
    h = hashlib.blake2b(digest_size=8)
    seen = False
    for name in sorted(set(topic_names)):
        meta = topics.topic_by_name(name)
        if meta is None:
            continue
        seen = True
        topic_id, count = meta
        h.update(name.encode())
        h.update(b"\x00")
        h.update(topic_id)
        h.update(count.to_bytes(4, "big"))
    return int.from_bytes(h.digest(), "big", signed=True) if seen else 0


# ---- record builders ---------------------------------------------------------------------------------


def _rec(record_type: int, key: MessageBase, value: MessageBase | None) -> CoordinatorRecord:
    return CoordinatorRecord(record_type, key, value)


def _key(record_type: int, group_id: str, member_id: str | None = None) -> MessageBase:
    cls: Any = cr.key_class(record_type)  # every share-group key class has group_id, most member_id
    key: MessageBase = cls(group_id=group_id) if member_id is None else cls(group_id=group_id, member_id=member_id)
    return key


def group_epoch_record(group_id: str, epoch: int, hash_: int) -> CoordinatorRecord:
    t = cr.SHARE_GROUP_METADATA
    return _rec(t, _key(t, group_id), cr.value_class(t)(epoch=epoch, metadata_hash=hash_))


def member_metadata_record(group_id: str, m: ShareMember) -> CoordinatorRecord:
    t = cr.SHARE_GROUP_MEMBER_METADATA
    value = cr.value_class(t)(
        rack_id=m.rack_id, client_id=m.client_id, client_host=m.client_host,
        subscribed_topic_names=sorted(m.subscribed_topic_names),
    )
    return _rec(t, _key(t, group_id, m.member_id), value)


def target_member_record(group_id: str, member_id: str, assignment: Mapping[bytes, Iterable[int]]) -> CoordinatorRecord:
    t = cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER
    cls = cr.value_class(t)
    tps = [cls.TopicPartition(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(assignment.items()) if ps]
    return _rec(t, _key(t, group_id, member_id), cls(topic_partitions=tps))


def target_metadata_record(group_id: str, assignment_epoch: int, assignment_timestamp_ms: int = 0) -> CoordinatorRecord:
    """`assignment_timestamp_ms`: wall-clock time the assignment was computed (KIP-1263), 0 if none was."""
    t = cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA
    value = cr.value_class(t)(assignment_epoch=assignment_epoch, assignment_timestamp=assignment_timestamp_ms)
    return _rec(t, _key(t, group_id), value)


def can_compute_next_target_assignment(assignment_timestamp_ms: int, interval_ms: int, now_ms: int) -> bool:
    """KIP-1263: a new target assignment waits until `interval_ms` has passed since the last one was computed.

    No known last computation (0) or a zero interval (the escape hatch if the wall clock jumped back)
    computes at once, as in Kafka.
    """
    if assignment_timestamp_ms == 0 or interval_ms == 0:
        return True
    return now_ms >= assignment_timestamp_ms + interval_ms


def current_assignment_record(group_id: str, m: ShareMember) -> CoordinatorRecord:
    t = cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT
    cls = cr.value_class(t)
    tps = [cls.TopicPartitions(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(m.assigned_partitions.items()) if ps]
    value = cls(member_epoch=m.member_epoch, previous_member_epoch=m.previous_member_epoch,
                state=MEMBER_STATE_STABLE, assigned_partitions=tps)
    return _rec(t, _key(t, group_id, m.member_id), value)


def state_partition_metadata_record(
    group_id: str,
    initializing: Mapping[bytes, TopicInit],
    initialized: Mapping[bytes, TopicInit],
    deleting: Mapping[bytes, str],
) -> CoordinatorRecord:
    t = cr.SHARE_GROUP_STATE_PARTITION_METADATA
    cls = cr.value_class(t)

    def infos(m: Mapping[bytes, TopicInit]) -> list[_PartitionsInfo]:
        return [cls.TopicPartitionsInfo(topic_id=tid, topic_name=ti.name, partitions=sorted(ti.partitions))
                for tid, ti in sorted(m.items()) if ti.partitions]

    value = cls(
        initializing_topics=infos(initializing),
        initialized_topics=infos(initialized),
        deleting_topics=[cls.TopicInfo(topic_id=tid, topic_name=name) for tid, name in sorted(deleting.items())],
    )
    return _rec(t, _key(t, group_id), value)


def tombstone(record_type: int, group_id: str, member_id: str | None = None) -> CoordinatorRecord:
    return _rec(record_type, _key(record_type, group_id, member_id), None)


def _to_assignment(tps: Iterable[AssignedPartitions] | None) -> TopicAssignment:
    out: TopicAssignment = {}
    for tp in tps or ():
        if tp.partitions:
            out[tp.topic_id] = out.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return out


# ---- the group ---------------------------------------------------------------------------------------


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    metadata_hash: int = 0
    assignment_epoch: int = 0
    assignment_timestamp_ms: int = 0  # when the target assignment was last computed (wall clock), 0 if unknown
    members: dict[str, ShareMember] = field(default_factory=dict)
    target_assignment: dict[str, TopicAssignment] = field(default_factory=dict)
    initializing: dict[bytes, TopicInit] = field(default_factory=dict)
    initialized: dict[bytes, TopicInit] = field(default_factory=dict)
    deleting: dict[bytes, str] = field(default_factory=dict)
    deleted: bool = False  # the epoch tombstone was replayed: the coordinator drops the group
    deleting_group: bool = False  # DeleteGroups in progress (state Dead)

    @property
    def state(self) -> GroupState:
        if self.deleted or self.deleting_group:
            return GroupState.DEAD
        return GroupState.STABLE if self.members else GroupState.EMPTY

    def subscribed_topic_names(self, replacing: ShareMember | None = None, without: str | None = None) -> set[str]:
        names: set[str] = set()
        for mid, m in self.members.items():
            if mid == without or (replacing is not None and mid == replacing.member_id):
                continue
            names |= m.subscribed_topic_names
        if replacing is not None:
            names |= replacing.subscribed_topic_names
        return names

    # ---- replay: the only way state changes ----------------------------------------------------------

    def replay(self, record: CoordinatorRecord) -> None:
        t, v = record.record_type, record.value
        if t == cr.SHARE_GROUP_METADATA:
            if v is None:
                self.deleted = True
            else:
                self.group_epoch, self.metadata_hash = v.epoch, v.metadata_hash
                self.deleted = False
        elif t == cr.SHARE_GROUP_MEMBER_METADATA:
            member_id = record.key.member_id
            if v is None:
                self.members.pop(member_id, None)
                return
            m = self.members.get(member_id) or self.members.setdefault(member_id, ShareMember(member_id))
            m.rack_id, m.client_id, m.client_host = v.rack_id, v.client_id, v.client_host
            m.subscribed_topic_names = frozenset(v.subscribed_topic_names or ())
        elif t == cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = 0 if v is None else v.assignment_epoch
            self.assignment_timestamp_ms = 0 if v is None else v.assignment_timestamp
        elif t == cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
            if v is None:
                self.target_assignment.pop(record.key.member_id, None)
            else:
                self.target_assignment[record.key.member_id] = _to_assignment(v.topic_partitions)
        elif t == cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT:
            member_id = record.key.member_id
            if v is None:
                existing = self.members.get(member_id)
                if existing is not None:
                    existing.assigned_partitions = {}
                return
            m = self.members.get(member_id) or self.members.setdefault(member_id, ShareMember(member_id))
            m.member_epoch, m.previous_member_epoch = v.member_epoch, v.previous_member_epoch
            m.assigned_partitions = _to_assignment(v.assigned_partitions)
        elif t == cr.SHARE_GROUP_STATE_PARTITION_METADATA:
            if v is None:
                self.initializing, self.initialized, self.deleting = {}, {}, {}
                return
            # Keep in-memory retry timestamps of topics that stay in the initializing phase.
            old = self.initializing
            self.initializing = {
                i.topic_id: TopicInit(i.topic_name, set(i.partitions or ()),
                                      old[i.topic_id].timestamp if i.topic_id in old else float("-inf"))
                for i in v.initializing_topics or ()
            }
            self.initialized = {i.topic_id: TopicInit(i.topic_name, set(i.partitions or ())) for i in v.initialized_topics or ()}
            self.deleting = {i.topic_id: i.topic_name for i in v.deleting_topics or ()}

    # ---- derived views -------------------------------------------------------------------------------

    def assignable_partitions(self, topic_names: set[str], topics: TopicMetadataSource) -> dict[bytes, list[int]]:
        """Initialised partitions of subscribed topics that still exist (only these may be assigned)."""
        out: dict[bytes, list[int]] = {}
        for tid, info in self.initialized.items():
            meta = topics.topic_by_id(tid)
            if meta is None or meta[0] not in topic_names:
                continue
            parts = sorted(p for p in info.partitions if p < meta[1])
            if parts:
                out[tid] = parts
        return out

    def initialized_assignment_pending(self, topic_names: set[str], topics: TopicMetadataSource) -> bool:
        """True when some assignable partition is not in the target assignment (e.g. just initialised)."""
        if not self.members:
            return False
        assigned: dict[bytes, set[int]] = {}
        for assignment in self.target_assignment.values():
            for tid, ps in assignment.items():
                assigned.setdefault(tid, set()).update(ps)
        return any(assigned.get(tid, set()) != set(ps) for tid, ps in self.assignable_partitions(topic_names, topics).items())

    def uninitialized_partitions(
        self, topic_names: set[str], topics: TopicMetadataSource, now: float, retry_interval: float
    ) -> dict[bytes, TopicInit]:
        """Subscribed partitions that are neither initialised nor freshly being initialised."""
        out: dict[bytes, TopicInit] = {}
        for name in sorted(topic_names):
            meta = topics.topic_by_name(name)
            if meta is None:
                continue
            tid, count = meta
            known = set(self.initialized[tid].partitions) if tid in self.initialized else set()
            pending = self.initializing.get(tid)
            if pending is not None and now - pending.timestamp < retry_interval:
                known |= pending.partitions
            missing = set(range(count)) - known
            if missing:
                out[tid] = TopicInit(name, missing, now)
        return out

    def initializing_record(self, additions: Mapping[bytes, TopicInit]) -> CoordinatorRecord:
        merged = {tid: TopicInit(ti.name, set(ti.partitions), ti.timestamp) for tid, ti in self.initializing.items()}
        for tid, ti in additions.items():
            cur = merged.get(tid)
            if cur is None:
                merged[tid] = TopicInit(ti.name, set(ti.partitions), ti.timestamp)
            else:
                cur.partitions |= ti.partitions
                cur.timestamp = ti.timestamp
        # A topic that is initialised again is no longer being deleted.
        deleting = {tid: name for tid, name in self.deleting.items() if tid not in additions}
        return state_partition_metadata_record(self.group_id, merged, self.initialized, deleting)

    def initialized_record(self, done: Mapping[bytes, set[int]]) -> CoordinatorRecord | None:
        """Move successfully initialised partitions from initializing to initialized."""
        initializing = {tid: TopicInit(ti.name, set(ti.partitions), ti.timestamp) for tid, ti in self.initializing.items()}
        initialized = {tid: TopicInit(ti.name, set(ti.partitions)) for tid, ti in self.initialized.items()}
        changed = False
        for tid, parts in done.items():
            pending = initializing.get(tid)
            if pending is None:
                continue  # deleted or re-planned meanwhile
            moved = pending.partitions & parts
            if not moved:
                continue
            changed = True
            pending.partitions -= moved
            if not pending.partitions:
                del initializing[tid]
            initialized.setdefault(tid, TopicInit(pending.name, set())).partitions |= moved
        if not changed:
            return None
        return state_partition_metadata_record(self.group_id, initializing, initialized, self.deleting)

    # ---- membership ----------------------------------------------------------------------------------

    def plan_heartbeat(
        self,
        *,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed_topic_names: list[str] | None,
        client_id: str,
        client_host: str,
        topics: TopicMetadataSource,
        assignor: SimpleAssignor,
        max_size: int,
        now: float,
        init_retry_interval: float,
        now_ms: int = 0,
        assignment_interval_ms: int = 0,
    ) -> HeartbeatPlan:
        """A join (epoch 0) or regular heartbeat; raises ShareGroupError. Does not modify the group.

        `now_ms` is the wall clock (persisted as the assignment timestamp); `now` the monotonic one.
        """
        records: list[CoordinatorRecord] = []
        gid = self.group_id
        existing = self.members.get(member_id)
        if existing is None and len(self.members) >= max_size:
            raise ShareGroupError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                  f"The share group has reached its maximum capacity of {max_size} members.")
        if existing is None:
            if member_epoch != JOIN_GROUP_MEMBER_EPOCH:
                raise ShareGroupError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {gid}.")
            existing = ShareMember(member_id)
        elif member_epoch != JOIN_GROUP_MEMBER_EPOCH:
            # The previous epoch is accepted too: the response that bumped it may have been lost.
            if member_epoch > existing.member_epoch or (
                member_epoch < existing.member_epoch and member_epoch != existing.previous_member_epoch
            ):
                raise ShareGroupError(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The share group member has epoch {member_epoch}, the coordinator knows "
                    f"{existing.member_epoch} (previous {existing.previous_member_epoch}). The member must rejoin.",
                )

        updated = dataclasses.replace(
            existing,
            rack_id=rack_id if rack_id is not None else existing.rack_id,
            subscribed_topic_names=(frozenset(subscribed_topic_names) if subscribed_topic_names is not None
                                    else existing.subscribed_topic_names),
            client_id=client_id,
            client_host=client_host,
        )
        subscription_changed = updated.subscribed_topic_names != existing.subscribed_topic_names
        if member_id not in self.members or not updated.same_metadata(existing):
            records.append(member_metadata_record(gid, updated))
        bump = subscription_changed

        names = self.subscribed_topic_names(replacing=updated)
        if self.assignment_epoch >= self.group_epoch:
            bump |= self.initialized_assignment_pending(names, topics)
        new_hash = metadata_hash(names, topics)
        bump |= new_hash != self.metadata_hash
        group_epoch = self.group_epoch
        if bump:
            group_epoch += 1
            records.append(group_epoch_record(gid, group_epoch, new_hash))

        # Target assignment: recomputed when the group epoch moved past it, at most once per assignment
        # interval (KIP-1263); meanwhile members reconcile towards the last target assignment.
        if self.assignment_epoch < group_epoch and can_compute_next_target_assignment(
            self.assignment_timestamp_ms, assignment_interval_ms, now_ms
        ):
            members = dict(self.members)
            members[member_id] = updated
            target = self.compute_target_assignment(members, topics, assignor)
            for mid in sorted(target):
                if target[mid] != self.target_assignment.get(mid, {}):
                    records.append(target_member_record(gid, mid, target[mid]))
            records.append(target_metadata_record(gid, group_epoch, now_ms))
            target_epoch, member_target = group_epoch, target.get(member_id, {})
        else:
            target_epoch, member_target = self.assignment_epoch, self.target_assignment.get(member_id, {})

        # One-step reconciliation: the member moves straight to its target.
        reconciled = updated
        if subscription_changed or updated.member_epoch != target_epoch:
            reconciled = dataclasses.replace(
                updated,
                assigned_partitions=self._filter_to_subscription(member_target, updated.subscribed_topic_names, topics),
            )
            if updated.member_epoch != target_epoch:
                reconciled.previous_member_epoch = updated.member_epoch
                reconciled.member_epoch = target_epoch
            if (reconciled.member_epoch, reconciled.previous_member_epoch, reconciled.assigned_partitions) != (
                existing.member_epoch, existing.previous_member_epoch, existing.assigned_partitions
            ) or member_id not in self.members:
                records.append(current_assignment_record(gid, reconciled))

        init = None
        missing = self.uninitialized_partitions(names, topics, now, init_retry_interval)
        if missing:
            records.append(self.initializing_record(missing))
            init = InitRequest(gid, group_epoch, {tid: set(ti.partitions) for tid, ti in missing.items()})

        send_assignment = (
            member_epoch == JOIN_GROUP_MEMBER_EPOCH
            or subscribed_topic_names is not None
            or reconciled.assigned_partitions != existing.assigned_partitions
        )
        return HeartbeatPlan(
            records=records,
            member_id=member_id,
            member_epoch=reconciled.member_epoch,
            assignment=reconciled.assigned_partitions if send_assignment else None,
            init=init,
        )

    def plan_remove_member(self, member_id: str, topics: TopicMetadataSource) -> list[CoordinatorRecord]:
        """Leave or session expiry: drop the member's records and bump the epoch so the rest re-assign."""
        gid = self.group_id
        records = [
            tombstone(cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, gid, member_id),
            tombstone(cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, gid, member_id),
            tombstone(cr.SHARE_GROUP_MEMBER_METADATA, gid, member_id),
        ]
        epoch = self.group_epoch + 1
        records.append(group_epoch_record(gid, epoch, metadata_hash(self.subscribed_topic_names(without=member_id), topics)))
        if len(self.members) == 1:
            # The group becomes empty: its (empty) assignment is current at the new epoch.
            records.append(target_metadata_record(gid, epoch, self.assignment_timestamp_ms))
        return records

    def plan_delete(self) -> list[CoordinatorRecord]:
        """Tombstones for every record of an empty group."""
        gid = self.group_id
        records = []
        for mid in sorted(self.members):
            records.append(tombstone(cr.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, gid, mid))
        for mid in sorted(set(self.members) | set(self.target_assignment)):
            records.append(tombstone(cr.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, gid, mid))
        records.append(tombstone(cr.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA, gid))
        for mid in sorted(self.members):
            records.append(tombstone(cr.SHARE_GROUP_MEMBER_METADATA, gid, mid))
        records.append(tombstone(cr.SHARE_GROUP_STATE_PARTITION_METADATA, gid))
        records.append(tombstone(cr.SHARE_GROUP_METADATA, gid))
        return records

    def plan_metadata_refresh(self, topics: TopicMetadataSource) -> list[CoordinatorRecord]:
        """Bump the epoch when the subscribed topics' metadata changed (created, deleted, partitions added)."""
        if not self.members:
            return []
        new_hash = metadata_hash(self.subscribed_topic_names(), topics)
        if new_hash == self.metadata_hash:
            return []
        return [group_epoch_record(self.group_id, self.group_epoch + 1, new_hash)]

    def compute_target_assignment(
        self, members: Mapping[str, ShareMember], topics: TopicMetadataSource, assignor: SimpleAssignor
    ) -> dict[str, TopicAssignment]:
        subscriptions: dict[str, set[bytes]] = {}
        for mid, m in members.items():
            ids = set()
            for name in m.subscribed_topic_names:
                meta = topics.topic_by_name(name)
                if meta is not None:
                    ids.add(meta[0])
            subscriptions[mid] = ids
        names = set().union(*(m.subscribed_topic_names for m in members.values())) if members else set()
        result = assignor.assign(subscriptions, self.assignable_partitions(names, topics),
                                 {mid: self.target_assignment.get(mid, {}) for mid in members})
        return {mid: {tid: frozenset(ps) for tid, ps in a.items() if ps} for mid, a in result.items()}

    @staticmethod
    def _filter_to_subscription(
        assignment: Mapping[bytes, frozenset[int]], names: frozenset[str], topics: TopicMetadataSource
    ) -> TopicAssignment:
        out: TopicAssignment = {}
        for tid, ps in assignment.items():
            meta = topics.topic_by_id(tid)
            if meta is not None and meta[0] in names and ps:
                out[tid] = frozenset(ps)
        return out
