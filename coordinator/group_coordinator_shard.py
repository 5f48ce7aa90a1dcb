"""The group coordinator's shard: every group and every committed offset on one `__consumer_offsets`
partition, as Kafka's GroupCoordinatorShard with its GroupMetadataManager and OffsetMetadataManager.

One map holds the groups of all types (classic, KIP-848 consumer, share), so a group id names one group;
the offsets live beside them, keyed by group id, so they outlive a group's change of type. The shard
changes only by `replay` (and `replay_end_transaction` for the markers of transactional offset commits),
both when the coordinator runtime loads the partition and after each durable append, so memory is always
what a restart would rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

import structlog

from shoal.protocol import coordinator_records as cr
from shoal.protocol.coordinator_records import NO_PRODUCER_ID, CoordinatorRecord

from .classic_group import ClassicGroup, ClassicGroupState
from .consumer_group import CONSUMER_RECORD_TYPES, ConsumerGroup
from .offset_metadata_manager import OFFSET_COMMIT_TYPES, OffsetMetadataManager
from .placement import Placement
from .record_log import CoordinatorRecordLog
from .runtime import Answer, AsyncSteps, Steps, TransactionalCoordinatorRuntime
from .share_group import SHARE_RECORD_TYPES, ShareGroup

log = structlog.get_logger("shoal.group_coordinator")

Group = ClassicGroup | ConsumerGroup | ShareGroup


def record_group_id(record: CoordinatorRecord) -> str:
    key = record.key
    return str(key.group if hasattr(key, "group") else key.group_id)


class GroupCoordinatorShard:
    __slots__ = ("groups", "offsets", "share_epoch_bumps", "consumer_epoch_bumps")

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.offsets = OffsetMetadataManager()
        # Group epoch bumps replayed (the rebalance counts), per group type.
        self.share_epoch_bumps = 0
        self.consumer_epoch_bumps = 0

    def replay(self, offset: int, record: CoordinatorRecord, producer_id: int = NO_PRODUCER_ID) -> None:
        t = record.record_type
        if t in OFFSET_COMMIT_TYPES:
            self._replay_offset_commit(offset, producer_id, record)
        elif t == cr.GROUP_METADATA:
            self._replay_classic(record)
        elif t in CONSUMER_RECORD_TYPES:
            self._replay_consumer(record)
        elif t in SHARE_RECORD_TYPES:
            self._replay_share(record)

    def replay_end_transaction(self, producer_id: int, commit: bool) -> None:
        for group_id in self.offsets.replay_end_transaction(producer_id, commit):
            if group_id not in self.groups:
                self.groups[group_id] = ClassicGroup(group_id)  # offsets without a group, as above

    # ---- per record kind --------------------------------------------------------------------------

    def _replay_offset_commit(self, offset: int, producer_id: int, record: CoordinatorRecord) -> None:
        self.offsets.replay(offset, producer_id, record)
        group_id = record_group_id(record)
        if record.value is not None and producer_id == NO_PRODUCER_ID and group_id not in self.groups:
            # Offsets without a group (assign() + commit) make a simple classic group, as in Kafka; a
            # consumer group's records replayed later replace it.
            self.groups[group_id] = ClassicGroup(group_id)

    def _replay_classic(self, record: CoordinatorRecord) -> None:
        group_id = record_group_id(record)
        group = self.groups.get(group_id)
        if group is not None and not isinstance(group, ClassicGroup):
            if record.value is not None:
                log.warning("classic group record for a group of another type skipped", group_id=group_id)
            return
        if group is None:
            if record.value is None:
                return  # tombstone for a group we no longer hold
            group = self.groups[group_id] = ClassicGroup(group_id)
        group.replay(record)
        if group.state == ClassicGroupState.DEAD:
            del self.groups[group_id]

    def _replay_consumer(self, record: CoordinatorRecord) -> None:
        # A classic group without members (one holding only offsets, or an empty one converted by a
        # KIP-848 member's join) becomes the consumer group; its offsets stay where they are.
        if self._replay_epoch_group(record, ConsumerGroup, lambda g: not g.members):
            self.consumer_epoch_bumps += 1

    def _replay_share(self, record: CoordinatorRecord) -> None:
        # Only a simple group (offsets without a group) gives way to a share group.
        if self._replay_epoch_group(record, ShareGroup, lambda g: g.is_simple):
            self.share_epoch_bumps += 1

    def _replay_epoch_group(self, record: CoordinatorRecord, kind: type[ConsumerGroup] | type[ShareGroup],
                            replaces: Callable[[ClassicGroup], bool]) -> bool:
        """Replay a record of a consumer or share group (KIP-848 records); True when the group epoch grew."""
        group_id = record_group_id(record)
        group = self.groups.get(group_id)
        if isinstance(group, ClassicGroup) and replaces(group):
            group = None
            del self.groups[group_id]
        if group is None:
            if record.value is None:
                return False  # tombstone for a group we no longer hold
            group = self.groups[group_id] = kind(group_id)
        elif not isinstance(group, kind):
            log.warning("group record for a group of another type skipped", group_id=group_id,
                        record_type=record.record_type)
            return False
        before = group.group_epoch
        group.replay(record)
        if group.deleted:
            del self.groups[group_id]
        return group.group_epoch > before


G = TypeVar("G", ClassicGroup, ConsumerGroup, ShareGroup)


class GroupsView(Mapping[str, G], Generic[G]):
    """The groups of one type across every shard, read-only. A lookup goes to the partition `partition_for`
    names, and iteration yields a shard's group only where `partition_for` names that shard: the two agree
    by construction, whatever partitions a data directory's records are in."""

    def __init__(self, shards: Sequence[GroupCoordinatorShard], partition_for: Callable[[str], int], kind: type[G]):
        self._shards = shards
        self._partition_for = partition_for
        self._kind: type[G] = kind

    def __getitem__(self, group_id: str) -> G:
        group = self._shards[self._partition_for(group_id)].groups[group_id]
        if not isinstance(group, self._kind):
            raise KeyError(group_id)
        return group

    def __iter__(self) -> Iterator[str]:
        for partition, shard in enumerate(self._shards):
            yield from [gid for gid, g in shard.groups.items()
                        if isinstance(g, self._kind) and self._partition_for(gid) == partition]

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def any_type(self, group_id: str) -> Group | None:
        """The group of that id, whatever its type."""
        return self._shards[self._partition_for(group_id)].groups.get(group_id)

    def held_by_other_type(self, group_id: str) -> bool:
        group = self.any_type(group_id)
        return group is not None and not isinstance(group, self._kind)


