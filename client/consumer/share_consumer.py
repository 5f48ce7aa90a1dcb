"""The bundled share consumer (KIP-932): share-group membership, share sessions per broker, acquired
records, and acknowledgements (implicit or explicit).

`AsyncShareConsumer` is the asyncio client; `ShareConsumer` runs one on a background event-loop thread so
it can be built and used from plain threads (e.g. inside a Spark executor).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.client.cluster import Cluster
from shoal.client.connection import BrokerConnection
from shoal.client.errors import (
    ClientClosedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    UnsupportedVersionError,
    for_code,
)
from shoal.client.loop_thread import LoopThread
from shoal.client.metrics import Sensor
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import BatchHeader, InvalidRecordBatch, iter_packed_headers
from shoal.protocol.records import iter_complete_batches, iter_decoded_batches
from shoal.protocol.topic_id_partition import TopicIdPartition
from shoal.protocol.uuids import MAX_MEMBER_ID_LENGTH, uuid_to_str

log = logging.getLogger("shoal.client.consumer.share_consumer")

HEARTBEAT_VERSIONS = (1, 1)
SHARE_FETCH_VERSIONS = (1, 2)
SHARE_ACK_VERSIONS = (1, 2)
LEAVE_EPOCH = -1
CLOSE_SESSION_EPOCH = -1
_SESSION_ERRORS = (ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH)
_METADATA_ERRORS = (
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_TOPIC_ID,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.LEADER_NOT_AVAILABLE,
)
# Heartbeat errors after which the member simply tries again (after finding the coordinator anew).
_COORDINATOR_ERRORS = (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE)
# ShareAcquireMode (ShareFetch v2+): the broker acquires strictly at most MaxRecords, splitting log batches.
ACQUIRE_MODE_RECORD_LIMIT = 1
AckResults = dict[tuple[str, int], KafkaError | None]
AckCallback = Callable[[AckResults], None]


AckTypeArg = AcknowledgeType | int | str


@dataclass(frozen=True, slots=True)
class ShareRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    delivery_count: int


@dataclass(frozen=True, slots=True)
class AcquiredRange:
    """Offsets first..last of one partition, acquired for this member with one delivery count, as a
    header-only consumer hands them out: the records are not decoded (they may be read later by offset).
    `size` estimates their bytes in the log from the batches they lie in. Offsets of control batches are
    never part of a range (the consumer acknowledges them as GAP itself); offsets a compacted batch lacks
    may be."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    delivery_count: int
    size: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


def new_member_id() -> str:
    """A random Kafka Uuid rendered as Kafka does: 22 characters of URL-safe base64 without padding."""
    return uuid_to_str(uuid.uuid4().bytes)


@dataclass(slots=True)
class _ShareSession:
    """This member's share session with one broker: the epoch to send next and the partitions it holds."""

    node_id: int
    epoch: int = 0
    partitions: set[TopicIdPartition] = field(default_factory=set)
    connection: BrokerConnection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def advance(self) -> None:
        # After Integer.MAX_VALUE the broker expects 1 again; 0 would open a new session.
        self.epoch = 1 if self.epoch >= 0x7FFFFFFF else self.epoch + 1

    def reset(self) -> None:
        self.epoch = 0
        self.partitions = set()
        self.connection = None


def ack_batches(acks: Mapping[int, int], batch_cls: Any) -> list[Any]:
    """Runs of consecutive offsets with the same type become one AcknowledgementBatch with a single type."""
    out: list[Any] = []
    first = last = kind = None
    for offset in sorted(acks):
        t = acks[offset]
        if first is not None and last is not None and offset == last + 1 and t == kind:
            last = offset
            continue
        if first is not None:
            out.append(batch_cls(first_offset=first, last_offset=last, acknowledge_types=[kind]))
        first = last = offset
        kind = t
    if first is not None:
        out.append(batch_cls(first_offset=first, last_offset=last, acknowledge_types=[kind]))
    return out


