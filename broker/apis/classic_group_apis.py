"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch and OffsetDelete: the
client-facing side of classic groups (`classic_groups`) and of every group's committed offsets (the
`group_coordinator`, whatever type of group holds the id).

Authorization and topic existence are checked here, as in Kafka's request layer; group logic lives
in `shoal.coordinator.classic_coordinator`, offsets in `shoal.coordinator.group_coordinator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.coordinator.classic_coordinator import ClassicGroupCoordinator, JoinRequest, OffsetToCommit
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ClassicGroupServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.groups")

JoinResponse = messages.JoinGroupResponse
SyncResponse = messages.SyncGroupResponse
HeartbeatResponse = messages.HeartbeatResponse
LeaveResponse = messages.LeaveGroupResponse
_LeaveMember = LeaveResponse.MemberResponse
_CommitRequestTopic = messages.OffsetCommitRequest.OffsetCommitRequestTopic
CommitResponse = messages.OffsetCommitResponse
_CommitTopic = CommitResponse.OffsetCommitResponseTopic
_CommitPartition = CommitResponse.OffsetCommitResponsePartition
_FetchRequestTopic = messages.OffsetFetchRequest.OffsetFetchRequestTopic
_FetchRequestTopics = messages.OffsetFetchRequest.OffsetFetchRequestTopics
FetchResponse = messages.OffsetFetchResponse
_FetchGroup = FetchResponse.OffsetFetchResponseGroup
_FetchTopicV8 = FetchResponse.OffsetFetchResponseTopics
_FetchPartitionV8 = FetchResponse.OffsetFetchResponsePartitions
_FetchTopic = FetchResponse.OffsetFetchResponseTopic
_FetchPartition = FetchResponse.OffsetFetchResponsePartition
DeleteResponse = messages.OffsetDeleteResponse
_DeleteTopic = DeleteResponse.OffsetDeleteResponseTopic
_DeletePartition = DeleteResponse.OffsetDeleteResponsePartition

ZERO_UUID = b"\x00" * 16


class ClassicGroupApis:
    def __init__(self, services: ClassicGroupServices):
        self.services = services
        self.coordinator: ClassicGroupCoordinator = services.classic_groups

    # ---- membership ----------------------------------------------------------------------------------

    async def join_group(self, ctx: RequestContext, req: messages.JoinGroupRequest) -> messages.JoinGroupResponse:
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return JoinResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, generation_id=-1,
                                member_id=req.member_id, leader="", members=[])
        version = ctx.api_version
        response = await self.coordinator.join_group(JoinRequest(
            group_id=req.group_id, member_id=req.member_id,
            group_instance_id=req.group_instance_id if version >= 5 else None,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms if version >= 1 else req.session_timeout_ms,
            protocol_type=req.protocol_type, protocols=[(p.name, bytes(p.metadata)) for p in req.protocols or ()],
            client_id=ctx.header.client_id or "", client_host="/" + ctx.connection.client_host, version=version,
        ))
        if version < 7 and response.protocol_name is None:
            response.protocol_name = ""  # nullable from v7 on; older versions carry an empty name
        return response

    async def sync_group(self, ctx: RequestContext, req: messages.SyncGroupRequest) -> messages.SyncGroupResponse:
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return SyncResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, assignment=b"")
        return await self.coordinator.sync_group(req, ctx.api_version)

    async def heartbeat(self, ctx: RequestContext, req: messages.HeartbeatRequest) -> messages.HeartbeatResponse:
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        instance_id = req.group_instance_id if ctx.api_version >= 3 else None
        code = await self.coordinator.heartbeat(req.group_id, req.member_id, req.generation_id, instance_id)
        return HeartbeatResponse(error_code=code)

    async def leave_group(self, ctx: RequestContext, req: messages.LeaveGroupRequest) -> messages.LeaveGroupResponse:
        version = ctx.api_version
        if version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in req.members or ()]
        else:
            leaving = [(req.member_id, None)]
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id):
            return LeaveResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, members=[])
        code, codes = await self.coordinator.leave_group(req.group_id, leaving)
        if version < 3:
            # One member, no per-member list: its error is the response's.
            return LeaveResponse(error_code=code if code != ErrorCode.NONE else (codes[0] if codes else code))
        if code != ErrorCode.NONE:
            return LeaveResponse(error_code=code, members=[])
        members = [_LeaveMember(member_id=mid, group_instance_id=iid, error_code=c)
                   for (mid, iid), c in zip(leaving, codes, strict=True)]
        return LeaveResponse(error_code=code, members=members)

    # ---- offsets -------------------------------------------------------------------------------------

    def _topic_name(self, version: int, t: _CommitRequestTopic) -> tuple[str | None, int, int]:
        """The request topic's name (v10 names topics by id), its partition count and the error when it
        cannot be used."""
        if version >= 10:
            topic = self.services.topics.get_by_id(t.topic_id)
            if topic is None:
                return None, 0, ErrorCode.UNKNOWN_TOPIC_ID
            return topic.name, len(topic.partitions), ErrorCode.NONE
        topic = self.services.topics.get(t.name)
        if topic is None:
            return t.name, 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return t.name, len(topic.partitions), ErrorCode.NONE

    async def offset_commit(self, ctx: RequestContext, req: messages.OffsetCommitRequest) -> messages.OffsetCommitResponse:
        version = ctx.api_version
        group_ok = ctx.authorize(Operation.READ, ResourceType.GROUP, req.group_id)
        early: dict[tuple[int, int], int] = {}
        to_commit: list[OffsetToCommit] = []
        where: list[tuple[int, int]] = []
        for ti, t in enumerate(req.topics or ()):
            name, partition_count, error = self._topic_name(version, t)
            if group_ok and error == ErrorCode.NONE and name is not None:
                if not ctx.authorize(Operation.READ, ResourceType.TOPIC, name):
                    error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            for pi, p in enumerate(t.partitions or ()):
                if not group_ok:
                    early[(ti, pi)] = ErrorCode.GROUP_AUTHORIZATION_FAILED
                elif error != ErrorCode.NONE or name is None:
                    early[(ti, pi)] = error
                elif not 0 <= p.partition_index < partition_count:
                    # Kafka checks each partition against the metadata before the group sees it.
                    early[(ti, pi)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    log.info("offset_commit of an unknown partition", group_id=req.group_id, topic=name,
                             partition=p.partition_index)
                else:
                    to_commit.append(OffsetToCommit(name, p.partition_index, p.committed_offset,
                                                    p.committed_leader_epoch if version >= 6 else -1,
                                                    p.committed_metadata))
                    where.append((ti, pi))
        codes: dict[tuple[int, int], int] = {}
        if group_ok and not req.group_id:
            codes = {w: ErrorCode.INVALID_GROUP_ID for w in where}
        elif to_commit:
            group_error, per = await self.services.group_coordinator.commit_offsets(
                req.group_id, req.member_id or "", req.group_instance_id if version >= 7 else None,
                req.generation_id_or_member_epoch, to_commit, version)
            codes = {w: (group_error if group_error != ErrorCode.NONE else c)
                     for w, c in zip(where, per or [group_error] * len(where), strict=True)}
        topics = []
        for ti, t in enumerate(req.topics or ()):
            parts = [_CommitPartition(partition_index=p.partition_index,
                                      error_code=early.get((ti, pi), codes.get((ti, pi), ErrorCode.NONE)))
                     for pi, p in enumerate(t.partitions or ())]
            topics.append(_CommitTopic(name=t.name, topic_id=t.topic_id if version >= 10 else ZERO_UUID,
                                       partitions=parts))
        return CommitResponse(topics=topics)

    def offset_fetch(self, ctx: RequestContext, req: messages.OffsetFetchRequest) -> messages.OffsetFetchResponse:
        version = ctx.api_version
        if version >= 8:
            return FetchResponse(groups=[
                self._fetch_group(ctx, g.group_id, g.topics, version,
                                  (g.member_id, g.member_epoch) if version >= 9 else (None, -1), req.require_stable)
                for g in req.groups])
        group = self._fetch_group(ctx, req.group_id, req.topics, version, (None, -1),
                                  version >= 7 and req.require_stable)
        topics = [_FetchTopic(name=t.name, partitions=[
            _FetchPartition(partition_index=p.partition_index, committed_offset=p.committed_offset,
                            committed_leader_epoch=p.committed_leader_epoch, metadata=p.metadata,
                            # v1 has no group-level error: it goes to every partition.
                            error_code=p.error_code if p.error_code or version >= 2 else group.error_code)
            for p in t.partitions]) for t in group.topics]
        return FetchResponse(topics=topics, error_code=group.error_code)

    def _fetch_group(self, ctx: RequestContext, group_id: str,
                     topics: list[_FetchRequestTopic] | list[_FetchRequestTopics] | None, version: int,
                     member: tuple[str | None, int], require_stable: bool) -> _FetchGroup:
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            return _FetchGroup(group_id=group_id, topics=[], error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        by_id = version >= 10
        wanted: list[tuple[str, list[int]]] | None = None
        refused: dict[str, int] = {}
        ids: dict[str, bytes] = {}
        if topics is not None:
            wanted = []
            for t in topics:
                name = t.name
                if by_id and isinstance(t, _FetchRequestTopics):  # v10 names topics by id; only v8+'s topic class has one
                    topic = self.services.topics.get_by_id(t.topic_id)
                    if topic is None:
                        refused[uuid_key(t.topic_id)] = ErrorCode.UNKNOWN_TOPIC_ID
                        ids[uuid_key(t.topic_id)] = t.topic_id
                        wanted.append((uuid_key(t.topic_id), list(t.partition_indexes)))
                        continue
                    name = topic.name
                if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
                    refused[name] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                wanted.append((name, list(t.partition_indexes)))
        offsets = self.services.group_coordinator
        error, rows = offsets.fetch_offsets(group_id, member[0], member[1], wanted)
        if error != ErrorCode.NONE:
            return _FetchGroup(group_id=group_id, topics=[], error_code=error)
        grouped: dict[str, list[_FetchPartitionV8]] = {}
        for name, partition, committed in rows:
            if topics is None and not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, name):
                continue  # all-topics fetch: what the caller may not see is left out
            code = refused.get(name, ErrorCode.NONE)
            if code == ErrorCode.NONE and require_stable and offsets.has_pending_offset(group_id, name, partition):
                # An open transaction holds an offset here: the caller retries until its marker is written.
                code = ErrorCode.UNSTABLE_OFFSET_COMMIT
            if committed is None or code != ErrorCode.NONE:
                row = _FetchPartitionV8(partition_index=partition, committed_offset=-1, committed_leader_epoch=-1,
                                        metadata="", error_code=code)
            else:
                row = _FetchPartitionV8(partition_index=partition, committed_offset=committed.offset,
                                        committed_leader_epoch=committed.leader_epoch, metadata=committed.metadata,
                                        error_code=ErrorCode.NONE)
            grouped.setdefault(name, []).append(row)
        out = []
        for name, parts in grouped.items():
            topic_id = ZERO_UUID
            if by_id:
                topic = self.services.topics.get(name)
                topic_id = ids.get(name) or (topic.topic_id if topic is not None else ZERO_UUID)
            out.append(_FetchTopicV8(name=name, topic_id=topic_id, partitions=parts))
        return _FetchGroup(group_id=group_id, topics=out, error_code=ErrorCode.NONE)

    async def offset_delete(self, ctx: RequestContext, req: messages.OffsetDeleteRequest) -> messages.OffsetDeleteResponse:
        if not ctx.authorize(Operation.DELETE, ResourceType.GROUP, req.group_id):
            return DeleteResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[])
        if not req.group_id:
            return DeleteResponse(error_code=ErrorCode.INVALID_GROUP_ID, topics=[])
        early: dict[tuple[str, int], int] = {}
        wanted: list[tuple[str, int]] = []
        for t in req.topics or ():
            if not ctx.authorize(Operation.READ, ResourceType.TOPIC, t.name):
                code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif self.services.topics.get(t.name) is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                code = ErrorCode.NONE
            for p in t.partitions or ():
                if code != ErrorCode.NONE:
                    early[(t.name, p.partition_index)] = code
                else:
                    wanted.append((t.name, p.partition_index))
        group_error, codes = await self.services.group_coordinator.delete_offsets(req.group_id, wanted)
        if group_error != ErrorCode.NONE:
            return DeleteResponse(error_code=group_error, topics=[])
        decided = dict(early) | dict(zip(wanted, codes, strict=True))
        topics = [_DeleteTopic(name=t.name, partitions=[
            _DeletePartition(partition_index=p.partition_index, error_code=decided[(t.name, p.partition_index)])
            for p in t.partitions or ()]) for t in req.topics or ()]
        return DeleteResponse(error_code=ErrorCode.NONE, topics=topics)


def uuid_key(topic_id: bytes) -> str:
    """A stand-in name for an unknown topic id, so its partitions still get an answer."""
    return topic_id.hex()


def register(table: ApiTable, services: ClassicGroupServices) -> ClassicGroupApis:
    h = ClassicGroupApis(services)
    table.register(ApiKey.JOIN_GROUP, 0, 9, h.join_group)
    table.register(ApiKey.SYNC_GROUP, 0, 5, h.sync_group)
    table.register(ApiKey.HEARTBEAT, 0, 4, h.heartbeat)
    table.register(ApiKey.LEAVE_GROUP, 0, 5, h.leave_group)
    table.register(ApiKey.OFFSET_COMMIT, 2, 10, h.offset_commit)
    table.register(ApiKey.OFFSET_FETCH, 1, 10, h.offset_fetch)
    table.register(ApiKey.OFFSET_DELETE, 0, 0, h.offset_delete)
    return h
