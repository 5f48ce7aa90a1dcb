"""Which sidecar instance owns each unit of work, as the sidecar group's last assignment says; what
Metadata, FindCoordinator and DescribeCluster answer from, and what the share-partition leaders, the
group requests and the share-state RPCs check before they serve.

Before the first assignment an instance owns nothing; when the upstream refuses the group it is alone
and owns every unit until an assignment comes. A change is applied in Kafka's order: the units lost stop being served and their in-memory state is
dropped, the units gained are taken (the `take` hooks: fence the previous owner, replay) and only then
served. When the membership lapses, nothing is served until the next assignment.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from .assignment import Unit
from .membership import Endpoint, GroupAssignment, MemberInfo

log = structlog.get_logger("shoal.sidecar.ownership")

NO_OWNER = -1
# Told which units this instance still serves: drop in-memory state of every other one.
ReleaseHook = Callable[[Callable[[Unit], bool]], None]
# Given the units gained: make them servable (fence the previous owner, replay the state).
TakeHook = Callable[[set[Unit]], Awaitable[None]]


class Ownership:
    def __init__(self, node_id: int, endpoints: Callable[[], tuple[Endpoint, ...]],
                 fresh: Callable[[], bool] = lambda: True):
        self.node_id = node_id
        self._endpoints = endpoints
        # Whether the membership was confirmed within the session timeout: an instance that was paused
        # (SIGSTOP) or cut off stops serving at once, before its heartbeat learns that the group moved on.
        self._fresh = fresh
        self.assignment: GroupAssignment | None = None
        self.alone = False
        self._lapsed = False
        self._taking: set[Unit] = set()
        self.release_hooks: list[ReleaseHook] = []
        self.take_hooks: list[TakeHook] = []

    # ---- questions ---------------------------------------------------------------------------------

    def owner(self, unit: Unit) -> int:
        """The owning instance's node id, or NO_OWNER while this instance knows of none."""
        if self.alone:
            return self.node_id
        a = self.assignment
        if a is None or self._lapsed:
            return NO_OWNER
        # A unit the leader has not assigned yet (a topic created since) is the leader's until it rebalances.
        return a.owners.get(unit, a.leader)

    def assigned_here(self, unit: Unit) -> bool:
        """This instance owns the unit and its membership is current (taken or not yet)."""
        return self.owner(unit) == self.node_id and (self.alone or self._fresh())

    def serves(self, unit: Unit) -> bool:
        """This instance owns the unit and has taken it."""
        return self.owner(unit) == self.node_id and unit not in self._taking and (self.alone or self._fresh())

    def local_units(self) -> set[Unit]:
        a = self.assignment
        return set() if a is None or self._lapsed or self.alone else a.units_of(self.node_id)

    def members(self) -> dict[int, MemberInfo]:
        """Every live instance by node id (this one always included)."""
        found = {} if self.alone or self._lapsed or self.assignment is None else dict(self.assignment.members)
        found.setdefault(self.node_id, MemberInfo(self.node_id, self._endpoints()))
        return found

    def endpoint(self, node_id: int, listener: str, *, any_listener: bool = False) -> Endpoint | None:
        """The member's endpoint on the listener of that name; a client is only told of those, as Kafka
        leaves out brokers without the client's listener. `any_listener`: else its first one."""
        info = self.members().get(node_id)
        if info is None or not info.endpoints:
            return None
        for e in info.endpoints:
            if e.name == listener:
                return e
        return info.endpoints[0] if any_listener else None

    # ---- changes -----------------------------------------------------------------------------------

    async def apply(self, assignment: GroupAssignment) -> None:
        before = None if self.alone else self.local_units()
        now = assignment.units_of(self.node_id)
        previous = None if self._lapsed else self.assignment
        if before is not None and previous is not None and previous.leader == self.node_id:
            # Units the previous assignment did not name yet (a topic created since) were this instance's
            # as its leader: it keeps serving them, as a gained unit would stop being served until taken
            # (its share partitions dropped and loaded again, handing out what was in flight once more).
            before |= {unit for unit in now if unit not in previous.owners}
        # Alone, this instance held every unit already; after a lapse it held none.
        gained = set() if before is None else now - before
        self.assignment = assignment
        self.alone = self._lapsed = False
        self._taking = gained
        lost = None if before is None else before - now
        log.info("sidecar ownership changes", generation=assignment.generation, owned=len(now), gained=len(gained),
                 lost="all others" if lost is None else len(lost))
        self._release()
        try:
            for take in self.take_hooks:
                await take(gained)
        finally:
            self._taking = set()

    async def go_alone(self) -> None:
        """No group (the upstream refused it): this instance owns every unit."""
        self.alone, self._lapsed = True, False
        for take in self.take_hooks:
            await take(set())

    def lapse(self) -> None:
        """The membership lapsed: another instance may own anything now."""
        self._lapsed = True
        self.alone = False
        self._release()

    def _release(self) -> None:
        for hook in self.release_hooks:
            try:
                hook(self.serves)
            except Exception:
                log.exception("releasing units failed")