GroupRuntime = TransactionalCoordinatorRuntime[GroupCoordinatorShard]


def group_runtime(source: CoordinatorRecordLog | GroupRuntime) -> GroupRuntime:
    """The runtime over `__consumer_offsets` the group coordinator shares, or a new one over `source`."""
    if isinstance(source, TransactionalCoordinatorRuntime):
        return source
    return TransactionalCoordinatorRuntime(source, lambda _partition: GroupCoordinatorShard())


async def load_all(runtime: GroupRuntime, placement: Placement[str]) -> None:
    """Load every partition not loaded yet (the group coordinator loads them once for every group type),
    then settle where each group id lives: where replay found it (Placement)."""
    unloaded = [p for p in range(runtime.num_partitions) if p not in runtime.loaded]
    for partition in unloaded:
        await runtime.load(partition)
    if unloaded:
        placement.settle([set(shard.groups) | set(shard.offsets.group_ids()) for shard in runtime.shards], "group")


T = TypeVar("T")


class GroupsOfOneType(Generic[G]):
    """What the group coordinator's part for one group type (classic, consumer, share) stands on: the shared
    runtime, its groups of that type, and the one way to run an operation on a group and write for it."""

    def __init__(self, source: CoordinatorRecordLog | GroupRuntime, kind: type[G], placement: Placement[str] | None):
        # The group coordinator's runtime over `__consumer_offsets` (or one of its own, for tests), and where
        # a group id lives on it, shared with everything else that writes or looks up group ids there.
        self.runtime = group_runtime(source)
        self.placement = placement or Placement(self.runtime.num_partitions)
        self.groups: GroupsView[G] = GroupsView(self.runtime.shards, self.partition_for, kind)

    def partition_for(self, group_id: str) -> int:
        return self.placement.partition_for(group_id)

    def shard_of(self, group_id: str) -> GroupCoordinatorShard:
        return self.runtime.shard(self.partition_for(group_id))

    def released(self, group_id: str) -> bool:
        """The group's partition belongs to another instance now (sidecar mode): answer NOT_COORDINATOR."""
        return self.partition_for(group_id) in self.runtime.released

    async def _write_steps(self, group_id: str, operation: Callable[[], Steps[T]]) -> T:
        """Run an operation on one group through the runtime, one at a time per group and to completion
        even if the caller goes away: it yields the records of each step and the runtime appends and
        replays them (the same path `load` takes) before resuming it."""
        return await self.runtime.write_steps(self.partition_for(group_id), group_id, operation)

    async def _write_async_steps(self, group_id: str, operation: Callable[[Answer[T]], AsyncSteps], default: T) -> T:
        """`_write_steps` for an operation that also awaits share-state RPCs between its steps."""
        return await self.runtime.write_async_steps(self.partition_for(group_id), group_id, operation, default)

    async def _load_shards(self) -> None:
        """Read the partitions the group coordinator has not loaded yet (all of them, in tests of one part)."""
        await load_all(self.runtime, self.placement)
