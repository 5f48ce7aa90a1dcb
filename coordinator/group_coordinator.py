"""The group coordinator: every group on `__consumer_offsets` (classic, KIP-848 consumer and share groups)
and every committed offset, over one runtime whose shards are `GroupCoordinatorShard`s, as Kafka's
GroupCoordinatorService over GroupCoordinatorShard.

The group types' protocols live in `classic`, `consumer` and `share` (Kafka's GroupMetadataManager
split by type); they share this runtime, so one group id names one group and its operations are
ordered under one key whatever API they come from. The offset operations live here (Kafka's
OffsetMetadataManager): OffsetCommit, TxnOffsetCommit (KIP-447 fencing), OffsetFetch, OffsetDelete, the
end-transaction markers of transactional commits, offset expiry (`offsets.retention.minutes`) and the
removal of a deleted topic's offsets (Kafka's onPartitionsDeleted). Each asks the group holding the id
to check the request, plans records, and lets the runtime append and replay them before answering.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from shoal.persister.persister import Persister
from shoal.protocol.coordinator_records import CoordinatorRecord
from shoal.protocol.errors import ErrorCode

from .classic_coordinator import ClassicGroupConfig, ClassicGroupCoordinator, OffsetToCommit, valid_group_id
from .classic_group import ClassicGroup, ClassicGroupState, plan_offset_deletes
from .consumer_assignors import ConsumerAssignor
from .consumer_coordinator import ConsumerGroupConfig, ConsumerGroupCoordinator, ConsumerTopicSource
from .consumer_group import ConsumerGroup
from .group_coordinator_shard import Group, GroupCoordinatorShard, GroupRuntime, group_runtime, load_all
from .offset_metadata_manager import (
    CommittedOffset,
    OffsetMetadataManager,
    offset_commit_record,
    offset_tombstone,
)
from .placement import Placement
from .record_log import TransactionalRecordLog
from .runtime import CoordinatorResult
from .share_group import ShareGroup
from .share_group_coordinator import GroupConfigSource, ShareGroupConfig, ShareGroupCoordinator

log = structlog.get_logger("shoal.group_coordinator")

T = TypeVar("T")
OffsetRow = tuple[str, int, CommittedOffset | None]
_EXPIRY_TIMER = "offsets-expiry"


@dataclass(slots=True)
class OffsetConfig:
    metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms


class GroupCoordinator:
    def __init__(
        self,
        record_log: TransactionalRecordLog,
        topics: ConsumerTopicSource,
        persister: Persister,
        *,
        share_config: ShareGroupConfig | None = None,
        classic_config: ClassicGroupConfig | None = None,
        consumer_config: ConsumerGroupConfig | None = None,
        offset_config: OffsetConfig | None = None,
        assignors: list[ConsumerAssignor] | None = None,
        group_configs: GroupConfigSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        placement: Placement[str] | None = None,
    ):
        self.runtime: GroupRuntime = group_runtime(record_log)
        # Where a group id lives on `__consumer_offsets`, shared by the parts and the transaction coordinator.
        self.placement = placement or Placement(self.runtime.num_partitions)
        self.offset_config = offset_config or OffsetConfig()
        self.wall_ms = wall_ms
        self.share = ShareGroupCoordinator(self.runtime, topics, persister, share_config, group_configs=group_configs,
                                           clock=clock, wall_clock=lambda: wall_ms() / 1000, placement=self.placement)
        self.classic = ClassicGroupCoordinator(self.runtime, classic_config, clock=clock, wall_ms=wall_ms,
                                               placement=self.placement)
        self.consumer = ConsumerGroupCoordinator(self.runtime, topics, consumer_config, assignors=assignors,
                                                 clock=clock, wall_ms=wall_ms, placement=self.placement)

    @property
    def loaded(self) -> bool:
        """Every partition of `__consumer_offsets` has been read."""
        return len(self.runtime.loaded) == self.runtime.num_partitions

    # ---- plumbing ---------------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return self.placement.partition_for(group_id)

    def loaded_for(self, group_id: str) -> bool:
        """The group's partition has been read. In a sidecar group the other partitions are other
        instances' and never load here, so `loaded` (every partition) is not the question to ask."""
        return self.partition_for(group_id) in self.runtime.loaded

    def _shard(self, group_id: str) -> GroupCoordinatorShard:
        return self.runtime.shard(self.partition_for(group_id))

    def _group(self, group_id: str) -> Group | None:
        return self._shard(group_id).groups.get(group_id)

    def offsets_of(self, group_id: str) -> OffsetMetadataManager:
        return self._shard(group_id).offsets

    async def _write_result(self, group_id: str, operation: Callable[[], CoordinatorResult[T]], failed: T,
                            what: str) -> T:
        """Run a planning operation on the group (the runtime appends its records, replays them and then
        answers); `failed` is the answer when the write cannot be made durable."""
        try:
            return await self.runtime.write_result(self.partition_for(group_id), group_id, operation)
        except Exception:
            log.exception("group coordinator write failed", operation=what, group_id=group_id)
            return failed

    # ---- lifecycle --------------------------------------------------------------------------------

    async def load(self) -> None:
        """Read `__consumer_offsets` once into the shards, then let each group type set up its groups."""
        await load_all(self.runtime, self.placement)
        await self.share.load()
        await self.consumer.load()
        await self.classic.load()
        log.info("group coordinator loaded", groups=sum(len(s.groups) for s in self.runtime.shards),
                 offsets=sum(len(s.offsets.offsets(g)) for s in self.runtime.shards for g in s.offsets.group_ids()))

    async def load_partition(self, partition: int) -> None:
        """A partition taken (again) after start-up (sidecar mode): read it like the others were, then arm
        the timers its groups need, as `start` did for the partitions loaded first."""
        await self.load()
        self.share.start()  # re-arms every share member's session timer (by name, replacing) and the retries
        self._schedule_expiry(partition)

    def start(self) -> None:
        """Timers and background work (needs a running loop)."""
        self.classic.start()
        self.consumer.start()
        self.share.start()
        for partition in range(self.runtime.num_partitions):
            self._schedule_expiry(partition)

    async def stop(self) -> None:
        self.classic.unload()
        await self.share.stop()
        await self.consumer.stop()
        await self.classic.stop()
        self.runtime.cancel_all_timers()
        await self.runtime.drain()

    # ---- OffsetCommit -----------------------------------------------------------------------------

    def _validate_commit(self, group: Group | None, member_id: str, instance_id: str | None, generation: int,
                         *, transactional: bool, version: int) -> int:
        """Kafka's validateOffsetCommit / validateTransactionalOffsetCommit, asked of the group's type."""
        if group is None:
            if generation < 0:
                return ErrorCode.NONE  # offsets without a group (assign() + commit, admin clients)
            if transactional:
                return ErrorCode.ILLEGAL_GENERATION
            return ErrorCode.GROUP_ID_NOT_FOUND if version >= 9 else ErrorCode.ILLEGAL_GENERATION
        if isinstance(group, ClassicGroup):
            return self.classic.validate_offset_commit(group, member_id, instance_id, generation,
                                                       transactional=transactional)
        if isinstance(group, ConsumerGroup):
            code = self.consumer.validate_offset_commit(group, member_id, generation, transactional=transactional,
                                                        version=version)
            if code == ErrorCode.STALE_MEMBER_EPOCH and (transactional or version < 9):
                return ErrorCode.ILLEGAL_GENERATION  # what clients before KIP-848 understand
            return code
        return ErrorCode.GROUP_ID_NOT_FOUND  # share groups have no committed offsets

    def _plan_commit(self, group_id: str, offsets: list[OffsetToCommit]) -> tuple[list[int], list[CoordinatorRecord]]:
        now_ms = self.wall_ms()
        codes: list[int] = []
        records: list[CoordinatorRecord] = []
        for o in offsets:
            metadata = o.metadata or ""
            if len(metadata.encode()) > self.offset_config.metadata_max_bytes:
                codes.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
                continue
            codes.append(ErrorCode.NONE)
            records.append(offset_commit_record(group_id, o.topic, o.partition,
                                                CommittedOffset(o.offset, o.leader_epoch, metadata, now_ms)))
        return codes, records

    def _not_ready(self, group_id: str) -> int:
        if not valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        if self.partition_for(group_id) in self.runtime.released:
            return ErrorCode.NOT_COORDINATOR  # another instance owns the group's partition now (sidecar mode)
        if not self.loaded_for(group_id):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    async def commit_offsets(self, group_id: str, member_id: str, instance_id: str | None,
                             generation_or_epoch: int, offsets: list[OffsetToCommit],
                             version: int) -> tuple[int, list[int]]:
        """OffsetCommit: a group-level error (applied to every partition) or one code per offset."""
        if (code := self._not_ready(group_id)) != ErrorCode.NONE:
            return code, []

        def operation() -> CoordinatorResult[tuple[int, list[int]]]:
            group = self._group(group_id)
            error = self._validate_commit(group, member_id, instance_id, generation_or_epoch, transactional=False,
                                          version=version)
            if error != ErrorCode.NONE:
                return CoordinatorResult([], (error, []))
            if isinstance(group, ClassicGroup):
                self.classic.touch_member(group, member_id)
            codes, records = self._plan_commit(group_id, offsets)
            return CoordinatorResult(records, (ErrorCode.NONE, codes))

        return await self._write_result(group_id, operation, (ErrorCode.COORDINATOR_NOT_AVAILABLE, []),
                                        "offset commit")

    async def commit_transactional_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                           member_id: str, instance_id: str | None, generation_id: int,
                                           offsets: list[OffsetToCommit]) -> tuple[int, list[int]]:
        """TxnOffsetCommit: written in the producer's transactional batch, pending until its marker. The
        member fields (v3, KIP-447) are checked against the group: a zombie of an older generation is
        fenced."""
        if (code := self._not_ready(group_id)) != ErrorCode.NONE:
            return code, []

        def operation() -> CoordinatorResult[tuple[int, list[int]]]:
            error = self._validate_commit(self._group(group_id), member_id, instance_id, generation_id,
                                          transactional=True, version=-1)
            if error != ErrorCode.NONE:
                return CoordinatorResult([], (error, []))
            codes, records = self._plan_commit(group_id, offsets)
            return CoordinatorResult(records, (ErrorCode.NONE, codes), producer_id, producer_epoch)

        return await self._write_result(group_id, operation, (ErrorCode.COORDINATOR_NOT_AVAILABLE, []),
                                        "transactional offset commit")

    def on_transaction_completed(self, partition: int, producer_id: int, commit: bool) -> None:
        """The producer's COMMIT or ABORT marker is durable on this `__consumer_offsets` partition."""
        self.runtime.replay_end_transaction(partition, producer_id, commit)

    def has_pending_offset(self, group_id: str, topic: str, partition: int) -> bool:
        return self.offsets_of(group_id).has_pending(group_id, topic, partition)

    # ---- OffsetFetch / OffsetDelete ---------------------------------------------------------------

    def fetch_offsets(self, group_id: str, member_id: str | None, member_epoch: int,
                      wanted: list[tuple[str, list[int]]] | None) -> tuple[int, list[OffsetRow]]:
        """OffsetFetch: (topic, partition, committed or None) for `wanted`, or every committed offset."""
        if (code := self._not_ready(group_id)) != ErrorCode.NONE:
            return code, []
        group = self._group(group_id)
        if isinstance(group, ConsumerGroup):
            error = self.consumer.validate_offset_fetch(group, member_id, member_epoch)
            if error != ErrorCode.NONE:
                return error, []
        elif group is not None and not isinstance(group, ClassicGroup):
            return ErrorCode.GROUP_ID_NOT_FOUND, []
        offsets = self.offsets_of(group_id).offsets(group_id)
        if wanted is None:
            return ErrorCode.NONE, [(t, p, c) for (t, p), c in sorted(offsets.items())]
        return ErrorCode.NONE, [(t, p, offsets.get((t, p))) for t, parts in wanted for p in parts]

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> tuple[int, list[int]]:
        """OffsetDelete: refused per partition while the group's members subscribe to the topic."""
        if (code := self._not_ready(group_id)) != ErrorCode.NONE:
            return code, []

        def operation() -> CoordinatorResult[tuple[int, list[int]]]:
            group = self._group(group_id)
            subscribed: set[str] | None
            if isinstance(group, ClassicGroup) and group.state != ClassicGroupState.DEAD:
                if group.state != ClassicGroupState.EMPTY and group.protocol_type != "consumer":
                    return CoordinatorResult([], (ErrorCode.NON_EMPTY_GROUP, []))
                subscribed = self.classic.subscribed_topics_for_offsets(group)
            elif isinstance(group, ConsumerGroup):
                subscribed = self.consumer.subscribed_topics_for_offsets(group)
            else:
                return CoordinatorResult([], (ErrorCode.GROUP_ID_NOT_FOUND, []))
            codes, records = plan_offset_deletes(group_id, self.offsets_of(group_id).offsets(group_id), partitions,
                                                 subscribed)
            return CoordinatorResult(records, (ErrorCode.NONE, codes))

        return await self._write_result(group_id, operation, (ErrorCode.COORDINATOR_NOT_AVAILABLE, []),
                                        "offset deletion")

    # ---- DeleteGroups -----------------------------------------------------------------------------

    async def delete_group(self, group_id: str) -> int:
        """DeleteGroups: an empty group goes with its committed offsets (their tombstones first, as Kafka
        writes them); a share group's persisted state is deleted by its part first."""
        if self.partition_for(group_id) in self.runtime.released:
            return ErrorCode.NOT_COORDINATOR  # another instance owns the group's partition now (sidecar mode)
        if not self.loaded_for(group_id):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if isinstance(self._group(group_id), ShareGroup):
            return await self.share.delete_group(group_id)

        def operation() -> CoordinatorResult[int]:
            group = self._group(group_id)
            if group is None or isinstance(group, ShareGroup) or (
                    isinstance(group, ClassicGroup) and group.state == ClassicGroupState.DEAD):
                return CoordinatorResult([], ErrorCode.GROUP_ID_NOT_FOUND)
            if group.members or (isinstance(group, ClassicGroup) and group.state != ClassicGroupState.EMPTY):
                return CoordinatorResult([], ErrorCode.NON_EMPTY_GROUP)
            # The group's own tombstone is replayed even for a classic group never written: it goes too.
            records = self.offsets_of(group_id).delete_group_records(group_id)
            records += group.tombstone_records() if isinstance(group, ClassicGroup) else group.delete_records()
            return CoordinatorResult(records, ErrorCode.NONE)

        code: int = await self._write_result(group_id, operation, int(ErrorCode.UNKNOWN_SERVER_ERROR), "group deletion")
        if code == ErrorCode.NONE:
            log.info("group deleted", group_id=group_id)
        return code

    # ---- deleted topics and expiry ----------------------------------------------------------------

    async def on_topics_deleted(self, topics: Iterable[str]) -> None:
        """The topics are gone: their committed offsets go too, in every group (Kafka's onPartitionsDeleted)."""
        names = set(topics)
        for partition, shard in enumerate(self.runtime.shards):
            for group_id in shard.offsets.groups_with_topics(names):
                if not self.placement.holds(partition, group_id):
                    continue  # a copy Placement left out: its group lives elsewhere

                def delete(group_id: str = group_id) -> CoordinatorResult[None]:
                    gone = self.offsets_of(group_id).groups_with_topics(names).get(group_id, [])
                    return CoordinatorResult([offset_tombstone(group_id, t, p) for t, p in gone], None)

                await self.runtime.write_result(partition, group_id, delete)
        log.info("offsets of deleted topics removed", topics=sorted(names))

    def _schedule_expiry(self, partition: int) -> None:
        delay = self.offset_config.retention_check_interval_ms / 1000

        async def expire() -> None:
            try:
                await self.expire_offsets(partition)
            finally:
                self._schedule_expiry(partition)

        # The timer holds a key of its own; each group's expiry then runs as that group's operation.
        self.runtime.schedule(partition, _EXPIRY_TIMER, delay, _EXPIRY_TIMER, expire)

    async def expire_offsets(self, partition: int, now_ms: int | None = None) -> int:
        """Kafka's cleanupGroupMetadata for one partition: offsets past `offsets.retention.minutes` go, and a
        classic or consumer group that is empty once it has no offsets left goes with them (share groups
        keep their persisted state and are deleted only by DeleteGroups). Returns the offsets removed."""
        now = self.wall_ms() if now_ms is None else now_ms
        shard = self.runtime.shard(partition)
        removed = 0
        candidates = sorted(gid for gid in set(shard.offsets.group_ids()) | {
            gid for gid, g in shard.groups.items() if isinstance(g, ClassicGroup | ConsumerGroup)}
            if self.placement.holds(partition, gid))
        for group_id in candidates:

            def expire(group_id: str = group_id) -> CoordinatorResult[int]:
                group = shard.groups.get(group_id)
                if isinstance(group, ShareGroup):
                    return CoordinatorResult([], 0)
                subscribed = self._retained_topics(group)
                offsets = shard.offsets
                gone = [] if subscribed is None else offsets.expired(
                    group_id, now, self.offset_config.retention_ms, subscribed[0], subscribed[1])
                records = [offset_tombstone(group_id, t, p) for t, p in gone]
                emptied = len(gone) == len(offsets.offsets(group_id)) and not offsets.has_open_transactions(group_id)
                if emptied and group is not None and _is_empty(group):
                    # Kafka's maybeDeleteGroup: an empty group without offsets goes (a simple one too).
                    records += group.delete_records() if isinstance(group, ConsumerGroup) else group.tombstone_records()
                if gone:
                    log.info("expired offsets removed", group_id=group_id, offsets=len(gone))
                return CoordinatorResult(records, len(gone))

            removed += await self.runtime.write_result(partition, group_id, expire)
        return removed

    def _retained_topics(self, group: Group | None) -> tuple[set[str], int | None] | None:
        """Kafka's offsetExpirationCondition: the topics whose offsets never expire and the time retention
        runs from (None: each offset's commit); None when no offset of the group may expire now."""
        if group is None:
            return set(), None
        if isinstance(group, ConsumerGroup):
            return self.consumer.subscribed_topics_for_offsets(group), None
        if not isinstance(group, ClassicGroup):
            return None
        if group.state == ClassicGroupState.EMPTY:
            # Retention runs from when the group became empty (for a simple group, from each commit).
            empty_since = group.state_timestamp_ms if group.protocol_type is not None else -1
            return set(), empty_since if empty_since >= 0 else None
        if group.protocol_type == "consumer" and group.state == ClassicGroupState.STABLE:
            subscribed = group.subscribed_topics()
            return None if subscribed is None else (subscribed, None)
        return None


def _is_empty(group: ClassicGroup | ConsumerGroup) -> bool:
    if isinstance(group, ClassicGroup):
        return group.state == ClassicGroupState.EMPTY and not group.pending_members
    return not group.members
