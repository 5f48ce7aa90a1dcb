"""ShareFetch and ShareAcknowledge: share sessions, piggybacked acknowledgements, acquisition, long polls."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

from shoal.broker.common.purgatory import SHARE_SESSION_SLOT, LogKey, ShareFetchKey, WakeKey
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.share.share_partition import AckBatch, AcquireMode
from shoal.broker.share.share_partition_leader import SharePartitionLeader
from shoal.broker.share.share_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    EpochAction,
    ShareSession,
    ShareSessionCache,
)
from shoal.persister.persister import SharePartitionKey
from shoal.protocol import messages
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.topic_id_partition import TopicIdPartition
from shoal.protocol.uuids import MAX_MEMBER_ID_LENGTH

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, ShareFetchServices
    from shoal.broker.network.connection import KafkaConnection, RequestContext

log = structlog.get_logger("shoal.share_fetch")


SfResponse = messages.ShareFetchResponse
SfTopic = SfResponse.ShareFetchableTopicResponse
SfPartition = SfResponse.PartitionData
SfAcquired = SfResponse.AcquiredRecords
SfLeader = SfResponse.LeaderIdAndEpoch
SaResponse = messages.ShareAcknowledgeResponse
SaTopic = SaResponse.ShareAcknowledgeTopicResponse
SaPartition = SaResponse.PartitionData
SaLeader = SaResponse.LeaderIdAndEpoch


def validate_ack_batches(batches: list[Any], version: int, is_renew: bool) -> bool:
    """Per-partition checks Kafka applies before touching state (failure => INVALID_REQUEST)."""
    prev_last: int | None = None
    max_type = 4 if version >= 2 else 3
    for b in batches:
        if b.first_offset > b.last_offset:
            return False
        if prev_last is not None and b.first_offset < prev_last:
            return False
        types = b.acknowledge_types
        if not types or (len(types) != 1 and len(types) != b.last_offset - b.first_offset + 1):
            return False
        for t in types:
            if t < 0 or t > max_type or (t == AcknowledgeType.RENEW and not is_renew):
                return False
        prev_last = b.last_offset
    return True


class ShareFetchHandlers:
    def __init__(self, services: ShareFetchServices):
        self.services = services
        self.sessions = ShareSessionCache(int(services.config["group.share.max.share.sessions"]))
        self.broker_max_bytes = int(services.config["fetch.max.bytes"])
        self.enabled = bool(services.config["group.share.enable"])
        services.connection_listeners.append(self._on_connection_closed)
        self.ack_counts: dict[int, int] = {}

    @property
    def leaders(self) -> Any:
        return self.services.share_partitions

    def _lock_timeout(self, group_id: str) -> int:
        return self.services.group_configs.get_int(group_id, "share.record.lock.duration.ms")

    # ---- ShareFetch -----------------------------------------------------------------------------

    async def share_fetch(self, ctx: RequestContext, req: messages.ShareFetchRequest) -> messages.ShareFetchResponse:
        version = ctx.api_version
        code, message, ids = self._admit(ctx, req.group_id, req.member_id)
        if ids is None:
            return SfResponse(error_code=code, error_message=message)
        group, member = ids
        is_renew = version >= 2 and req.is_renew_ack
        if is_renew and (req.max_bytes or req.min_bytes or req.max_records or req.max_wait_ms):
            return SfResponse(error_code=ErrorCode.INVALID_REQUEST,
                              error_message="a renew-only ShareFetch must not ask for records")
        epoch = req.share_session_epoch
        entries = _last_entries(req.topics)
        has_acks = any(p.acknowledgement_batches for p in entries.values())
        new_partitions: set[TopicIdPartition] = set()
        decision, found = self.sessions.enter(group, member, epoch, may_open=True, has_acks=has_acks)
        if decision.action is EpochAction.REJECT:
            return SfResponse(error_code=decision.error_code, error_message=decision.error_message)
        if decision.action is EpochAction.OPEN:
            if self.sessions.is_full_for(group, member):
                await self.services.purgatory.wait([SHARE_SESSION_SLOT, ctx.connection.wake_key],
                                                 max(0, req.max_wait_ms) / 1000)
                if self.sessions.is_full_for(group, member):
                    return SfResponse(error_code=ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            session, _old = self.sessions.open(group, member, ctx.connection)
        else:
            assert found is not None
            session = found
        # Session membership changes: partitions named in Topics join, ForgottenTopicsData leave. A new
        # session is exactly the partitions named, so ForgottenTopicsData means nothing at epoch 0.
        if epoch != FINAL_EPOCH:
            for tp in entries:
                if session.add(tp):
                    new_partitions.add(tp)
            if epoch != INITIAL_EPOCH:
                for ft in req.forgotten_topics_data:
                    for index in ft.partitions:
                        session.forget(TopicIdPartition(ft.topic_id, index))

        # Acknowledgements start first, every partition at once, and the fetch runs alongside their
        # writes (as Kafka): a record released here is in a state transition until its write completes,
        # so this very fetch does not hand it straight back.
        results: dict[TopicIdPartition, Any] = {}
        acks = self._start_acknowledgements(ctx, group, member, entries, version, is_renew, results)

        if epoch == FINAL_EPOCH:
            await asyncio.gather(*acks)
            await self._close_session(session)
            return self._fetch_response(group, results)

        wants_records = req.max_records > 0 and req.max_bytes > 0 and not is_renew
        if wants_records:
            await asyncio.gather(*acks, self._fetch_records(ctx, req, session, results))
        else:
            await asyncio.gather(*acks)
        extra = session.partitions.keys() if epoch == INITIAL_EPOCH else new_partitions
        for tp in [*extra, *session.take_resend()]:
            if tp in session.partitions:
                results.setdefault(tp, self._empty_partition(tp[1]))
        session.resend.update(tp for tp, pd in results.items()
                              if pd.error_code != ErrorCode.NONE and tp in session.partitions)
        return self._fetch_response(group, results)

    def _start_acknowledgements(self, ctx: RequestContext, group: str, member: str,
                                entries: dict[TopicIdPartition, Any], version: int, is_renew: bool,
                                results: dict[TopicIdPartition, Any]) -> list[asyncio.Future[None]]:
        """One task per partition with acknowledgements; each records its code in `results`. Tasks run in
        creation order, so each applies its acknowledgement before a fetch started after them acquires."""
        async def one(tp: TopicIdPartition, batches: list[Any]) -> None:
            code = await self._acknowledge(ctx, group, member, tp[0], tp[1], batches, version, is_renew)
            results[tp].acknowledge_error_code = code

        tasks: list[asyncio.Future[None]] = []
        for tp, p in entries.items():
            if p.acknowledgement_batches:
                results.setdefault(tp, self._empty_partition(tp[1]))
                tasks.append(asyncio.ensure_future(one(tp, p.acknowledgement_batches)))
        return tasks

    async def _fetch_records(self, ctx: RequestContext, req: messages.ShareFetchRequest, session: ShareSession,
                             results: dict[TopicIdPartition, Any]) -> None:
        try:
            await self._long_poll(ctx, req, session, results)
        finally:
            # KIP-1103 meters: once per fetched topic-partition of the request, failed if it got an error.
            for tp in session.partitions:
                pd = results.get(tp)
                self._count_fetch(tp.topic_id, failed=pd is not None and pd.error_code != ErrorCode.NONE)

    async def _long_poll(self, ctx: RequestContext, req: messages.ShareFetchRequest, session: ShareSession,
                         results: dict[TopicIdPartition, Any]) -> None:
        """Long poll: acquire once MinBytes are there (or the wait is over), until something is acquired.

        Interest in every partition is registered before each look at them, so a produce or release
        that lands during the look wakes the wait instead of being missed.
        """
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        while True:
            # Rotate the starting partition by epoch so one busy partition cannot starve the others.
            order = list(session.partitions)
            if order:
                shift = session.expected_epoch % len(order)
                order = order[shift:] + order[:shift]
            # A closed connection stops the poll. An acquisition already waiting for its partition when the
            # connection closed is undone by the close's release, queued behind it on the partition's lock.
            keys = [key for tp in order for key in _wake_keys(session.group_id, tp)]
            with self.services.purgatory.watch([*keys, ctx.connection.wake_key]) as watch:
                left = deadline - time.monotonic()
                if left > 0 and not await self._min_bytes_ready(ctx, session.group_id, order, req.min_bytes):
                    if ctx.connection.closed:
                        return
                    await watch.wait(left)
                    continue
                got_any, fetchable = await self._acquire_pass(ctx, req, session, order, results)
                left = deadline - time.monotonic()
                if got_any or left <= 0 or not fetchable or ctx.connection.closed:
                    return
                await watch.wait(left)

    async def _min_bytes_ready(self, ctx: RequestContext, group_id: str, order: list[TopicIdPartition],
                               min_bytes: int) -> bool:
        """Whether the partitions hold at least MinBytes past their next fetch offsets (or an error to
        report). MinBytes of 1 or less is left to the acquisition itself."""
        if min_bytes <= 1:
            return True
        total = 0
        for topic_id, index in order:
            leader, _err = self._leader_for(ctx, group_id, topic_id, index)
            if leader is None:
                return True
            total += await leader.fetchable_bytes(min_bytes - total)
            if total >= min_bytes:
                return True
        return False

    async def _acquire_pass(self, ctx: RequestContext, req: messages.ShareFetchRequest, session: ShareSession,
                            order: list[TopicIdPartition], results: dict[TopicIdPartition, Any]) -> tuple[bool, bool]:
        """Acquire from each partition in turn, the byte budget split evenly between them (Kafka's uniform
        strategy); returns (anything acquired, any partition fetchable at all)."""
        version = ctx.api_version
        mode = AcquireMode(req.share_acquire_mode) if version >= 2 and req.share_acquire_mode in (0, 1) \
            else AcquireMode.BATCH_OPTIMIZED
        batch_size = req.batch_size if req.batch_size > 0 else req.max_records
        leaders: list[tuple[TopicIdPartition, SharePartitionLeader]] = []
        for tp in order:
            leader, err = self._leader_for(ctx, session.group_id, *tp)
            if leader is None:
                results.setdefault(tp, self._empty_partition(tp[1])).error_code = err
            else:
                leaders.append((tp, leader))
        if not leaders:
            return False, False
        per_partition_bytes = max(1, min(req.max_bytes, self.broker_max_bytes) // len(leaders))
        remaining_records = req.max_records
        got_any = False
        for tp, leader in leaders:
            if remaining_records <= 0 or ctx.connection.closed:
                break
            acq = await leader.acquire(session.member_id, max_records=remaining_records, batch_size=batch_size,
                                       max_bytes=per_partition_bytes, mode=mode, headers_only=req.shoal_headers_only)
            if acq.error_code != ErrorCode.NONE:
                results.setdefault(tp, self._empty_partition(tp[1])).error_code = acq.error_code
                continue
            if tp in results:
                results[tp].error_code = ErrorCode.NONE  # an error of an earlier pass has cleared
            if not acq.acquired:
                continue
            got_any = True
            pd = results.setdefault(tp, self._empty_partition(tp[1]))
            if req.shoal_headers_only:
                pd.shoal_batch_headers = acq.records
            else:
                pd.records = acq.records
            pd.acquired_records = [SfAcquired(first_offset=r.first_offset, last_offset=r.last_offset,
                                              delivery_count=r.delivery_count) for r in acq.acquired]
            remaining_records -= sum(r.last_offset - r.first_offset + 1 for r in acq.acquired)
        return got_any, True

    def _leader_for(self, ctx: RequestContext, group_id: str, topic_id: bytes,
                    index: int) -> tuple[SharePartitionLeader | None, int]:
        topic = self.services.topics.get_by_id(topic_id)
        if topic is None:
            return None, ErrorCode.UNKNOWN_TOPIC_ID
        if not ctx.authorize(Operation.READ, ResourceType.TOPIC, topic.name):
            return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if not 0 <= index < len(topic.partitions):
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        key = SharePartitionKey(group_id, topic_id, index)
        return self.leaders.get_or_create(key, topic.partitions[index]), ErrorCode.NONE

    async def _acknowledge(self, ctx: RequestContext, group: str, member: str, topic_id: bytes, index: int,
                           batches: list[Any], version: int, is_renew: bool) -> int:
        if not validate_ack_batches(batches, version, is_renew):
            return ErrorCode.INVALID_REQUEST
        topic = self.services.topics.get_by_id(topic_id)
        if topic is None:
            return ErrorCode.UNKNOWN_TOPIC_ID
        if not ctx.authorize(Operation.READ, ResourceType.TOPIC, topic.name):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if not 0 <= index < len(topic.partitions):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not batches:
            return ErrorCode.NONE  # nothing to apply, whether or not the share partition is loaded
        leader = self.leaders.get(SharePartitionKey(group, topic_id, index))
        if leader is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        code = await leader.acknowledge(
            member, [AckBatch(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in batches]
        )
        self.services.metrics.share.record_share_acknowledgement(topic.name, failed=code != ErrorCode.NONE)
        if code == ErrorCode.NONE:
            counted: dict[int, int] = {}
            for b in batches:
                span = b.last_offset - b.first_offset + 1
                if len(b.acknowledge_types) == 1:
                    counted[b.acknowledge_types[0]] = counted.get(b.acknowledge_types[0], 0) + span
                else:
                    for t in b.acknowledge_types:
                        counted[t] = counted.get(t, 0) + 1
            for t, n in counted.items():
                self.ack_counts[t] = self.ack_counts.get(t, 0) + n
            self.services.metrics.share.record_acknowledgement(counted)
        return code

    def _count_fetch(self, topic_id: bytes, *, failed: bool) -> None:
        topic = self.services.topics.get_by_id(topic_id)
        name = topic.name if topic is not None else "unknown"
        share = self.services.metrics.share
        share.share_fetch_requests.labels(topic=name).inc()
        if failed:
            share.failed_share_fetch_requests.labels(topic=name).inc()

    def _empty_partition(self, index: int) -> Any:
        return SfPartition(
            partition_index=index,
            error_code=ErrorCode.NONE,
            acknowledge_error_code=ErrorCode.NONE,
            current_leader=SfLeader(leader_id=self.services.node_id, leader_epoch=0),
            records=b"",
            acquired_records=[],
        )

    def _fetch_response(self, group: str, results: dict[TopicIdPartition, Any]) -> Any:
        by_topic: dict[bytes, list[Any]] = {}
        for (topic_id, _index), pd in results.items():
            by_topic.setdefault(topic_id, []).append(pd)
        return SfResponse(
            error_code=ErrorCode.NONE,
            acquisition_lock_timeout_ms=self._lock_timeout(group),
            responses=[SfTopic(topic_id=tid, partitions=parts) for tid, parts in by_topic.items()],
            node_endpoints=[],
        )

    # ---- ShareAcknowledge -----------------------------------------------------------------------

    async def share_acknowledge(
        self, ctx: RequestContext, req: messages.ShareAcknowledgeRequest
    ) -> messages.ShareAcknowledgeResponse:
        version = ctx.api_version
        code, message, ids = self._admit(ctx, req.group_id, req.member_id)
        if ids is None:
            return SaResponse(error_code=code, error_message=message)
        group, member = ids
        epoch = req.share_session_epoch
        decision, session = self.sessions.enter(group, member, epoch, may_open=False)
        if decision.action is EpochAction.REJECT or session is None:
            return SaResponse(error_code=decision.error_code, error_message=decision.error_message)
        is_renew = version >= 2 and req.is_renew_ack
        entries = _last_entries(req.topics)
        codes = await asyncio.gather(*(
            self._acknowledge(ctx, group, member, tid, index, p.acknowledgement_batches, version,
                              is_renew)
            for (tid, index), p in entries.items()
        ))
        by_topic: dict[bytes, list[Any]] = {}
        for (tid, index), err in zip(entries, codes, strict=True):
            by_topic.setdefault(tid, []).append(SaPartition(
                partition_index=index, error_code=err,
                current_leader=SaLeader(leader_id=self.services.node_id, leader_epoch=0)))
        topics = [SaTopic(topic_id=tid, partitions=parts) for tid, parts in by_topic.items()]
        if epoch == FINAL_EPOCH:
            await self._close_session(session)
        return SaResponse(error_code=ErrorCode.NONE, acquisition_lock_timeout_ms=self._lock_timeout(group),
                          responses=topics, node_endpoints=[])

    # ---- sessions ---------------------------------------------------------------------------------

    def _admit(self, ctx: RequestContext, group_id: str | None,
               member_id: str | None) -> tuple[int, str | None, tuple[str, str] | None]:
        """(NONE, None, (group id, member id)) for a well-formed, authorized request while share groups
        are enabled, else the error code and message to answer with."""
        if not self.enabled:
            return ErrorCode.UNSUPPORTED_VERSION, "share groups are disabled", None
        if not group_id:
            return ErrorCode.INVALID_REQUEST, "GroupId must be set", None
        if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
            return ErrorCode.INVALID_REQUEST, "MemberId must be 1 to 36 characters", None
        if not ctx.authorize(Operation.READ, ResourceType.GROUP, group_id):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, None, None
        return ErrorCode.NONE, None, (group_id, member_id)

    async def _close_session(self, session: ShareSession) -> None:
        if self.sessions.remove(session):
            self.services.purgatory.notify(SHARE_SESSION_SLOT)
        await self._release_member(session.group_id, session.member_id)

    def _release_member(self, group: str, member: str) -> asyncio.Future[Any]:
        """Release by member id: the member's records on every share partition of the group, all at once.
        Every release starts before this returns and runs to completion even if no one awaits it."""
        releases = asyncio.gather(*(leader.release_member(member) for leader in self.leaders.of_group(group)))
        releases.add_done_callback(lambda _done: self._forget_idle_group(group))
        return releases

    def _forget_idle_group(self, group: str) -> None:
        """Once no session of the group is left on this broker, forget its share partitions: their state
        is durable and is loaded again on next use, so memory does not grow with idle groups."""
        if not self.sessions.has_group(group):
            self.leaders.drop_idle_group(group)

    def _on_connection_closed(self, conn: KafkaConnection) -> None:
        closed = self.sessions.sessions_of(conn)
        if not closed:
            return
        for session in closed:
            self.sessions.remove(session)
            log.info("share session closed with its connection", group=session.group_id, member=session.member_id)
        self.services.purgatory.notify(SHARE_SESSION_SLOT)
        for session in closed:
            self._release_member(session.group_id, session.member_id)


def _last_entries(topics: list[Any]) -> dict[TopicIdPartition, Any]:
    """The request's partitions; one named twice counts once, with its last entry (as Kafka's maps)."""
    return {TopicIdPartition(t.topic_id, p.partition_index): p for t in topics for p in t.partitions}


def _wake_keys(group_id: str, tp: TopicIdPartition) -> tuple[WakeKey, ...]:
    """Purgatory keys of a share partition: its log (produce) and its share state (release, expiry)."""
    return LogKey(tp.topic_id, tp.partition), ShareFetchKey(group_id, tp.topic_id, tp.partition)


def register(table: ApiTable, services: ShareFetchServices) -> ShareFetchHandlers:
    h = ShareFetchHandlers(services)
    table.register(ApiKey.SHARE_FETCH, 1, 2, h.share_fetch)
    table.register(ApiKey.SHARE_ACKNOWLEDGE, 1, 2, h.share_acknowledge)
    return h