class AsyncShareConsumer:
    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        group_id: str,
        *,
        acknowledgement_mode: str = "implicit",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 52_428_800,
        client_id: str | None = None,
        rack_id: str | None = None,
        request_timeout_ms: int | None = None,  # default: request.timeout.ms of `config`, else 30 s
        config: Mapping[str, Any] | None = None,
        member_id: str | None = None,
        header_only: bool = False,
    ):
        """`member_id`: reuse the id of an earlier incarnation of this member (e.g. a restarted job) so
        that rejoining takes over its assignment at once instead of waiting for its session to expire.
        Two live consumers must never share one. Default: a fresh random id.

        `header_only`: acquire without the records; read the acquisitions with poll_ranges() and settle
        them with acknowledge_range() (explicit mode only). A Shoal broker then sends batch headers alone;
        any other broker sends the records as usual, and only their batch headers are read."""
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError("acknowledgement_mode must be 'implicit' or 'explicit'")
        if not group_id:
            raise ValueError("group_id is required")
        if header_only and acknowledgement_mode != "explicit":
            raise ValueError("header_only needs acknowledgement_mode='explicit'")
        if member_id is not None and not 0 < len(member_id) <= MAX_MEMBER_ID_LENGTH:
            raise ValueError(f"member_id must be 1 to {MAX_MEMBER_ID_LENGTH} characters")
        self.group_id = group_id
        self.explicit = acknowledgement_mode == "explicit"
        self.max_poll_records = max_poll_records
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.rack_id = rack_id
        self.config = ClientConfig.from_dict(config, client_id=client_id, request_timeout_ms=request_timeout_ms)
        self.cluster = Cluster(bootstrap_servers, self.config)
        self.member_id = member_id or new_member_id()
        self.member_epoch = 0
        self._subscription: list[str] = []
        self._subscription_sent: list[str] | None = None
        self._assignment: set[TopicIdPartition] = set()
        self._assignment_changed = asyncio.Event()
        self._coordinator: int | None = None
        self._heartbeat_interval_s = 5.0
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._heartbeat_wakeup = asyncio.Event()
        self._sessions: dict[int, _ShareSession] = {}
        # Acknowledgements waiting to be sent, by the broker whose session acquired the records.
        self._pending_acks: dict[int, dict[TopicIdPartition, dict[int, int]]] = {}
        self._pending_renews: dict[int, dict[TopicIdPartition, dict[int, int]]] = {}
        # The sync facade queues acknowledgements from the caller's thread while the loop may be taking them.
        self._ack_lock = threading.Lock()
        self._topic_ids: dict[str, bytes] = {}
        # Fetched, not yet handed out: (record, node, monotonic time its acquisition lock runs out).
        self._buffer: deque[tuple[ShareRecord, int, float]] = deque()
        self._budget_rotation = 0
        self._delivered: dict[tuple[str, int, int], int] = {}  # record key -> node
        self.header_only = header_only
        # Header-only mode: acquired ranges not handed out yet, and handed-out ones by (topic, partition,
        # first offset) -> (last offset, node).
        self._ranges: deque[tuple[AcquiredRange, int, float]] = deque()
        self._delivered_ranges: dict[tuple[str, int, int], tuple[int, int]] = {}
        self._renewed: dict[tuple[str, int, int], int] = {}
        self._ack_callback: AckCallback | None = None
        self._fatal: KafkaError | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._last_poll_start: float | None = None
        self._last_poll_end: float | None = None
        self._last_heartbeat: float | None = None
        self._sensors = {
            name: Sensor()
            for name in (
                "time-between-poll",
                "poll-idle-ratio",
                "heartbeat",
                "heartbeat-response-time",
                "rebalance",
                "fetch-latency",
                "fetch-size",
                "records-per-request",
                "records-fetched",
                "acknowledgements-send",
                "acknowledgements-error",
                "fetch-throttle-time",
            )
        }

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._closed:
                raise ClientClosedError()
            if not self._started:
                await self.cluster.start()
                self._started = True

    async def __aenter__(self) -> AsyncShareConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_acknowledgement_commit_callback(self, callback: AckCallback | None) -> None:
        """Called (on the event loop) with each batch of acknowledgement results the brokers return."""
        self._ack_callback = callback

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Replace the subscription; an empty list is unsubscribe()."""
        self._check_usable()
        topics = sorted(set(topics))
        if not topics:
            await self.unsubscribe()
            return
        await self.start()
        self._subscription = topics
        self._heartbeat_wakeup.set()
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def subscription(self) -> list[str]:
        return list(self._subscription)

    def assignment(self) -> set[tuple[str, int]]:
        out = set()
        for tid, p in self._assignment:
            name = self.cluster.topic_names.get(tid)
            if name is not None:
                out.add((name, p))
        return out

    async def unsubscribe(self) -> None:
        self._subscription = []
        await self._stop_heartbeats(leave=True)
        self._set_assignment(set())

    # ---- membership --------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        delay = self.config.reconnect_backoff_ms / 1000
        while self._subscription and not self._closed:
            self._heartbeat_wakeup.clear()
            try:
                await self._heartbeat()
                wait = self._heartbeat_interval_s
                delay = self.config.reconnect_backoff_ms / 1000
            except asyncio.CancelledError:
                raise
            except KafkaError as exc:
                if not self._recoverable_heartbeat_error(exc):
                    log.error("share group %s: fatal heartbeat error %s", self.group_id, exc)
                    self._fatal = exc
                    self._assignment_changed.set()
                    return
                wait = delay
                delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._heartbeat_wakeup.wait(), wait)

    def _recoverable_heartbeat_error(self, exc: KafkaError) -> bool:
        if isinstance(exc, KafkaConnectionError) or exc.code in _COORDINATOR_ERRORS:
            self._coordinator = None
            return True
        if exc.code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            # Fenced: rejoin at epoch 0 with the same member id and the full subscription.
            self.member_epoch = 0
            self._subscription_sent = None
            self._set_assignment(set())
            return True
        return exc.retriable

    async def _heartbeat(self) -> None:
        if self._coordinator is None:
            self._coordinator = await self.cluster.find_coordinator(self.group_id)
        subscription = list(self._subscription)
        full = self.member_epoch == 0 or self._subscription_sent != subscription
        body = messages.ShareGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            rack_id=self.rack_id,
            subscribed_topic_names=subscription if full else None,
        )
        started = time.monotonic()
        self._last_heartbeat = started
        response = await self.cluster.request(self._coordinator, ApiKey.SHARE_GROUP_HEARTBEAT, body, HEARTBEAT_VERSIONS)
        self._sensors["heartbeat"].record()
        self._sensors["heartbeat-response-time"].record((time.monotonic() - started) * 1000)
        if response.error_code:
            raise for_code(response.error_code, response.error_message)
        self.member_epoch = response.member_epoch
        if response.heartbeat_interval_ms > 0:
            self._heartbeat_interval_s = response.heartbeat_interval_ms / 1000
        if full:
            self._subscription_sent = subscription
        if response.assignment is not None:
            new = {TopicIdPartition(tp.topic_id, p) for tp in response.assignment.topic_partitions for p in tp.partitions}
            for tid, _ in new:
                if tid not in self.cluster.topic_names:
                    await self.cluster.topic_name(tid)
            if new != self._assignment:
                self._sensors["rebalance"].record()
            self._set_assignment(new)

    def _set_assignment(self, new: set[TopicIdPartition]) -> None:
        self._assignment = new
        self._assignment_changed.set()

    async def _stop_heartbeats(self, *, leave: bool) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if leave and self.member_epoch > 0 and self._coordinator is not None:
            body = messages.ShareGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=LEAVE_EPOCH
            )
            with contextlib.suppress(KafkaError):
                await self.cluster.request(self._coordinator, ApiKey.SHARE_GROUP_HEARTBEAT, body, HEARTBEAT_VERSIONS)
        self.member_epoch = 0
        self._subscription_sent = None

    # ---- polling -----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise ClientClosedError()
        if self._fatal is not None:
            raise self._fatal

    async def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ShareRecord]:
        """Records acquired for this member; waits up to `timeout` seconds for some.

        Without `max_records` a poll hands out at most max_poll_records, and a fetch may acquire more than
        that (whole log batches): the rest waits in the buffer, locked for us but not renewable. With
        `max_records` the fetch asks the brokers to acquire at most that many (strictly, where ShareFetch
        v2 allows it) and the poll hands out at most that many. Buffered records whose acquisition lock has
        run out are dropped, never handed out: the broker may have given them to someone else.

        Implicit mode accepts the records of the previous poll now. In explicit mode records stay acquired
        (until their lock expires) until acknowledge() settles them, which may happen after later polls.
        """
        if self.header_only:
            raise IllegalStateError("a header-only consumer hands out acquisitions with poll_ranges()")
        limit = self._poll_limit(max_records)
        started = await self._fill(timeout, max_records)
        out: list[ShareRecord] = []
        self._drop_expired()
        while self._buffer and len(out) < limit:
            record, node, _ = self._buffer.popleft()
            out.append(record)
            self._delivered[(record.topic, record.partition, record.offset)] = node
        self._poll_done(started)
        return out

    async def poll_ranges(self, timeout: float = 1.0, max_records: int | None = None) -> list[AcquiredRange]:
        """Header-only mode: the offset ranges acquired for this member (at most `max_records` offsets,
        acquired strictly so where the broker allows it), without their records."""
        if not self.header_only:
            raise IllegalStateError("poll_ranges() needs header_only=True")
        limit = self._poll_limit(max_records)
        started = await self._fill(timeout, max_records)
        out: list[AcquiredRange] = []
        self._drop_expired()
        taken = 0
        while self._ranges and taken < limit:
            rng, node, expires = self._ranges.popleft()
            if taken + rng.count > limit:
                # Hand out what fits; the rest stays buffered (acquired, like any buffered record).
                cut = rng.first_offset + (limit - taken) - 1
                share = rng.size * (cut - rng.first_offset + 1) // rng.count
                rest = AcquiredRange(rng.topic, rng.partition, cut + 1, rng.last_offset, rng.delivery_count,
                                     rng.size - share)
                self._ranges.appendleft((rest, node, expires))
                rng = AcquiredRange(rng.topic, rng.partition, rng.first_offset, cut, rng.delivery_count, share)
            out.append(rng)
            taken += rng.count
            self._delivered_ranges[(rng.topic, rng.partition, rng.first_offset)] = (rng.last_offset, node)
        self._poll_done(started)
        return out

    def _poll_limit(self, max_records: int | None) -> int:
        self._check_usable()
        if max_records is not None and max_records < 1:
            raise ValueError("max_records must be at least 1")
        return self.max_poll_records if max_records is None else max_records

    async def _fill(self, timeout: float, max_records: int | None) -> float:
        """Fetch until something is buffered or `timeout` runs out; returns when the poll started."""
        started = time.monotonic()
        if self._last_poll_start is not None:
            between = started - self._last_poll_start
            self._sensors["time-between-poll"].record(between * 1000)
        self._settle_previous_poll()
        deadline = started + max(timeout, 0.0)
        while not self._drop_expired():
            remaining = deadline - time.monotonic()
            nodes = self._fetch_nodes()
            if nodes:
                wait_ms = int(min(self.fetch_max_wait_ms, max(remaining, 0.0) * 1000))
                round_start = time.monotonic()
                budgets = self._budgets(nodes, max_records)
                strict = max_records is not None
                await asyncio.gather(*(self._fetch_from(node, wait_ms, budgets[node], strict=strict) for node in nodes))
                self._check_usable()
                if self._buffer or self._ranges or time.monotonic() >= deadline:
                    break
                if time.monotonic() - round_start < 0.005:
                    # The brokers answered at once with nothing (errors, no leader): do not spin.
                    await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if remaining <= 0:
                break
            # Nothing assigned yet: wait for the heartbeat to bring an assignment.
            self._assignment_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._assignment_changed.wait(), min(remaining, 0.5))
            self._check_usable()
        return started

    def _poll_done(self, started: float) -> None:
        end = time.monotonic()
        if self._last_poll_end is not None and self._last_poll_start is not None:
            cycle = end - self._last_poll_start
            if cycle > 0:
                self._sensors["poll-idle-ratio"].record((end - started) / cycle)
        self._last_poll_start = started
        self._last_poll_end = end

    def buffered(self) -> int:
        """Records fetched (acquired) but not handed out yet whose acquisition lock has not run out."""
        now = time.monotonic()
        return sum(1 for _, _, expires in self._buffer if expires > now) + sum(
            r.count for r, _, expires in self._ranges if expires > now
        )

    def _drop_expired(self) -> int:
        """Forget buffered records whose lock has run out; returns how many are left.

        They are not acknowledged: the broker already took them back, and a RELEASE could hit a later
        acquisition of the same offsets by this very member."""
        now = time.monotonic()
        if any(expires <= now for _, _, expires in self._ranges):
            self._ranges = deque(entry for entry in self._ranges if entry[2] > now)
        if any(expires <= now for _, _, expires in self._buffer):
            kept = deque(entry for entry in self._buffer if entry[2] > now)
            log.info(
                "share consumer %s: dropped %d buffered records whose acquisition lock expired",
                self.member_id,
                len(self._buffer) - len(kept),
            )
            self._buffer = kept
        return len(self._buffer) + len(self._ranges)

    def _budgets(self, nodes: list[int], max_records: int | None) -> dict[int, int]:
        """MaxRecords for each broker's fetch. With a caller's limit the brokers share it, so that all of
        them together cannot acquire more than the poll hands out; the remainder rotates between them."""
        if max_records is None:
            return dict.fromkeys(nodes, self.max_poll_records)
        base, extra = divmod(max_records, len(nodes))
        start = self._budget_rotation % len(nodes)
        self._budget_rotation += 1
        return {node: base + (1 if (i - start) % len(nodes) < extra else 0) for i, node in enumerate(nodes)}

    def _settle_previous_poll(self) -> None:
        # Implicit mode: whatever the last poll handed out is accepted now. Explicit mode keeps records
        # outstanding across polls until acknowledge() (or lock expiry / close), so callers such as the
        # Spark source can gather several polls before settling them.
        if self.explicit or not self._delivered:
            return
        for (topic, partition, offset), node in self._delivered.items():
            self._queue_ack(node, TopicIdPartition(self._topic_ids[topic], partition), offset, AcknowledgeType.ACCEPT)
        self._delivered.clear()

    def _fetch_nodes(self) -> list[int]:
        nodes = set(self._pending_acks)
        nodes.update(s.node_id for s in self._sessions.values() if s.partitions)
        for tid, partition in self._assignment:
            name = self.cluster.topic_names.get(tid)
            leader = self.cluster.leader(name, partition) if name is not None else -1
            if leader >= 0:
                nodes.add(leader)
        return sorted(nodes)

    def _wanted_on(self, node: int) -> set[TopicIdPartition]:
        out = set()
        for tid, partition in self._assignment:
            name = self.cluster.topic_names.get(tid)
            if name is not None and self.cluster.leader(name, partition) == node:
                out.add(TopicIdPartition(tid, partition))
        return out

    async def _session_connection(self, session: _ShareSession) -> BrokerConnection:
        conn = await self.cluster.connection(session.node_id)
        if session.connection is not conn:
            # A session lives and dies with the connection that opened it.
            if session.connection is not None:
                session.reset()
            session.connection = conn
        return conn

    async def _fetch_from(self, node: int, wait_ms: int, max_records: int, *, strict: bool = False) -> None:
        session = self._sessions.get(node)
        if session is None:
            session = self._sessions[node] = _ShareSession(node)
        async with session.lock:
            try:
                conn = await self._session_connection(session)
            except KafkaError as exc:
                log.warning("share fetch: cannot reach broker %s: %s", node, exc)
                session.reset()
                await self._refresh_metadata_quietly()
                return
            wanted = self._wanted_on(node)
            # Acknowledgements cannot ride on the epoch-0 request that opens a session.
            acks = self._take_acks(self._pending_acks, node) if session.epoch > 0 else {}
            if session.epoch == 0:
                add, forget = wanted, set()
            else:
                add = wanted - session.partitions
                forget = session.partitions - wanted - set(acks)
            if session.epoch == 0 and not add:
                # No session to carry them and none to open: acks waiting for this broker cannot be sent.
                stale = self._take_acks(self._pending_acks, node)
                self._ack_results(node, stale, KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND, "no open share session"), {})
                return
            fetching = bool(wanted) and max_records > 0
            if not fetching and not acks and not forget:
                return
            version = conn.pick_version(ApiKey.SHARE_FETCH, *SHARE_FETCH_VERSIONS)
            req = messages.ShareFetchRequest
            parts: dict[bytes, list[Any]] = {}
            for tp in sorted(add | set(acks)):
                batches = ack_batches(acks[tp], req.AcknowledgementBatch) if tp in acks else []
                parts.setdefault(tp[0], []).append(
                    req.FetchPartition(partition_index=tp[1], acknowledgement_batches=batches)
                )
            forgotten: dict[bytes, list[int]] = {}
            for tid, p in sorted(forget):
                forgotten.setdefault(tid, []).append(p)
            body = req(
                group_id=self.group_id,
                member_id=self.member_id,
                share_session_epoch=session.epoch,
                max_wait_ms=wait_ms if fetching else 0,
                min_bytes=self.fetch_min_bytes if fetching else 0,
                max_bytes=self.fetch_max_bytes if fetching else 0,
                max_records=max_records if fetching else 0,
                batch_size=min(max_records, self.max_poll_records) if strict else self.max_poll_records,
                # v1 brokers only know batch-optimised acquisition, which may round MaxRecords up to whole
                # log batches; the surplus then waits in the buffer until its lock runs out.
                share_acquire_mode=ACQUIRE_MODE_RECORD_LIMIT if strict and version >= 2 else 0,
                # Shoal sends a header-only consumer batch headers, not records; other brokers ignore the tag.
                shoal_headers_only=self.header_only,
                topics=[req.FetchTopic(topic_id=tid, partitions=ps) for tid, ps in parts.items()],
                forgotten_topics_data=[
                    req.ForgottenTopic(topic_id=tid, partitions=ps)
                    for tid, ps in forgotten.items()
                ],
            )
            started = time.monotonic()
            try:
                response = await conn.request(
                    ApiKey.SHARE_FETCH, body, version=version, timeout_ms=self.config.request_timeout_ms + wait_ms
                )
            except KafkaError as exc:
                # The connection is gone, and with it the session and our acquired records on that broker.
                session.reset()
                self._ack_results(node, acks, exc, {})
                await self._refresh_metadata_quietly()
                return
            self._sensors["fetch-latency"].record((time.monotonic() - started) * 1000)
            self._sensors["fetch-throttle-time"].record(response.throttle_time_ms)
            if response.error_code:
                error = for_code(response.error_code, response.error_message)
                if response.error_code in _SESSION_ERRORS or response.error_code == ErrorCode.INVALID_REQUEST:
                    session.reset()
                elif response.error_code in (ErrorCode.UNSUPPORTED_VERSION, ErrorCode.GROUP_AUTHORIZATION_FAILED):
                    self._fatal = error
                self._ack_results(node, acks, error, {})
                return
            session.advance()
            session.partitions = (session.partitions | add) - forget
            # The broker starts the locks somewhere between our send and its answer: counting from the send
            # may drop a record a little early (it comes back later) but never hands out an expired one.
            lock_ms = response.acquisition_lock_timeout_ms
            expires = started + lock_ms / 1000 if lock_ms > 0 else float("inf")
            per_partition: dict[TopicIdPartition, KafkaError | None] = {}
            fetched_bytes = 0
            fetched_records = 0
            metadata_stale = False
            for topic in response.responses:
                name = self.cluster.topic_names.get(topic.topic_id)
                if name is None:
                    name = await self.cluster.topic_name(topic.topic_id)
                for p in topic.partitions:
                    tp = TopicIdPartition(topic.topic_id, p.partition_index)
                    if tp in acks:
                        code = p.acknowledge_error_code
                        per_partition[tp] = for_code(code, p.acknowledge_error_message) if code else None
                    if p.error_code:
                        if p.error_code in _METADATA_ERRORS:
                            metadata_stale = True
                            session.partitions.discard(tp)
                        log.debug("share fetch %s-%s: %s", name, p.partition_index, for_code(p.error_code))
                        continue
                    if name is None or not p.acquired_records:
                        continue
                    self._topic_ids[name] = topic.topic_id
                    fetched_bytes += len(p.records or b"") + len(p.shoal_batch_headers)
                    if self.header_only:
                        headers = (iter_packed_headers(p.shoal_batch_headers) if p.shoal_batch_headers
                                   else (h for h, _ in iter_complete_batches(p.records or b"")))
                        ranges = self._acquired_ranges(name, tp, node, headers, p.acquired_records)
                        fetched_records += sum(r.count for r in ranges)
                        self._ranges.extend((r, node, expires) for r in ranges)
                        continue
                    records = self._acquired(name, tp, node, p.records or b"", p.acquired_records)
                    fetched_records += len(records)
                    self._buffer.extend((r, node, expires) for r in records)
            self._sensors["fetch-size"].record(fetched_bytes)
            self._sensors["records-per-request"].record(fetched_records)
            if fetched_records:
                self._sensors["records-fetched"].record(fetched_records)
            self._ack_results(node, acks, None, per_partition)
        if metadata_stale:
            await self._refresh_metadata_quietly()

    async def _refresh_metadata_quietly(self) -> None:
        """Ask for the leaders again after a leadership error or a broker that cannot be reached (it may be
        gone for good, its partitions led by another one now, as when a sidecar takes over a dead one's
        work), as Kafka's network client does, instead of trying the old leader forever; a failed refresh
        is left to the next one."""
        with contextlib.suppress(KafkaError):
            await self.cluster.refresh_metadata()

    def _acquired(
        self, topic: str, tp: TopicIdPartition, node: int, data: bytes, acquired: list[Any]
    ) -> list[ShareRecord]:
        """The records of `data` whose offsets lie in the AcquiredRecords ranges; the rest of those
        ranges (control records, compacted-away offsets) are acknowledged as GAP."""
        ranges = sorted((a.first_offset, a.last_offset, a.delivery_count) for a in acquired)
        out: list[ShareRecord] = []
        seen: set[int] = set()
        idx = 0
        try:
            for header, records in iter_decoded_batches(data, allow_partial=True):
                if header.is_control:
                    continue
                ts_type = header.timestamp_type
                for r in records:
                    off = r.offset
                    while idx < len(ranges) and ranges[idx][1] < off:
                        idx += 1
                    if idx == len(ranges):
                        break
                    first, _, count = ranges[idx]
                    if off < first:
                        continue
                    seen.add(off)
                    out.append(
                        ShareRecord(
                            topic,
                            tp[1],
                            off,
                            r.timestamp,
                            ts_type,
                            r.key,
                            r.value,
                            [(h.key, h.value) for h in r.headers],
                            count,
                        )
                    )
        except InvalidRecordBatch as exc:
            log.warning("share fetch %s-%s: undecodable records: %s", topic, tp[1], exc)
        for first, last, _ in ranges:
            for off in range(first, last + 1):
                if off not in seen:
                    self._queue_ack(node, tp, off, AcknowledgeType.GAP)
        return out

    def _acquired_ranges(
        self, topic: str, tp: TopicIdPartition, node: int, headers: Iterator[BatchHeader], acquired: list[Any]
    ) -> list[AcquiredRange]:
        """The AcquiredRecords ranges cut down to the offsets of data batches, from batch headers alone.
        Offsets in control batches or in no batch at all are acknowledged as GAP."""
        spans: list[tuple[int, int, int]] = []  # (base offset, last offset, bytes) of each data batch
        try:
            for header in headers:
                if not header.is_control:
                    spans.append((header.base_offset, header.last_offset, header.size))
        except InvalidRecordBatch as exc:
            log.warning("share fetch %s-%s: unreadable batch header: %s", topic, tp[1], exc)
        out: list[AcquiredRange] = []
        covered: list[tuple[int, int]] = []
        for a in sorted(acquired, key=lambda a: a.first_offset):
            for base, last, size in spans:
                lo, hi = max(base, a.first_offset), min(last, a.last_offset)
                if lo > hi:
                    continue
                share = size * (hi - lo + 1) // (last - base + 1)
                prev = out[-1] if out else None
                if (prev is not None and prev.last_offset + 1 == lo and prev.delivery_count == a.delivery_count
                        and prev.partition == tp[1]):
                    out[-1] = AcquiredRange(topic, tp[1], prev.first_offset, hi, a.delivery_count, prev.size + share)
                else:
                    out.append(AcquiredRange(topic, tp[1], lo, hi, a.delivery_count, share))
                covered.append((lo, hi))
            # Offsets of this acquired range outside every data batch.
            cursor = a.first_offset
            for lo, hi in sorted(c for c in covered if a.first_offset <= c[0] <= a.last_offset):
                if cursor < lo:
                    self._queue_ack_range(node, tp, cursor, lo - 1, AcknowledgeType.GAP)
                cursor = hi + 1
            if cursor <= a.last_offset:
                self._queue_ack_range(node, tp, cursor, a.last_offset, AcknowledgeType.GAP)
        return out

    # ---- acknowledgements ---------------------------------------------------------------------------

    def _queue_ack_range(self, node: int, tp: TopicIdPartition, first: int, last: int, kind: int) -> None:
        target = self._pending_renews if kind == AcknowledgeType.RENEW else self._pending_acks
        with self._ack_lock:
            target.setdefault(node, {}).setdefault(tp, {}).update(dict.fromkeys(range(first, last + 1), kind))

    def acknowledge_range(self, rng: AcquiredRange, type: AckTypeArg = AcknowledgeType.ACCEPT) -> None:
        """Header-only mode: settle (or RENEW) a range exactly as poll_ranges() handed it out."""
        self._check_usable()
        kind = AcknowledgeType[type.upper()] if isinstance(type, str) else AcknowledgeType(type)
        if kind == AcknowledgeType.GAP:
            raise ValueError("GAP is not a user acknowledgement")
        key = (rng.topic, rng.partition, rng.first_offset)
        held = self._delivered_ranges.get(key)
        if held is None or held[0] != rng.last_offset:
            raise IllegalStateError(
                f"{rng.topic}-{rng.partition}@{rng.first_offset}..{rng.last_offset} is not a delivered, "
                "unacknowledged range"
            )
        if kind != AcknowledgeType.RENEW:
            del self._delivered_ranges[key]
        self._queue_ack_range(held[1], TopicIdPartition(self._topic_ids[rng.topic], rng.partition), rng.first_offset,
                              rng.last_offset, kind)


    def _queue_ack(self, node: int, tp: TopicIdPartition, offset: int, kind: int) -> None:
        target = self._pending_renews if kind == AcknowledgeType.RENEW else self._pending_acks
        with self._ack_lock:
            target.setdefault(node, {}).setdefault(tp, {})[offset] = kind

    def _take_acks(self, source: dict[int, dict[TopicIdPartition, dict[int, int]]], node: int) -> dict[TopicIdPartition, dict[int, int]]:
        with self._ack_lock:
            return source.pop(node, {})

    def acknowledge(self, record: ShareRecord, type: AckTypeArg = AcknowledgeType.ACCEPT) -> None:
        """Explicit mode: settle one delivered record (ACCEPT, RELEASE, REJECT or RENEW; names accepted too)."""
        self.acknowledge_offset(record.topic, record.partition, record.offset, type)

    def acknowledge_offset(
        self, topic: str, partition: int, offset: int, type: AckTypeArg = AcknowledgeType.ACCEPT
    ) -> None:
        self._check_usable()
        if not self.explicit:
            raise IllegalStateError("acknowledge() needs acknowledgement_mode='explicit'")
        kind = AcknowledgeType[type.upper()] if isinstance(type, str) else AcknowledgeType(type)
        if kind == AcknowledgeType.GAP:
            raise ValueError("GAP is not a user acknowledgement")
        key = (topic, partition, offset)
        node = self._delivered.get(key)
        if node is None:
            node = self._renewed.get(key)
        if node is None:
            raise IllegalStateError(f"{topic}-{partition}@{offset} is not a delivered, unacknowledged record")
        if kind == AcknowledgeType.RENEW:
            # The lock is extended but the record still needs a final ACCEPT/RELEASE/REJECT later.
            self._renewed[key] = node
        else:
            self._renewed.pop(key, None)
        self._delivered.pop(key, None)
        self._queue_ack(node, TopicIdPartition(self._topic_ids[topic], partition), offset, kind)

    async def commit_sync(self, timeout: float | None = None) -> AckResults:
        """Send every pending acknowledgement now (ShareAcknowledge) and return per-partition results."""
        self._check_usable()
        if not self.explicit:
            self._settle_previous_poll()
        work = [self._acknowledge_on(node, renew=False) for node in list(self._pending_acks)]
        work += [self._acknowledge_on(node, renew=True) for node in list(self._pending_renews)]
        results: AckResults = {}
        for part in await asyncio.wait_for(asyncio.gather(*work), timeout):
            results.update(part)
        return results

    def commit_async(self) -> asyncio.Task[AckResults]:
        """commit_sync in the background; results also go to the acknowledgement commit callback."""
        return asyncio.get_running_loop().create_task(self.commit_sync())

    async def _acknowledge_on(self, node: int, *, renew: bool, close: bool = False) -> AckResults:
        session = self._sessions.get(node)
        source = self._pending_renews if renew else self._pending_acks
        if session is None:
            acks = self._take_acks(source, node)
            return self._ack_results(node, acks, KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND), {})
        async with session.lock:
            acks = self._take_acks(source, node)
            if session.epoch == 0 or (not acks and not close):
                error = KafkaError(ErrorCode.SHARE_SESSION_NOT_FOUND, "no open share session") if acks else None
                return self._ack_results(node, acks, error, {})
            try:
                conn = await self._session_connection(session)
                if session.epoch == 0:
                    raise KafkaConnectionError(None, "the share session's connection was lost")
                version = conn.pick_version(ApiKey.SHARE_ACKNOWLEDGE, 2 if renew else 1, SHARE_ACK_VERSIONS[1])
            except KafkaError as exc:
                if renew and isinstance(exc, UnsupportedVersionError):
                    exc = UnsupportedVersionError(None, "RENEW needs ShareAcknowledge v2, which the broker lacks")
                return self._ack_results(node, acks, exc, {})
            req = messages.ShareAcknowledgeRequest
            parts: dict[bytes, list[Any]] = {}
            for tp in sorted(acks):
                parts.setdefault(tp[0], []).append(
                    req.AcknowledgePartition(
                        partition_index=tp[1], acknowledgement_batches=ack_batches(acks[tp], req.AcknowledgementBatch)
                    )
                )
            epoch = CLOSE_SESSION_EPOCH if close else session.epoch
            body = req(
                group_id=self.group_id,
                member_id=self.member_id,
                share_session_epoch=epoch,
                is_renew_ack=renew,
                topics=[req.AcknowledgeTopic(topic_id=tid, partitions=ps) for tid, ps in parts.items()],
            )
            try:
                response = await conn.request(ApiKey.SHARE_ACKNOWLEDGE, body, version=version)
            except KafkaError as exc:
                session.reset()
                return self._ack_results(node, acks, exc, {})
            if close:
                session.reset()
            if response.error_code:
                if response.error_code in _SESSION_ERRORS:
                    session.reset()
                return self._ack_results(node, acks, for_code(response.error_code, response.error_message), {})
            if not close:
                session.advance()
            per_partition: dict[TopicIdPartition, KafkaError | None] = {}
            for topic in response.responses:
                for p in topic.partitions:
                    tp = TopicIdPartition(topic.topic_id, p.partition_index)
                    per_partition[tp] = for_code(p.error_code, p.error_message) if p.error_code else None
            return self._ack_results(node, acks, None, per_partition)

    def _ack_results(
        self,
        node: int,
        acks: Mapping[TopicIdPartition, Mapping[int, int]],
        error: KafkaError | None,
        per_partition: Mapping[TopicIdPartition, KafkaError | None],
    ) -> AckResults:
        """Turn a request's outcome into {(topic, partition): error|None} for the partitions it acknowledged."""
        results: AckResults = {}
        for tp, offsets in acks.items():
            result = error if error is not None else per_partition.get(tp)
            name = self.cluster.topic_names.get(tp[0], tp[0].hex())
            results[(name, tp[1])] = result
            self._sensors["acknowledgements-send"].record(len(offsets))
            if result is not None:
                self._sensors["acknowledgements-error"].record(len(offsets))
        if results and self._ack_callback is not None:
            try:
                self._ack_callback(results)
            except Exception:
                log.exception("acknowledgement commit callback failed")
        return results

    # ---- shutdown ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Send pending acknowledgements, close every share session (releasing what is still acquired)
        and leave the group."""
        if self._closed:
            return
        try:
            if self._started:
                if not self.explicit and self._fatal is None:
                    self._settle_previous_poll()
                self._buffer.clear()
                self._ranges.clear()
                for node in list(self._pending_renews):
                    self._pending_renews.pop(node, None)
                nodes = set(self._pending_acks) | {n for n, s in self._sessions.items() if s.epoch > 0}
                await asyncio.gather(
                    *(self._acknowledge_on(node, renew=False, close=True) for node in nodes), return_exceptions=True
                )
                await self._stop_heartbeats(leave=True)
        finally:
            self._closed = True
            await self.cluster.close()

    # ---- metrics -------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Client metrics under KIP-932's names (share-consumer, -coordinator and -fetch-manager groups)."""
        s = self._sensors
        now = time.monotonic()
        return {
            "last-poll-seconds-ago": (now - self._last_poll_start) if self._last_poll_start is not None else -1.0,
            "time-between-poll-avg": s["time-between-poll"].avg(),
            "time-between-poll-max": s["time-between-poll"].max(),
            "poll-idle-ratio-avg": s["poll-idle-ratio"].avg(),
            "heartbeat-total": float(s["heartbeat"].count),
            "heartbeat-rate": s["heartbeat"].count_rate(),
            "heartbeat-response-time-max": s["heartbeat-response-time"].max(),
            "last-heartbeat-seconds-ago": (now - self._last_heartbeat) if self._last_heartbeat is not None else -1.0,
            "rebalance-total": float(s["rebalance"].count),
            "rebalance-rate-per-hour": s["rebalance"].count_rate() * 3600,
            "fetch-total": float(s["fetch-latency"].count),
            "fetch-rate": s["fetch-latency"].count_rate(),
            "fetch-latency-avg": s["fetch-latency"].avg(),
            "fetch-latency-max": s["fetch-latency"].max(),
            "fetch-size-avg": s["fetch-size"].avg(),
            "fetch-size-max": s["fetch-size"].max(),
            "bytes-fetched-total": s["fetch-size"].total,
            "bytes-fetched-rate": s["fetch-size"].rate(),
            "records-fetched-total": s["records-fetched"].total,
            "records-fetched-rate": s["records-fetched"].rate(),
            "records-per-request-avg": s["records-per-request"].avg(),
            "acknowledgements-send-total": s["acknowledgements-send"].total,
            "acknowledgements-send-rate": s["acknowledgements-send"].rate(),
            "acknowledgements-error-total": s["acknowledgements-error"].total,
            "acknowledgements-error-rate": s["acknowledgements-error"].rate(),
            "fetch-throttle-time-avg": s["fetch-throttle-time"].avg(),
            "fetch-throttle-time-max": s["fetch-throttle-time"].max(),
        }


