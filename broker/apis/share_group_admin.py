"""Share-group administration: Describe/Alter/DeleteShareGroupOffsets, and DeleteGroups / DescribeGroups
answered for share groups (the only kind of group this broker hosts).

Authorization happens here, as in Kafka's request layer; group changes go through
`ShareGroupAdminServices.share_groups`, share-partition state through its `persister`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from shoal.broker.apis.share_group_apis import GROUP_OPERATIONS, ShareGroupHandlers
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.share.group_configs import GroupConfigStoreError
from shoal.broker.storage.partition_source import LATEST, SourceUnavailable
from shoal.coordinator.classic_group import ClassicGroup, ClassicGroupState
from shoal.persister.persister import SharePartitionKey, StateSummary
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.coordinator_records import fits_key_string
from shoal.protocol.errors import ErrorCode
from shoal.protocol.uuids import ZERO_UUID

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ShareGroupAdminServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.share_group_admin")

UNKNOWN_START_OFFSET = -1
UNKNOWN_LAG = -1
DEAD = "Dead"
NO_OFFSETS_TO_DELETE = "There is no offset information to delete."

DescribeOffsetsResponse = messages.DescribeShareGroupOffsetsResponse
_DGroup = DescribeOffsetsResponse.DescribeShareGroupOffsetsResponseGroup
_DTopic = DescribeOffsetsResponse.DescribeShareGroupOffsetsResponseTopic
_DPartition = DescribeOffsetsResponse.DescribeShareGroupOffsetsResponsePartition
AlterOffsetsResponse = messages.AlterShareGroupOffsetsResponse
_ATopic = AlterOffsetsResponse.AlterShareGroupOffsetsResponseTopic
_APartition = AlterOffsetsResponse.AlterShareGroupOffsetsResponsePartition
DeleteOffsetsResponse = messages.DeleteShareGroupOffsetsResponse
_DelTopic = DeleteOffsetsResponse.DeleteShareGroupOffsetsResponseTopic
DeleteGroupsResponse = messages.DeleteGroupsResponse
_DeletableGroup = DeleteGroupsResponse.DeletableGroupResult
DescribeGroupsResponse = messages.DescribeGroupsResponse
_DescribedGroup = DescribeGroupsResponse.DescribedGroup
_DescribedMember = DescribeGroupsResponse.DescribedGroupMember


def compute_lag(latest_offset: int, summary: StateSummary) -> int:
    """KIP-1226 lag: records at or after the start offset not yet delivered to completion; -1 when unknown."""
    if summary.start_offset < 0 or summary.delivery_complete_count < 0:
        return UNKNOWN_LAG
    return max(0, latest_offset - summary.start_offset - summary.delivery_complete_count)


class ShareGroupAdmin(ShareGroupHandlers):
    services: ShareGroupAdminServices

    def __init__(self, services: ShareGroupAdminServices):
        super().__init__(services)

    def _offsets_change_refused(self, ctx: RequestContext, group_id: str) -> tuple[int, str | None] | None:
        """Checks shared by Alter- and DeleteShareGroupOffsets, in Kafka's order; None when it may go ahead."""
        if not self._enabled():
            return ErrorCode.UNSUPPORTED_VERSION, "Share groups are not enabled on this broker."
        # The design page's ACL table asks for READ on the group for both.
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, group_id):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, None
        if not group_id or not fits_key_string(group_id):
            return ErrorCode.INVALID_GROUP_ID, "The group id must be non-empty and at most 32767 bytes."
        code = self._coordinator_error(group_id)
        if code != ErrorCode.NONE:
            return code, None
        return None

    def _classic(self, group_id: str) -> ClassicGroup | None:
        """The classic group with this id, if the broker hosts one."""
        classic = self.services.classic_groups
        return None if classic is None else classic.groups.get(group_id)

    def _coordinator_error(self, group_id: str) -> int:
        """Why the coordinator cannot serve the group now (NONE when it can)."""
        coordinator = self.coordinator
        if coordinator is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not coordinator.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if coordinator.released(group_id):  # sidecar mode: its state partition is not this instance's now
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    # ---- DescribeShareGroupOffsets ------------------------------------------------------------------

    async def describe_share_group_offsets(self, ctx: RequestContext, req: messages.DescribeShareGroupOffsetsRequest) -> messages.DescribeShareGroupOffsetsResponse:
        groups = await asyncio.gather(*(self._describe_group_offsets(ctx, g) for g in req.groups))
        return DescribeOffsetsResponse(groups=list(groups))

    async def _describe_group_offsets(
        self, ctx: RequestContext, g: messages.DescribeShareGroupOffsetsRequest.DescribeShareGroupOffsetsRequestGroup
    ) -> messages.DescribeShareGroupOffsetsResponse.DescribeShareGroupOffsetsResponseGroup:
        group_id = g.group_id

        def failed(code: int, message: str | None = None) -> _DGroup:
            return _DGroup(group_id=group_id, topics=[], error_code=code, error_message=message)

        if not self._enabled():
            return failed(ErrorCode.UNSUPPORTED_VERSION, "Share groups are not enabled on this broker.")
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            return failed(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        if not group_id:
            return failed(ErrorCode.INVALID_GROUP_ID, "The group id must not be empty.")
        code = self._coordinator_error(group_id)
        if code != ErrorCode.NONE:
            return failed(code)
        coordinator = self.coordinator
        assert coordinator is not None

        # (name, topic id or None if unknown, partitions, error for all of them)
        wanted: list[tuple[str, bytes | None, list[int], int]] = []
        if g.topics is None:
            initialized = coordinator.initialized_partitions(group_id)
            if initialized is None:
                return failed(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
            for tid, parts in initialized.items():
                found = self.services.topics.topic_by_id(tid)
                # Topics the caller may not describe are left out, as are deleted ones.
                if found is not None and ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, found[0]):
                    wanted.append((found[0], tid, sorted(parts), ErrorCode.NONE))
            wanted.sort()
        else:
            for t in g.topics:
                named = self.services.topics.topic_by_name(t.topic_name)
                if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t.topic_name):
                    wanted.append((t.topic_name, None, list(t.partitions), ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                elif named is None:
                    wanted.append((t.topic_name, None, list(t.partitions), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                else:
                    wanted.append((t.topic_name, named[0], list(t.partitions), ErrorCode.NONE))

        topics = []
        for name, wanted_id, wanted_parts, error in wanted:
            if wanted_id is None or error != ErrorCode.NONE:
                topics.append(_DTopic(topic_name=name, topic_id=wanted_id or ZERO_UUID, partitions=[
                    _DPartition(partition_index=p, start_offset=UNKNOWN_START_OFFSET, leader_epoch=0,
                                lag=UNKNOWN_LAG, error_code=error)
                    for p in wanted_parts
                ]))
                continue
            found = self.services.topics.topic_by_id(wanted_id)
            count = 0 if found is None else found[1]
            rows = await asyncio.gather(*(
                self._describe_partition(group_id, wanted_id, p, count) for p in wanted_parts))
            topics.append(_DTopic(topic_name=name, topic_id=wanted_id, partitions=list(rows)))
        return _DGroup(group_id=group_id, topics=topics, error_code=ErrorCode.NONE)

    async def _describe_partition(self, group_id: str, topic_id: bytes, partition: int, count: int) -> _DPartition:
        if not 0 <= partition < count:
            return _DPartition(partition_index=partition, start_offset=UNKNOWN_START_OFFSET, leader_epoch=0,
                               lag=UNKNOWN_LAG, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        summary = await self.services.persister.read_state_summary(SharePartitionKey(group_id, topic_id, partition), 0)
        if summary.error_code != ErrorCode.NONE or summary.start_offset < 0:
            # Kafka reports "no state" (and persister trouble) as an unknown start offset, not an error.
            return _DPartition(partition_index=partition, start_offset=UNKNOWN_START_OFFSET, leader_epoch=0,
                               lag=UNKNOWN_LAG, error_code=ErrorCode.NONE)
        source = self.services.topics.source(topic_id, partition)
        try:
            latest = await source.list_offset(LATEST) if source is not None else summary.start_offset
        except SourceUnavailable:
            latest = -1  # the upstream cannot say now: the lag is unknown
        if latest < 0:
            return _DPartition(partition_index=partition, start_offset=summary.start_offset,
                               leader_epoch=summary.leader_epoch, lag=UNKNOWN_LAG, error_code=ErrorCode.NONE)
        return _DPartition(partition_index=partition, start_offset=summary.start_offset,
                           leader_epoch=summary.leader_epoch, lag=compute_lag(latest, summary),
                           error_code=ErrorCode.NONE)

    # ---- AlterShareGroupOffsets ---------------------------------------------------------------------

    async def alter_share_group_offsets(self, ctx: RequestContext, req: messages.AlterShareGroupOffsetsRequest) -> messages.AlterShareGroupOffsetsResponse:
        group_id = req.group_id

        def failed(code: int, message: str | None = None) -> AlterOffsetsResponse:
            return AlterOffsetsResponse(error_code=code, error_message=message, responses=[])

        refused = self._offsets_change_refused(ctx, group_id)
        if refused is not None:
            return failed(*refused)
        coordinator = self.coordinator
        assert coordinator is not None

        # Per-partition errors decided before touching state; the rest is handed to the coordinator.
        early: dict[tuple[str, int], tuple[int, str | None]] = {}
        offsets: dict[bytes, dict[int, int]] = {}
        ids: dict[str, bytes] = {}
        for t in req.topics:
            topic = self.services.topics.topic_by_name(t.topic_name)
            allowed = ctx.authorize(Operation.READ, ResourceType.TOPIC, t.topic_name)
            if topic is not None:
                ids[t.topic_name] = topic[0]
            for p in t.partitions:
                where = (t.topic_name, p.partition_index)
                if not allowed:
                    early[where] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)
                elif topic is None or not 0 <= p.partition_index < topic[1]:
                    early[where] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    "The topic-partition does not exist.")
                elif p.start_offset < UNKNOWN_START_OFFSET:
                    early[where] = (ErrorCode.INVALID_REQUEST, "The start offset must be -1 or more.")
                else:
                    offsets.setdefault(topic[0], {})[p.partition_index] = p.start_offset

        group_error: int = ErrorCode.NONE
        errors: dict[tuple[bytes, int], int] = {}
        if offsets:
            # The state epoch must not be below what the share coordinator holds (e.g. state left by an
            # earlier incarnation of the group), or the re-initialisation would be fenced.
            summaries = await asyncio.gather(*(
                self.services.persister.read_state_summary(SharePartitionKey(group_id, tid, p), 0)
                for tid, parts in offsets.items() for p in parts
            ))
            min_epoch = max((s.state_epoch for s in summaries if s.error_code == ErrorCode.NONE
                             and s.start_offset >= 0), default=0)
            group_error, errors = await coordinator.alter_offsets(group_id, offsets, min_state_epoch=min_epoch)
        elif not coordinator.is_empty(group_id):
            group_error = ErrorCode.NON_EMPTY_GROUP
        if group_error != ErrorCode.NONE:
            message = "The group has active members." if group_error == ErrorCode.NON_EMPTY_GROUP else None
            return failed(group_error, message)
        if offsets:
            # Leaders still holding the old state would keep serving it; the next fetch reloads instead.
            self.services.share_partitions.drop_group(group_id)

        responses = []
        for t in req.topics:
            tid = ids.get(t.topic_name, ZERO_UUID)
            parts = []
            for p in t.partitions:
                code_msg = early.get((t.topic_name, p.partition_index))
                if code_msg is None:
                    code_msg = (errors.get((tid, p.partition_index), ErrorCode.UNKNOWN_SERVER_ERROR), None)
                parts.append(_APartition(partition_index=p.partition_index, error_code=code_msg[0],
                                         error_message=code_msg[1]))
            responses.append(_ATopic(topic_name=t.topic_name, topic_id=tid, partitions=parts))
        return AlterOffsetsResponse(error_code=ErrorCode.NONE, responses=responses)

    # ---- DeleteShareGroupOffsets --------------------------------------------------------------------

    async def delete_share_group_offsets(self, ctx: RequestContext, req: messages.DeleteShareGroupOffsetsRequest) -> messages.DeleteShareGroupOffsetsResponse:
        group_id = req.group_id

        def failed(code: int, message: str | None = None) -> DeleteOffsetsResponse:
            return DeleteOffsetsResponse(error_code=code, error_message=message, responses=[])

        refused = self._offsets_change_refused(ctx, group_id)
        if refused is not None:
            return failed(*refused)
        coordinator = self.coordinator
        assert coordinator is not None

        early: dict[str, int] = {}
        ids: dict[str, bytes] = {}
        for t in req.topics:
            named = self.services.topics.topic_by_name(t.topic_name)
            if not ctx.authorize(Operation.READ, ResourceType.TOPIC, t.topic_name):
                early[t.topic_name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif named is None:
                early[t.topic_name] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                ids[t.topic_name] = named[0]
        group_error, errors = await coordinator.delete_offsets(group_id, set(ids.values()))
        if group_error != ErrorCode.NONE:
            message = "The group has active members." if group_error == ErrorCode.NON_EMPTY_GROUP else None
            return failed(group_error, message)
        if ids:
            self.services.share_partitions.drop_group(group_id)
        responses = []
        for t in req.topics:
            tid = ids.get(t.topic_name)
            if tid is None:
                err = early.get(t.topic_name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                responses.append(_DelTopic(topic_name=t.topic_name, topic_id=ZERO_UUID, error_code=err))
            else:
                err = errors.get(tid, ErrorCode.NONE)
                if err == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:  # a topic without share state (named only)
                    responses.append(_DelTopic(topic_name=t.topic_name, topic_id=ZERO_UUID, error_code=err,
                                               error_message=NO_OFFSETS_TO_DELETE))
                else:
                    responses.append(_DelTopic(topic_name=t.topic_name, topic_id=tid, error_code=err))
        return DeleteOffsetsResponse(error_code=ErrorCode.NONE, responses=responses)

    # ---- DeleteGroups / DescribeGroups --------------------------------------------------------------

    async def delete_groups(self, ctx: RequestContext, req: messages.DeleteGroupsRequest) -> messages.DeleteGroupsResponse:
        results = []
        for group_id in req.groups_names:
            code: int
            if not ctx.authorize(Operation.DELETE, ResourceType.GROUP, group_id):
                code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            elif not group_id:
                code = ErrorCode.INVALID_GROUP_ID
            elif (code := self._coordinator_error(group_id)) == ErrorCode.NONE:
                groups = self.services.group_coordinator
                assert groups is not None and self.coordinator is not None
                share = group_id in self.coordinator.groups
                code = await groups.delete_group(group_id)
                if code == ErrorCode.NONE and share:
                    # Dynamic configs and in-memory share partitions die with the group.
                    try:
                        await self.services.group_configs.delete_group(group_id)
                    except GroupConfigStoreError as exc:  # the group is gone; its configs stay stored
                        log.warning("deleted group's configs not removed", group=group_id, reason=str(exc))
                    self.services.share_partitions.drop_group(group_id)
            results.append(_DeletableGroup(group_id=group_id, error_code=code))
        return DeleteGroupsResponse(results=results)

    def describe_groups(self, ctx: RequestContext, req: messages.DescribeGroupsRequest) -> messages.DescribeGroupsResponse:
        version = ctx.api_version
        out = []
        for group_id in req.groups:
            if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
                out.append(_DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED))
                continue
            code = self._coordinator_error(group_id)
            if code != ErrorCode.NONE:
                out.append(_DescribedGroup(group_id=group_id, error_code=code))
                continue
            classic = self._classic(group_id)
            if classic is not None:
                described = describe_classic_group(classic)
                if version >= 3 and req.include_authorized_operations:
                    described.authorized_operations = sum(
                        1 << op for op in GROUP_OPERATIONS if ctx.authorize(op, ResourceType.GROUP, group_id)
                    )
                out.append(described)
                continue
            # Kafka's DescribeGroups describes classic groups only: a share or KIP-848 consumer group is
            # answered like an unknown one, "Dead", and from v6 on (KIP-1043) GROUP_ID_NOT_FOUND.
            described = _DescribedGroup(group_id=group_id, group_state=DEAD, error_code=ErrorCode.NONE)
            if version >= 6:
                coordinator = self.coordinator
                consumer = self.services.consumer_groups
                shared = (coordinator is not None and group_id in coordinator.groups) or (
                    consumer is not None and group_id in consumer.groups)
                described.error_code = ErrorCode.GROUP_ID_NOT_FOUND
                described.error_message = (f"Group {group_id} is not a classic group." if shared
                                           else f"Group {group_id} not found.")
            out.append(described)
        return DescribeGroupsResponse(groups=out)


def describe_classic_group(group: ClassicGroup) -> _DescribedGroup:
    """DescribeGroups for a classic group: metadata and assignments only once it is Stable, as in Kafka."""
    stable = group.state == ClassicGroupState.STABLE
    members = [
        _DescribedMember(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                         client_host=m.client_host, member_metadata=m.metadata(group.protocol_name) if stable else b"",
                         member_assignment=m.assignment if stable else b"")
        for m in group.members.values()
    ]
    return _DescribedGroup(
        group_id=group.group_id, error_code=ErrorCode.NONE, group_state=group.state.value,
        protocol_type=group.protocol_type or "", protocol_data=(group.protocol_name or "") if stable else "",
        members=members,
    )


def register(table: ApiTable, services: ShareGroupAdminServices) -> ShareGroupAdmin:
    h = ShareGroupAdmin(services)
    table.register(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, 1, h.describe_share_group_offsets)
    table.register(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, 0, h.alter_share_group_offsets)
    table.register(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, 0, h.delete_share_group_offsets)
    table.register(ApiKey.DELETE_GROUPS, 0, 2, h.delete_groups)
    table.register(ApiKey.DESCRIBE_GROUPS, 0, 6, h.describe_groups)
    return h
