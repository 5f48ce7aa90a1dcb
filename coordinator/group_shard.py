"""The group coordinator's shard: the groups whose records live on one `__consumer_offsets` partition.

It changes only by `replay`, both when the coordinator runtime loads the partition and after each
durable append, so memory is always what a restart would rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from shoal.protocol.coordinator_records import CoordinatorRecord

from .share_group import SHARE_RECORD_TYPES, ShareGroup


@dataclass(slots=True)
class GroupShard:
    groups: dict[str, ShareGroup] = field(default_factory=dict)
    epoch_bumps: int = 0  # group epoch bumps replayed (the rebalance count)

    def replay(self, offset: int, record: CoordinatorRecord) -> None:
        if record.record_type not in SHARE_RECORD_TYPES:
            return  # offsets and other group types' records are not kept here yet
        group_id = record.key.group_id
        group = self.groups.get(group_id)
        if group is None:
            if record.value is None:
                return  # tombstone for a group we no longer hold
            group = self.groups[group_id] = ShareGroup(group_id)
        before = group.group_epoch
        group.replay(record)
        if group.group_epoch > before:
            self.epoch_bumps += 1
        if group.deleted:
            del self.groups[group_id]


G = TypeVar("G")


class HoldsGroups(Protocol[G]):
    @property
    def groups(self) -> dict[str, G]: ...


class GroupsView(Mapping[str, G], Generic[G]):
    """Every shard's groups as one read-only map. A lookup goes to the partition `partition_for` names, and
    iteration yields a shard's group only where `partition_for` names that shard: the two agree by
    construction, whatever partitions a data directory's records are in."""

    def __init__(self, shards: Sequence[HoldsGroups[G]], partition_for: Callable[[str], int]):
        self._shards = shards
        self._partition_for = partition_for

    def __getitem__(self, group_id: str) -> G:
        return self._shards[self._partition_for(group_id)].groups[group_id]

    def __iter__(self) -> Iterator[str]:
        for partition, shard in enumerate(self._shards):
            for group_id in shard.groups:
                if self._partition_for(group_id) == partition:
                    yield group_id

    def __len__(self) -> int:
        return sum(1 for _ in self)
