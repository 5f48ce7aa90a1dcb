"""Sidecar instances find each other through a group on the upstream, as Kafka Connect's distributed
workers do: JoinGroup and SyncGroup with a protocol type of Shoal's own, the leader computing every
member's work (`assignment.assign`) and handing it out through SyncGroup, heartbeats in between.

Each member's JoinGroup metadata carries its node id, its advertised listeners and the units it owns now
(so the leader's assignment is sticky); every member's SyncGroup answer is the whole map, so each
instance knows who owns every unit and where to reach it (`ownership.Ownership`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .assignment import Unit, assign
from .cluster import KEY_TYPE_GROUP, CoordinatorLookupFailed, UpstreamCluster, UpstreamUnavailable
from .settings import UpstreamConfigError

log = structlog.get_logger("shoal.sidecar.membership")

PROTOCOL_TYPE = "shoal"
PROTOCOL_NAME = "shoal-v1"
FORMAT_VERSION = 1
# The group's requests have their own upstream connection: a JoinGroup waits up to the rebalance timeout,
# and a Kafka broker answers one request of a connection at a time.
_LANE = "sidecar.membership"
_RETRY_BACKOFF_S = 0.2
# The versions asked for: the last ones before the flexible encodings, which every upstream that has the
# group APIs speaks (librdkafka's mock cluster lists JoinGroup v6 and drops the connection on it); they
# carry every field the group needs.
_JOIN_V, _SYNC_V, _HEARTBEAT_V, _LEAVE_V = 5, 3, 3, 3
_GROUP_APIS = (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT)
# The upstream will not let this instance in (ACLs, an invalid group id): it works alone, asking again now
# and then.
_REFUSED = frozenset({ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.INVALID_GROUP_ID,
                      ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.GROUP_MAX_SIZE_REACHED,
                      ErrorCode.UNSUPPORTED_VERSION, ErrorCode.INVALID_SESSION_TIMEOUT})
_REFUSED_RETRY_S = 30.0
# Errors after which the member id is no longer valid and the member joins anew.
_RESET_MEMBER = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID})
_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


@dataclass(frozen=True, slots=True)
class MembershipSettings:
    group_id: str = "shoal-sidecars"
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 30_000
    heartbeat_interval_ms: int = 3_000


_KEYS = {"group.id": "group_id", "session.timeout.ms": "session_timeout_ms",
         "rebalance.timeout.ms": "rebalance_timeout_ms", "heartbeat.interval.ms": "heartbeat_interval_ms"}


def parse_membership(keys: Mapping[str, str]) -> MembershipSettings:
    """The `upstream.membership.*` keys, prefix removed; an unknown key or a bad value is a start-up error."""
    values: dict[str, str | int] = {}
    for key, value in keys.items():
        attr = _KEYS.get(key)
        if attr is None:
            raise UpstreamConfigError(f"upstream.membership.{key} is not a membership setting")
        if attr == "group_id":
            if not value:
                raise UpstreamConfigError("upstream.membership.group.id must not be empty")
            values[attr] = value
            continue
        try:
            number = int(value)
        except ValueError as exc:
            raise UpstreamConfigError(f"upstream.membership.{key} must be an integer, not {value!r}") from exc
        if number <= 0:
            raise UpstreamConfigError(f"upstream.membership.{key} must be positive")
        values[attr] = number
    settings = MembershipSettings(**values)  # type: ignore[arg-type]
    if settings.heartbeat_interval_ms >= settings.session_timeout_ms:
        raise UpstreamConfigError("upstream.membership.heartbeat.interval.ms must be below the session timeout")
    return settings


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One advertised listener of a member."""

    name: str
    security_protocol: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class MemberInfo:
    node_id: int
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """One generation's answer: every member by node id, and every unit's owner."""

    generation: int
    leader: int  # node id of the group's leader
    members: dict[int, MemberInfo]
    owners: dict[Unit, int] = field(default_factory=dict)

    def units_of(self, node_id: int) -> set[Unit]:
        return {unit for unit, owner in self.owners.items() if owner == node_id}