async def _call(fn: Callable[[], int]) -> int:
    return fn()


class ShareConsumer:
    """Synchronous facade: an AsyncShareConsumer on its own event-loop thread.

    Build it where it is used (e.g. on a Spark executor); it holds sockets and a thread, so it does not pickle.
    The acknowledgement commit callback runs on the client's loop thread.
    """

    def __init__(self, bootstrap_servers: str | Iterable[str], group_id: str, **kwargs: Any):
        self._thread = LoopThread(f"shoal-share-consumer-{group_id}")
        try:
            self._consumer: AsyncShareConsumer = self._thread.run(self._make(bootstrap_servers, group_id, kwargs))
        except BaseException:
            self._thread.stop()  # a bad argument must not leave the loop thread behind
            raise
        self._margin = self._consumer.config.request_timeout_ms / 1000 + 5

    @staticmethod
    async def _make(bootstrap_servers: str | Iterable[str], group_id: str, kwargs: dict[str, Any]) -> AsyncShareConsumer:
        consumer = AsyncShareConsumer(bootstrap_servers, group_id, **kwargs)
        await consumer.start()
        return consumer

    @property
    def member_id(self) -> str:
        return self._consumer.member_id

    def subscribe(self, topics: Iterable[str]) -> None:
        self._thread.run(self._consumer.subscribe(list(topics)))

    def unsubscribe(self) -> None:
        self._thread.run(self._consumer.unsubscribe())

    def subscription(self) -> list[str]:
        return self._consumer.subscription()

    def assignment(self) -> set[tuple[str, int]]:
        return self._consumer.assignment()

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ShareRecord]:
        return self._thread.run(self._consumer.poll(timeout, max_records), timeout + self._margin)

    def poll_ranges(self, timeout: float = 1.0, max_records: int | None = None) -> list[AcquiredRange]:
        return self._thread.run(self._consumer.poll_ranges(timeout, max_records), timeout + self._margin)

    def acknowledge_range(self, rng: AcquiredRange, type: AckTypeArg = AcknowledgeType.ACCEPT) -> None:
        self._consumer.acknowledge_range(rng, type)

    def buffered(self) -> int:
        # On the loop: the buffer is changed there and must not be iterated from this thread meanwhile.
        return self._thread.run(_call(self._consumer.buffered), self._margin)

    def acknowledge(self, record: ShareRecord, type: AckTypeArg = AcknowledgeType.ACCEPT) -> None:
        self._consumer.acknowledge(record, type)

    def acknowledge_offset(
        self, topic: str, partition: int, offset: int, type: AckTypeArg = AcknowledgeType.ACCEPT
    ) -> None:
        # Direct call: it only records the acknowledgement (under a lock); sending happens on the loop.
        self._consumer.acknowledge_offset(topic, partition, offset, type)

    def commit_sync(self, timeout: float | None = None) -> AckResults:
        wait = None if timeout is None else timeout + 1
        return self._thread.run(self._consumer.commit_sync(timeout), wait)

    def commit_async(self) -> concurrent.futures.Future[AckResults]:
        return self._thread.submit(self._consumer.commit_sync())

    def set_acknowledgement_commit_callback(self, callback: AckCallback | None) -> None:
        self._consumer.set_acknowledgement_commit_callback(callback)

    def metrics(self) -> dict[str, float]:
        return self._consumer.metrics()

    def close(self) -> None:
        try:
            self._thread.run(self._consumer.close(), self._margin * 2)
        finally:
            self._thread.stop()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
