"""The share-partition manager: what ShareFetch and ShareAcknowledge do, below their handlers (Kafka's
SharePartitionManager).

It owns the share sessions of this broker, fans acknowledgements out to the share-partition leaders,
splits a fetch's byte budget between its partitions, runs the acquisition passes and the long poll,
and releases a member's records when its session closes or its connection goes.

Order within one ShareFetch, as in Kafka: the piggybacked acknowledgements are applied in memory first,
every partition at once; then the fetch acquires while their state writes are under way. An ACCEPT
therefore frees room under the in-flight limit for the very fetch that carries it, while a record it
releases stays out of reach until its write completes. The response waits for those writes; unless they
release records, one more acquisition pass then takes what was produced meanwhile (`_top_up`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

import structlog

from shoal.broker.common.purgatory import SHARE_SESSION_SLOT, LogKey, Purgatory, ShareFetchKey, WakeKey
from shoal.persister.persister import SharePartitionKey
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import HEADER_SIZE, BatchHeader, iter_batches, iter_packed_headers
from shoal.protocol.topic_id_partition import TopicIdPartition

from .share_partition import AckBatch, AcquiredRange, AcquireMode
from .share_partition_leader import PendingAcknowledgement, SharePartitionLeader, SharePartitionLeaders
from .share_session import FINAL_EPOCH, INITIAL_EPOCH, EpochAction, ShareSession, ShareSessionCache

if TYPE_CHECKING:
    from shoal.broker.common.share_metrics import ShareGroupMetrics

    from .group_configs import GroupConfigs
    from .share_topics import ShareTopicView

log = structlog.get_logger("shoal.share_partition_manager")

# Whether the requester may read the named topic (ACL READ on the topic).
TopicReadAuthorizer = Callable[[str], bool]


class ShareClient(Protocol):
    """The connection a share session is tied to: it ends the session when it closes."""

    @property
    def closed(self) -> bool: ...

    @property
    def wake_key(self) -> WakeKey: ...


@dataclass(frozen=True, slots=True)
class AckRules:
    """What a request's acknowledgements may hold: the highest acknowledge type of its version, and
    whether it is a renew-only request (RENEW allowed)."""

    max_type: int
    is_renew: bool


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    max_records: int
    batch_size: int
    mode: AcquireMode
    # Shoal's extension: each acquired batch's header alone instead of its records.
    headers_only: bool = False


@dataclass(slots=True)
class PartitionResult:
    error_code: int = ErrorCode.NONE
    acknowledge_error_code: int = ErrorCode.NONE
    records: bytes = b""  # whole batches, or their headers alone for a headers-only fetch
    acquired: list[AcquiredRange] = field(default_factory=list)


@dataclass(slots=True)
class ShareFetchResult:
    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    # In the order the response lists them.
    partitions: dict[TopicIdPartition, PartitionResult] = field(default_factory=dict)


@dataclass(slots=True)
class ShareAcknowledgeResult:
    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    partitions: dict[TopicIdPartition, int] = field(default_factory=dict)


def validate_ack_batches(batches: Sequence[AckBatch], rules: AckRules) -> bool:
    """Per-partition checks Kafka applies before touching state (failure => INVALID_REQUEST)."""
    prev_last: int | None = None
    for b in batches:
        if b.first_offset > b.last_offset:
            return False
        if prev_last is not None and b.first_offset < prev_last:
            return False
        types = b.ack_types
        if not types or (len(types) != 1 and len(types) != b.last_offset - b.first_offset + 1):
            return False
        for t in types:
            if t < 0 or t > rules.max_type or (t == AcknowledgeType.RENEW and not rules.is_renew):
                return False
        prev_last = b.last_offset
    return True


def count_ack_types(batches: Iterable[AckBatch]) -> dict[int, int]:
    """Records acknowledged per acknowledge type."""
    counted: dict[int, int] = {}
    for b in batches:
        if len(b.ack_types) == 1:
            counted[b.ack_types[0]] = counted.get(b.ack_types[0], 0) + b.last_offset - b.first_offset + 1
        else:
            for t in b.ack_types:
                counted[t] = counted.get(t, 0) + 1
    return counted


class _Ack(NamedTuple):
    """One partition's acknowledgement: `applied` once memory holds it (or it failed before), `done`
    with its error code once written."""

    tp: TopicIdPartition
    applied: asyncio.Future[None]
    done: asyncio.Future[int]


def _completed(code: int) -> tuple[asyncio.Future[None], asyncio.Future[int]]:
    loop = asyncio.get_running_loop()
    applied: asyncio.Future[None] = loop.create_future()
    applied.set_result(None)
    done: asyncio.Future[int] = loop.create_future()
    done.set_result(code)
    return applied, done


class SharePartitionManager:
    def __init__(self, *, topics: ShareTopicView, leaders: SharePartitionLeaders, purgatory: Purgatory,
                 group_configs: GroupConfigs, metrics: ShareGroupMetrics, max_sessions: int,
                 broker_max_bytes: int):
        self.topics = topics
        self.leaders = leaders
        self.purgatory = purgatory
        self.group_configs = group_configs
        self.metrics = metrics
        self.sessions = ShareSessionCache(max_sessions)
        self.broker_max_bytes = broker_max_bytes

    def lock_timeout_ms(self, group_id: str) -> int:
        return self.group_configs.get_int(group_id, "share.record.lock.duration.ms")

    # ---- ShareFetch -----------------------------------------------------------------------------

    async def fetch(self, client: ShareClient, authorize: TopicReadAuthorizer, group: str, member: str,
                    epoch: int, acks: dict[TopicIdPartition, list[AckBatch]], forgotten: Sequence[TopicIdPartition],
                    rules: AckRules, params: FetchParams) -> ShareFetchResult:
        """One ShareFetch: the session step, the acknowledgements of `acks` (every partition the request
        names is a key), then the acquisition unless the request asks for no records."""
        has_acks = any(acks.values())
        decision, found = self.sessions.enter(group, member, epoch, may_open=True, has_acks=has_acks)
        if decision.action is EpochAction.REJECT:
            return ShareFetchResult(decision.error_code, decision.error_message)
        if decision.action is EpochAction.OPEN:
            if self.sessions.is_full_for(group, member):
                await self.purgatory.wait([SHARE_SESSION_SLOT, client.wake_key], max(0, params.max_wait_ms) / 1000)
                if self.sessions.is_full_for(group, member):
                    return ShareFetchResult(ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            session, _old = self.sessions.open(group, member, client)
        else:
            assert found is not None
            session = found
        # Session membership changes: partitions named in Topics join, ForgottenTopicsData leave. A new
        # session is exactly the partitions named, so ForgottenTopicsData means nothing at epoch 0.
        new_partitions: set[TopicIdPartition] = set()
        if epoch != FINAL_EPOCH:
            for tp in acks:
                if session.add(tp):
                    new_partitions.add(tp)
            if epoch != INITIAL_EPOCH:
                for tp in forgotten:
                    session.forget(tp)
        if new_partitions and self.leaders.check_stored_state:
            await self._drop_changed_state(group, new_partitions)

        results: dict[TopicIdPartition, PartitionResult] = {}
        started = self._start_acknowledgements(authorize, group, member, acks, rules)
        for ack in started:
            results.setdefault(ack.tp, PartitionResult())
        # Memory holds every acknowledgement before this request acquires; their writes go on meanwhile,
        # each in its task. Awaited one by one and the acquisition run in this task, not through gather:
        # each relay through another future or task is one more pass of the event loop before the answer.
        for ack in started:
            await ack.applied

        if epoch == FINAL_EPOCH:
            await self._ack_codes(started, results)
            await self.close_session(session)
            return ShareFetchResult(partitions=results)

        if params.max_records > 0 and params.max_bytes > 0 and not rules.is_renew:
            # Which partitions get records while this request runs: those are worth a second pass once
            # the writes are done (`_top_up`), unless the acknowledgements release records.
            produced = {} if not has_acks or _releases_any(acks) else {
                tp: self.purgatory.watch([LogKey(tp.topic_id, tp.partition)]) for tp in session.partitions}
            try:
                await self._fetch_records(client, authorize, params, session, results)
                await self._ack_codes(started, results)
            finally:
                for watch in produced.values():
                    watch.close()
            grown = {tp for tp, watch in produced.items() if watch.notified}
            if grown and not client.closed:
                await self._top_up(client, authorize, params, session, results, grown)
        else:
            await self._ack_codes(started, results)
        extra = session.partitions.keys() if epoch == INITIAL_EPOCH else new_partitions
        for tp in [*extra, *session.take_resend()]:
            if tp in session.partitions:
                results.setdefault(tp, PartitionResult())
        session.resend.update(tp for tp, pd in results.items()
                              if pd.error_code != ErrorCode.NONE and tp in session.partitions)
        return ShareFetchResult(partitions=results)

    async def _drop_changed_state(self, group: str, partitions: Iterable[TopicIdPartition]) -> None:
        """Share partitions a session starts using (it opens with them, or they join it) that are in memory are
        checked against their stored state (KIP-932 checks when a partition's sessions go from none to one; a
        session of a member that its group coordinator, on another sidecar, has already expired may still be
        open here, so every session that starts using a partition checks). Offsets altered or deleted
        meanwhile make the leader load the stored state again."""
        leaders = [leader for tp in partitions
                   if (leader := self.leaders.get(SharePartitionKey(group, tp.topic_id, tp.partition))) is not None
                   and leader.state is not None]
        if leaders:
            await asyncio.gather(*(leader.drop_if_state_changed() for leader in leaders))

    async def withhold_records(self, group: str, member: str, result: ShareFetchResult,
                               acknowledged: Iterable[TopicIdPartition]) -> ShareFetchResult:
        """What a throttled ShareFetch answers (Kafka's throttleResponse): no records, only the outcomes of
        the acknowledgements it carried (the `acknowledged` partitions). What it acquired is given back as a
        RELEASE acknowledgement would, so the records are available again at once with the delivery
        counted; Kafka leaves them acquired until their lock expires, with the same count."""
        releases = []
        for tp, pr in result.partitions.items():
            leader = self.leaders.get(SharePartitionKey(group, tp.topic_id, tp.partition)) if pr.acquired else None
            if leader is not None:
                releases.append(leader.acknowledge(member, [
                    AckBatch(r.first_offset, r.last_offset, [AcknowledgeType.RELEASE]) for r in pr.acquired]))
        for code in await asyncio.gather(*releases):
            if code != ErrorCode.NONE:
                log.info("release of records withheld from a throttled fetch failed; they return when their "
                         "locks expire", group=group, member=member, error_code=code)
        return ShareFetchResult(partitions={
            tp: PartitionResult(acknowledge_error_code=result.partitions[tp].acknowledge_error_code)
            for tp in acknowledged if tp in result.partitions})

    async def _top_up(self, client: ShareClient, authorize: TopicReadAuthorizer, params: FetchParams,
                      session: ShareSession, results: dict[TopicIdPartition, PartitionResult],
                      grown: set[TopicIdPartition]) -> None:
        """One more acquisition pass over the `grown` partitions (records appended since the request came),
        without waiting, once the acknowledgements' state writes are done.

        The response cannot leave before those writes (their outcomes are in it, and a write is answered
        only once fsynced), so records produced during them go with it instead of a round trip later: for a
        consumer keeping up with its partitions that is most of the produce-to-delivery latency. Not done
        when the acknowledgements release records: those are available again once written, and the fetch
        that released them would get them straight back (the pass alongside the write never sees them, and
        in Kafka, whose fetch and acknowledgement also run side by side, neither does the fetch)."""
        taken = sum(r.last_offset - r.first_offset + 1 for pd in results.values() for r in pd.acquired)
        max_bytes = min(params.max_bytes, self.broker_max_bytes) - sum(len(pd.records) for pd in results.values())
        if taken >= params.max_records or max_bytes <= 0:
            return
        more: dict[TopicIdPartition, PartitionResult] = {}
        order = [tp for tp in _rotated(session) if tp in grown]
        await self._acquire_pass(client, authorize, replace(params, max_records=params.max_records - taken,
                                                            max_bytes=max_bytes), session, order, more)
        for tp, extra in more.items():
            if not extra.acquired:
                continue  # the first pass reported this partition; an error now waits for the next fetch
            pd = results.setdefault(tp, PartitionResult())
            pd.error_code = ErrorCode.NONE
            pd.records = join_batches(pd.records, extra.records, headers_only=params.headers_only)
            pd.acquired.extend(extra.acquired)

    @staticmethod
    async def _ack_codes(started: list[_Ack], results: dict[TopicIdPartition, PartitionResult]) -> None:
        """Each acknowledgement's outcome once written (the writes run side by side, in their own tasks)."""
        for ack in started:
            results[ack.tp].acknowledge_error_code = await ack.done

    async def _fetch_records(self, client: ShareClient, authorize: TopicReadAuthorizer, params: FetchParams,
                             session: ShareSession, results: dict[TopicIdPartition, PartitionResult]) -> None:
        try:
            await self._long_poll(client, authorize, params, session, results)
        finally:
            # KIP-1103 meters: once per fetched topic-partition of the request, failed if it got an error.
            for tp in session.partitions:
                pd = results.get(tp)
                self._count_fetch(tp.topic_id, failed=pd is not None and pd.error_code != ErrorCode.NONE)

    async def _long_poll(self, client: ShareClient, authorize: TopicReadAuthorizer, params: FetchParams,
                         session: ShareSession, results: dict[TopicIdPartition, PartitionResult]) -> None:
        """Long poll: acquire once MinBytes are there (or the wait is over), until something is acquired.

        Interest in every partition is registered before each look at them, so a produce or release
        that lands during the look wakes the wait instead of being missed.
        """
        deadline = time.monotonic() + max(0, params.max_wait_ms) / 1000
        while True:
            order = _rotated(session)
            # A closed connection stops the poll. An acquisition already waiting for its partition when the
            # connection closed is undone by the close's release, queued behind it on the partition's lock.
            keys = [key for tp in order for key in _wake_keys(session.group_id, tp)]
            with self.purgatory.watch([*keys, client.wake_key]) as watch:
                left = deadline - time.monotonic()
                if left > 0 and not await self._min_bytes_ready(authorize, session.group_id, order,
                                                                params.min_bytes):
                    if client.closed:
                        return
                    await watch.wait(left)
                    continue
                got_any, fetchable = await self._acquire_pass(client, authorize, params, session, order, results)
                left = deadline - time.monotonic()
                if got_any or left <= 0 or not fetchable or client.closed:
                    return
                await watch.wait(left)

    async def _min_bytes_ready(self, authorize: TopicReadAuthorizer, group_id: str,
                               order: list[TopicIdPartition], min_bytes: int) -> bool:
        """Whether the partitions hold at least MinBytes past their next fetch offsets (or an error to
        report). MinBytes of 1 or less is left to the acquisition itself."""
        if min_bytes <= 1:
            return True
        total = 0
        for tp in order:
            leader, _err = self._leader_for(authorize, group_id, tp)
            if leader is None:
                return True
            total += await leader.fetchable_bytes(min_bytes - total)
            if total >= min_bytes:
                return True
        return False

    async def _acquire_pass(self, client: ShareClient, authorize: TopicReadAuthorizer, params: FetchParams,
                            session: ShareSession, order: list[TopicIdPartition],
                            results: dict[TopicIdPartition, PartitionResult]) -> tuple[bool, bool]:
        """Acquire from each partition in turn, the byte budget split evenly between them (Kafka's uniform
        strategy); returns (anything acquired, any partition fetchable at all)."""
        batch_size = params.batch_size if params.batch_size > 0 else params.max_records
        leaders: list[tuple[TopicIdPartition, SharePartitionLeader]] = []
        for tp in order:
            leader, err = self._leader_for(authorize, session.group_id, tp)
            if leader is None:
                results.setdefault(tp, PartitionResult()).error_code = err
            else:
                leaders.append((tp, leader))
        if not leaders:
            return False, False
        # Share partitions not loaded yet load side by side, each under its own lock, rather than one after
        # another in the loop below: a new member's first fetch waits for the slowest load, not their sum.
        unloaded = [leader for _tp, leader in leaders if leader.state is None]
        if len(unloaded) > 1:
            await asyncio.gather(*(leader.load() for leader in unloaded), return_exceptions=True)
        per_partition_bytes = max(1, min(params.max_bytes, self.broker_max_bytes) // len(leaders))
        remaining_records = params.max_records
        got_any = False
        for tp, leader in leaders:
            if remaining_records <= 0 or client.closed:
                break
            acq = await leader.acquire(session.member_id, max_records=remaining_records, batch_size=batch_size,
                                       max_bytes=per_partition_bytes, mode=params.mode,
                                       headers_only=params.headers_only)
            if acq.error_code != ErrorCode.NONE:
                results.setdefault(tp, PartitionResult()).error_code = acq.error_code
                continue
            if tp in results:
                results[tp].error_code = ErrorCode.NONE  # an error of an earlier pass has cleared
            if not acq.acquired:
                continue
            got_any = True
            pd = results.setdefault(tp, PartitionResult())
            pd.records = acq.records
            pd.acquired = list(acq.acquired)
            remaining_records -= sum(r.last_offset - r.first_offset + 1 for r in acq.acquired)
        return got_any, True

    def _leader_for(self, authorize: TopicReadAuthorizer, group_id: str,
                    tp: TopicIdPartition) -> tuple[SharePartitionLeader | None, int]:
        topic = self.topics.topic_by_id(tp.topic_id)
        if topic is None:
            return None, ErrorCode.UNKNOWN_TOPIC_ID
        if not authorize(topic[0]):
            return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        source = self.topics.source(tp.topic_id, tp.partition)
        if source is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not self.leaders.leads(tp.topic_id, tp.partition):
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER  # another sidecar leads it: the client refreshes
        key = SharePartitionKey(group_id, tp.topic_id, tp.partition)
        return self.leaders.get_or_create(key, source), ErrorCode.NONE

    def _count_fetch(self, topic_id: bytes, *, failed: bool) -> None:
        topic = self.topics.topic_by_id(topic_id)
        name = topic[0] if topic is not None else "unknown"
        self.metrics.share_fetch_requests.labels(topic=name).inc()
        if failed:
            self.metrics.failed_share_fetch_requests.labels(topic=name).inc()

    # ---- acknowledgements -------------------------------------------------------------------------

    async def acknowledge(self, authorize: TopicReadAuthorizer, group: str, member: str, epoch: int,
                          acks: dict[TopicIdPartition, list[AckBatch]], rules: AckRules) -> ShareAcknowledgeResult:
        """One ShareAcknowledge: the session step, every partition's acknowledgements at once, and the
        close of the session at the final epoch."""
        decision, session = self.sessions.enter(group, member, epoch, may_open=False)
        if decision.action is EpochAction.REJECT or session is None:
            return ShareAcknowledgeResult(decision.error_code, decision.error_message)
        codes: dict[TopicIdPartition, int] = {}
        started = self._start_acknowledgements(authorize, group, member, acks, rules, with_empty=True)
        for ack, code in zip(started, await asyncio.gather(*(ack.done for ack in started)), strict=True):
            codes[ack.tp] = code
        if epoch == FINAL_EPOCH:
            await self.close_session(session)
        return ShareAcknowledgeResult(partitions=codes)

    def _start_acknowledgements(self, authorize: TopicReadAuthorizer, group: str, member: str,
                                acks: dict[TopicIdPartition, list[AckBatch]], rules: AckRules,
                                with_empty: bool = False) -> list[_Ack]:
        """Start every partition's acknowledgement at once (with `with_empty`, also the partitions that
        carry none: ShareAcknowledge answers for each one it names)."""
        return [self._start_acknowledgement(authorize, group, member, tp, batches, rules)
                for tp, batches in acks.items() if batches or with_empty]

    def _start_acknowledgement(self, authorize: TopicReadAuthorizer, group: str, member: str,
                               tp: TopicIdPartition, batches: list[AckBatch], rules: AckRules) -> _Ack:
        code = self._ack_check(authorize, tp, batches, rules)
        if code != ErrorCode.NONE or not batches:
            # Nothing to apply when no batches came, whether or not the share partition is loaded.
            return _Ack(tp, *_completed(code))
        if not self.leaders.leads(tp.topic_id, tp.partition):
            return _Ack(tp, *_completed(ErrorCode.NOT_LEADER_OR_FOLLOWER))
        leader = self.leaders.get(SharePartitionKey(group, tp.topic_id, tp.partition))
        if leader is None:
            return _Ack(tp, *_completed(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
        started: PendingAcknowledgement = leader.start_acknowledge(member, batches)
        topic = self.topics.topic_by_id(tp.topic_id)
        name = topic[0] if topic is not None else "unknown"
        return _Ack(tp, started.applied, asyncio.ensure_future(self._counted(name, batches, started.done)))

    def _ack_check(self, authorize: TopicReadAuthorizer, tp: TopicIdPartition, batches: list[AckBatch],
                   rules: AckRules) -> int:
        if not validate_ack_batches(batches, rules):
            return ErrorCode.INVALID_REQUEST
        topic = self.topics.topic_by_id(tp.topic_id)
        if topic is None:
            return ErrorCode.UNKNOWN_TOPIC_ID
        if not authorize(topic[0]):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if not 0 <= tp.partition < topic[1]:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NONE

    async def _counted(self, topic_name: str, batches: list[AckBatch], done: asyncio.Future[int]) -> int:
        code = await done
        self.metrics.record_share_acknowledgement(topic_name, failed=code != ErrorCode.NONE)
        if code == ErrorCode.NONE:
            self.metrics.record_acknowledgement(count_ack_types(batches))
        return code

    # ---- sessions ---------------------------------------------------------------------------------

    async def close_session(self, session: ShareSession) -> None:
        if self.sessions.remove(session):
            self.purgatory.notify(SHARE_SESSION_SLOT)
        await self._release_member(session.group_id, session.member_id)

    def _release_member(self, group: str, member: str) -> asyncio.Future[list[None]]:
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

    def on_connection_closed(self, client: object) -> None:
        """A connection went: its share sessions end and their members' records are released."""
        closed = self.sessions.sessions_of(client)
        if not closed:
            return
        for session in closed:
            self.sessions.remove(session)
            log.info("share session closed with its connection", group=session.group_id, member=session.member_id)
        self.purgatory.notify(SHARE_SESSION_SLOT)
        for session in closed:
            self._release_member(session.group_id, session.member_id)


def _rotated(session: ShareSession) -> list[TopicIdPartition]:
    """The session's partitions, the first one rotated by epoch so one busy partition cannot starve the others."""
    order = list(session.partitions)
    if order:
        shift = session.expected_epoch % len(order)
        order = order[shift:] + order[:shift]
    return order


def _releases_any(acks: dict[TopicIdPartition, list[AckBatch]]) -> bool:
    return any(AcknowledgeType.RELEASE in b.ack_types for batches in acks.values() for b in batches)


def _batches(buf: bytes, headers_only: bool) -> Iterator[tuple[int, BatchHeader]]:
    """(byte position, header) of each batch of an acquisition's records, or of its packed headers."""
    if headers_only:
        for i, header in enumerate(iter_packed_headers(buf)):
            yield i * HEADER_SIZE, header
    else:
        yield from iter_batches(buf)


def join_batches(first: bytes, more: bytes, *, headers_only: bool = False) -> bytes:
    """The batches of `first`, then those of `more` past them: a pass that stopped inside a batch (at the
    in-flight limit) hands that whole batch out again with the next pass's records."""
    if not first:
        return more
    last_base = -1
    for _pos, header in _batches(first, headers_only):
        last_base = header.base_offset
    for pos, header in _batches(more, headers_only):
        if header.base_offset > last_base:
            return first + more[pos:]
    return first


def _wake_keys(group_id: str, tp: TopicIdPartition) -> tuple[WakeKey, ...]:
    """Purgatory keys of a share partition: its log (produce) and its share state (release, expiry)."""
    return LogKey(tp.topic_id, tp.partition), ShareFetchKey(group_id, tp.topic_id, tp.partition)
