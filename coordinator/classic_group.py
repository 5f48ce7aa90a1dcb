"""The classic consumer group (JoinGroup/SyncGroup protocol), free of I/O.

A classic group lives mostly in memory: who is waiting to join, who still has to sync, and the
rebalance phase are not persisted (as in Kafka, a restart resumes a group in Stable or Empty). What
is persisted are Kafka's two record kinds on `__consumer_offsets`:

- GroupMetadata (key type 2): generation, protocol, leader and each member with its subscription
  and assignment, written when a rebalance ends (the leader's SyncGroup), when the group becomes
  empty, and when a static member is replaced;
- OffsetCommit (key type 1): one record per committed partition, kept by the shard's
  `OffsetMetadataManager` beside the group, not in it.

Writers build those records from the group; the coordinator runtime appends them durably and only
then replays them into the partition's `GroupCoordinatorShard`, the same `replay` that rebuilds every
group at start-up.
"""

from __future__ import annotations

from collections.abc import Collection, Container
from dataclasses import dataclass, field
from enum import Enum

from shoal.protocol import coordinator_records as cr
from shoal.protocol.coordinator_records import CoordinatorRecord
from shoal.protocol.errors import ErrorCode

from .offset_metadata_manager import offset_tombstone

# The value version Kafka 4.x writes: static membership needs GroupMetadataValue v3.
GROUP_METADATA_VALUE_VERSION = 3
CONSUMER_PROTOCOL_TYPE = "consumer"

_GroupValue = cr.value_class(cr.GROUP_METADATA)
_MemberMetadata = _GroupValue.MemberMetadata


class ClassicGroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata) in the member's order of preference
    assignment: bytes = b""
    # Not persisted: where the member is in the current rebalance.
    awaiting_join: bool = False
    awaiting_sync: bool = False
    is_new: bool = False
    heartbeat_deadline: float = 0.0

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass
class ClassicGroup:
    group_id: str
    state: ClassicGroupState = ClassicGroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)  # got MEMBER_ID_REQUIRED, not joined yet
    pending_sync: set[str] = field(default_factory=set)  # joined this generation, not synced yet
    state_timestamp_ms: int = -1
    # Initial rebalance delay: members joined during the current delay window, and time left after it.
    new_member_added: bool = False
    initial_delay_remaining_ms: int = 0
    initial_delay_running: bool = False

    # ---- views ---------------------------------------------------------------------------------------

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def candidate_protocols(self) -> set[str]:
        names: set[str] | None = None
        for m in self.members.values():
            mine = {n for n, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's check for a joining member: the group's type, and a protocol every member supports."""
        names = {n for n, _ in protocols}
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool(self.candidate_protocols() & names)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred candidate; the most voted wins (first on ties)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        order: list[str] = []
        for m in self.members.values():
            choice = next(n for n, _ in m.protocols if n in candidates)
            if choice not in votes:
                order.append(choice)
            votes[choice] = votes.get(choice, 0) + 1
        return max(order, key=lambda n: votes[n])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol); None when they cannot be known."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None if self.members else set()
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_subscription_topics(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    # ---- membership (in memory) ------------------------------------------------------------------------

    def add_member(self, member: ClassicMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.pending_members.discard(member.member_id)
        if self.state == ClassicGroupState.PREPARING_REBALANCE and self.initial_delay_running:
            self.new_member_added = True

    def remove_member(self, member_id: str) -> ClassicMember | None:
        member = self.members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            # The first member still waiting to join takes over, else any member.
            waiting = [m for m in self.members.values() if m.awaiting_join]
            pick = waiting[0] if waiting else next(iter(self.members.values()), None)
            self.leader_id = None if pick is None else pick.member_id
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> ClassicMember:
        member = self.members.pop(old_id)
        member.member_id = new_id
        member.awaiting_join = member.awaiting_sync = False
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def init_next_generation(self, now_ms: int) -> None:
        """The join phase ended: a new generation with the members that rejoined."""
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.state = ClassicGroupState.COMPLETING_REBALANCE
            self.pending_sync = set(self.members)
        else:
            self.protocol_name = None
            self.state = ClassicGroupState.EMPTY
            self.pending_sync = set()
        self.state_timestamp_ms = now_ms

    # ---- records ---------------------------------------------------------------------------------------

    def metadata_record(self, assignments: dict[str, bytes] | None, now_ms: int,
                        *, generation: int | None = None, empty: bool = False) -> CoordinatorRecord:
        """GroupMetadata with every member's selected-protocol subscription and `assignments` (or theirs)."""
        members = [] if empty else [
            _MemberMetadata(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms, subscription=m.metadata(self.protocol_name),
                assignment=(assignments.get(m.member_id, b"") if assignments is not None else m.assignment),
            )
            for m in self.members.values()
        ]
        value = _GroupValue(
            protocol_type=self.protocol_type or "", generation=self.generation_id if generation is None else generation,
            protocol=None if empty else self.protocol_name, leader=None if empty else self.leader_id,
            current_state_timestamp=now_ms, members=members,
        )
        key = cr.key_class(cr.GROUP_METADATA)(group=self.group_id)
        return CoordinatorRecord(cr.GROUP_METADATA, key, value, GROUP_METADATA_VALUE_VERSION)

    def tombstone_records(self) -> list[CoordinatorRecord]:
        """The group's own record goes (DeleteGroups writes the offsets' tombstones before it)."""
        return [CoordinatorRecord(cr.GROUP_METADATA, cr.key_class(cr.GROUP_METADATA)(group=self.group_id), None)]

    @property
    def is_simple(self) -> bool:
        """A group that only holds offsets (assign() + commit): no protocol, no members (Kafka's isSimpleGroup)."""
        return self.protocol_type is None and not self.members and not self.pending_members

    # ---- replay: how persisted changes reach memory (at start-up and after each write) ----------------

    def replay(self, record: CoordinatorRecord) -> None:
        """A GroupMetadata record (or its tombstone)."""
        v = record.value
        if v is None:
            self.state = ClassicGroupState.DEAD
            return
        self.generation_id = v.generation
        self.protocol_type = v.protocol_type or None
        self.protocol_name = v.protocol
        self.leader_id = v.leader
        self.state_timestamp_ms = v.current_state_timestamp
        kept: dict[str, ClassicMember] = {}
        for mm in v.members or ():
            m = self.members.get(mm.member_id)
            if m is None:
                m = ClassicMember(
                    member_id=mm.member_id, group_instance_id=mm.group_instance_id, client_id=mm.client_id,
                    client_host=mm.client_host, rebalance_timeout_ms=mm.rebalance_timeout if mm.rebalance_timeout >= 0
                    else mm.session_timeout, session_timeout_ms=mm.session_timeout,
                    protocol_type=v.protocol_type, protocols=[(v.protocol or "", mm.subscription)],
                )
            m.assignment = mm.assignment
            m.awaiting_join = m.awaiting_sync = False
            kept[mm.member_id] = m
        self.members = kept
        self.static_members = {m.group_instance_id: mid for mid, m in kept.items() if m.group_instance_id is not None}
        self.pending_sync = set()
        self.state = ClassicGroupState.STABLE if kept else ClassicGroupState.EMPTY


def plan_offset_deletes(group_id: str, committed: Container[tuple[str, int]], partitions: list[tuple[str, int]],
                        subscribed: Collection[str] | None) -> tuple[list[int], list[CoordinatorRecord]]:
    """OffsetDelete's per-partition codes and the tombstones to write; `subscribed` None means every topic
    counts as subscribed (a group whose members' subscriptions cannot be read)."""
    codes: list[int] = []
    records: list[CoordinatorRecord] = []
    for topic, partition in partitions:
        if subscribed is None or topic in subscribed:
            codes.append(ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)
            continue
        codes.append(ErrorCode.NONE)
        if (topic, partition) in committed:
            records.append(offset_tombstone(group_id, topic, partition))
    return codes, records


def record_group_id(record: CoordinatorRecord) -> str:
    return str(record.key.group)


def parse_subscription_topics(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (any version: the topic list comes first); None if malformed."""
    try:
        pos = 2  # int16 version
        count = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        pos += 4
        if count < 0 or len(data) < pos:
            return None
        topics: set[str] = set()
        for _ in range(count):
            size = int.from_bytes(data[pos:pos + 2], "big", signed=True)
            pos += 2
            if size < 0 or pos + size > len(data):
                return None
            topics.add(data[pos:pos + size].decode())
            pos += size
        return topics
    except (UnicodeDecodeError, ValueError):
        return None