# ---- wire format (JSON in the group protocol's metadata and assignment bytes) --------------------------

def _endpoints_json(endpoints: tuple[Endpoint, ...]) -> list[list[str | int]]:
    return [[e.name, e.security_protocol, e.host, e.port] for e in endpoints]


def _endpoints_from(raw: list[list[str | int]]) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(str(n), str(sp), str(h), int(p)) for n, sp, h, p in raw)


def encode_metadata(info: MemberInfo, owned: set[Unit]) -> bytes:
    return json.dumps({"version": FORMAT_VERSION, "node_id": info.node_id,
                       "endpoints": _endpoints_json(info.endpoints),
                       "owned": sorted([t, p] for t, p in owned)}).encode()


def decode_metadata(raw: bytes) -> tuple[MemberInfo, set[Unit]]:
    data = json.loads(raw)
    return (MemberInfo(int(data["node_id"]), _endpoints_from(data["endpoints"])),
            {(str(t), int(p)) for t, p in data.get("owned", [])})


def encode_assignment(assignment: GroupAssignment) -> bytes:
    units: dict[str, list[list[str | int]]] = {}
    for (topic, partition), owner in sorted(assignment.owners.items()):
        units.setdefault(str(owner), []).append([topic, partition])
    return json.dumps({"version": FORMAT_VERSION, "generation": assignment.generation, "leader": assignment.leader,
                       "members": {str(n): _endpoints_json(m.endpoints) for n, m in assignment.members.items()},
                       "units": units}).encode()


def decode_assignment(raw: bytes) -> GroupAssignment:
    data = json.loads(raw)
    members = {int(n): MemberInfo(int(n), _endpoints_from(eps)) for n, eps in data["members"].items()}
    owners = {(str(t), int(p)): int(n) for n, units in data["units"].items() for t, p in units}
    return GroupAssignment(int(data["generation"]), int(data["leader"]), members, owners)


def leader_assignment(generation: int, leader_member: str,
                      members: list[tuple[str, bytes]], units: set[Unit]) -> tuple[GroupAssignment, list[str]]:
    """What the group's leader hands out: one owner per unit among members with distinct node ids (a
    second member with a node id already taken gets nothing, and is named in the second result)."""
    infos: dict[str, MemberInfo] = {}
    owned: dict[str, set[Unit]] = {}
    by_node: dict[int, str] = {}
    duplicates: list[str] = []
    for member_id, raw in sorted(members):
        try:
            info, claims = decode_metadata(raw)
        except (ValueError, KeyError, TypeError):
            log.error("sidecar group member sent metadata Shoal cannot read; it gets no work", member_id=member_id)
            duplicates.append(member_id)
            continue
        if info.node_id in by_node:
            duplicates.append(member_id)
            continue
        by_node[info.node_id] = member_id
        infos[member_id] = info
        owned[member_id] = claims
    result = assign(units, list(infos), owned)
    owners = {unit: infos[m].node_id for m, got in result.items() for unit in got}
    leader = infos[leader_member].node_id if leader_member in infos else -1
    return GroupAssignment(generation, leader, {i.node_id: i for i in infos.values()}, owners), duplicates


class Membership:
    """This instance's membership of the sidecar group: join, sync, heartbeat, rejoin; leave on stop.

    `on_assignment` is awaited with each generation's answer before the next heartbeat; `on_lost` is
    called when the membership lapsed (no heartbeat answered within the session timeout), since another
    member may own this instance's units by then.
    """

    def __init__(self, cluster: UpstreamCluster, settings: MembershipSettings, node_id: int,
                 endpoints: Callable[[], tuple[Endpoint, ...]], units: Callable[[], set[Unit]],
                 owned: Callable[[], set[Unit]],
                 on_assignment: Callable[[GroupAssignment], Awaitable[None]], on_lost: Callable[[], None]):
        self.cluster = cluster
        self.settings = settings
        self.node_id = node_id
        self._endpoints = endpoints
        self._units = units
        self._owned = owned
        self._on_assignment = on_assignment
        self._on_lost = on_lost
        self.member_id = ""
        self.generation = -1
        self.is_leader = False
        self.assigned_units: set[Unit] = set()
        self.all_units: set[Unit] = set()  # every unit of the current generation, whoever owns it
        self.refused: int | None = None  # the error code the upstream refused the group with
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()  # an assignment arrived, or the upstream refused the group
        self._stopping = False
        self.last_ok = float("-inf")  # when the group last confirmed this member (monotonic, at sending)
        self._serving = False  # an assignment is applied and has not lapsed

    def fresh(self) -> bool:
        """The group confirmed this member within the session timeout (a JoinGroup, SyncGroup or heartbeat
        answered): past it, the coordinator may have given this member's work to another."""
        return time.monotonic() - self.last_ok < self.settings.session_timeout_ms / 1000

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait_first(self, timeout_s: float) -> bool:
        """Until the first assignment (True), the upstream refusing the group or the timeout (False)."""
        try:
            await asyncio.wait_for(self._first.wait(), timeout_s)
        except TimeoutError:
            return False
        return self.refused is None

    async def stop(self) -> None:
        """Leave the group, so the others take over at once instead of after the session timeout."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.member_id:
            try:
                node = await self.cluster.coordinator(KEY_TYPE_GROUP, self.settings.group_id)
                body = messages.LeaveGroupRequest(
                    group_id=self.settings.group_id, member_id=self.member_id,
                    members=[messages.LeaveGroupRequest.MemberIdentity(member_id=self.member_id, reason="shutdown")])
                await self.cluster.send(node, ApiKey.LEAVE_GROUP, body, _LEAVE_V, lane=_LANE, timeout_ms=3_000)
            except (UpstreamUnavailable, CoordinatorLookupFailed) as exc:
                log.warning("leaving the sidecar group failed; the others take over after the session timeout",
                            error=str(exc))

    # ---- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            try:
                if await self._join_and_sync():
                    await self._heartbeat_until_rejoin()
            except asyncio.CancelledError:
                raise
            except (UpstreamUnavailable, CoordinatorLookupFailed) as exc:
                log.warning("sidecar group: upstream request failed", error=str(exc))
                self.cluster.forget_coordinator(KEY_TYPE_GROUP, self.settings.group_id)
            except Exception:
                log.exception("sidecar group: unexpected failure; joining again")
            if self._serving and not self.fresh():
                self._lapse()
            await asyncio.sleep(_REFUSED_RETRY_S if self.refused is not None else _RETRY_BACKOFF_S)

    def _lapse(self) -> None:
        log.warning("sidecar group membership lapsed; this instance stops serving its units",
                    units=len(self.assigned_units))
        self.assigned_units = set()
        self._serving = False
        self._on_lost()

    async def _join_and_sync(self) -> bool:
        """One JoinGroup and SyncGroup round; True once an assignment was applied."""
        s = self.settings
        node = await self.cluster.coordinator(KEY_TYPE_GROUP, s.group_id)
        info = MemberInfo(self.node_id, self._endpoints())
        join = messages.JoinGroupRequest(
            group_id=s.group_id, session_timeout_ms=s.session_timeout_ms, rebalance_timeout_ms=s.rebalance_timeout_ms,
            member_id=self.member_id, group_instance_id=None, protocol_type=PROTOCOL_TYPE,
            protocols=[messages.JoinGroupRequest.JoinGroupRequestProtocol(
                name=PROTOCOL_NAME, metadata=encode_metadata(info, self._owned()))],
            reason="sidecar joins")
        conn = await self.cluster.connection(node, _LANE)
        if any(api not in conn.api_versions for api in _GROUP_APIS):
            self._usable(ErrorCode.UNSUPPORTED_VERSION, "JoinGroup")  # an upstream without the group APIs
            return False
        response = await self.cluster.send(node, ApiKey.JOIN_GROUP, join, _JOIN_V, lane=_LANE,
                                           timeout_ms=s.rebalance_timeout_ms + s.session_timeout_ms)
        code = response.error_code
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            return await self._join_and_sync()
        if not self._usable(code, "JoinGroup"):
            return False
        self.member_id, self.generation = response.member_id, response.generation_id
        self.is_leader = response.leader == response.member_id
        assignments: list[messages.SyncGroupRequest.SyncGroupRequestAssignment] = []
        if self.is_leader:
            units = self._units()
            result, refused = leader_assignment(self.generation, self.member_id,
                                                [(m.member_id, m.metadata) for m in response.members], units)
            for member_id in refused:
                log.error("sidecar group member has a node id another member already has; it gets no work",
                          member_id=member_id)
            blob = encode_assignment(result)
            assignments = [messages.SyncGroupRequest.SyncGroupRequestAssignment(member_id=m.member_id, assignment=blob)
                           for m in response.members]
            log.info("sidecar group leader assigned units", generation=self.generation,
                     members=sorted(result.members), units=len(units))
        sent = time.monotonic()
        sync = messages.SyncGroupRequest(
            group_id=s.group_id, generation_id=self.generation, member_id=self.member_id, group_instance_id=None,
            protocol_type=PROTOCOL_TYPE, protocol_name=PROTOCOL_NAME, assignments=assignments)
        answer = await self.cluster.send(node, ApiKey.SYNC_GROUP, sync, _SYNC_V, lane=_LANE,
                                         timeout_ms=s.rebalance_timeout_ms + s.session_timeout_ms)
        if not self._usable(answer.error_code, "SyncGroup"):
            return False
        try:
            assignment = decode_assignment(answer.assignment)
        except (ValueError, KeyError, TypeError):
            log.error("sidecar group assignment is unreadable; joining again", generation=self.generation)
            return False
        self.assigned_units = assignment.units_of(self.node_id)
        self.all_units = set(assignment.owners)
        self.last_ok = sent
        await self._on_assignment(assignment)
        self._serving = True
        self._first.set()
        log.info("sidecar group assignment applied", generation=self.generation, leader=assignment.leader,
                 members=sorted(assignment.members), units=len(self.assigned_units))
        return True

    def _usable(self, code: int, api: str) -> bool:
        if code == ErrorCode.NONE:
            self.refused = None
            return True
        if code in _RESET_MEMBER:
            self.member_id, self.generation = "", -1
        elif code in _COORDINATOR_MOVED:
            self.cluster.forget_coordinator(KEY_TYPE_GROUP, self.settings.group_id)
        elif code in _REFUSED:
            if self.refused is None:
                log.error("the upstream refused the sidecar group; this instance works alone",
                          api=api, error_code=code, group=self.settings.group_id)
            self.refused = code
            self._first.set()
        elif code != ErrorCode.REBALANCE_IN_PROGRESS:
            log.warning("sidecar group request failed; joining again", api=api, error_code=code)
        return False

    async def _heartbeat_until_rejoin(self) -> None:
        """Heartbeats until the group rebalances, the member id is no longer valid, the membership lapsed,
        or (as leader) the units changed."""
        s = self.settings
        delay = s.heartbeat_interval_ms / 1000
        while not self._stopping:
            await asyncio.sleep(delay)
            if not self.fresh():
                return  # paused or cut off past the session: the group has moved on without this member
            if self.is_leader and self._units() != self.all_units:
                log.info("sidecar group units changed; the leader rebalances")
                return
            node = await self.cluster.coordinator(KEY_TYPE_GROUP, s.group_id)
            body = messages.HeartbeatRequest(group_id=s.group_id, generation_id=self.generation,
                                             member_id=self.member_id, group_instance_id=None)
            sent = time.monotonic()
            try:
                response = await self.cluster.send(node, ApiKey.HEARTBEAT, body, _HEARTBEAT_V, lane=_LANE,
                                                   timeout_ms=s.session_timeout_ms)
            except UpstreamUnavailable as exc:
                # Soon again, not a whole interval later: the session keeps running meanwhile.
                log.warning("sidecar group heartbeat failed", error=str(exc))
                delay = _RETRY_BACKOFF_S
                continue
            delay = s.heartbeat_interval_ms / 1000
            if response.error_code != ErrorCode.NONE:
                self._usable(response.error_code, "Heartbeat")
                return
            self.last_ok = sent
