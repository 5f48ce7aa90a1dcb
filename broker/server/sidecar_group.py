"""Sidecar mode with several instances: the broker's parts joined to the sidecar group on the upstream
(`upstream/membership.py`) and to the ownership view it keeps (`upstream/ownership.py`).

The units of work are the upstream's topic-partitions (share-partition leadership) and the partitions of
the two state topics (coordinator shards); a key goes to its state partition by Kafka's hash, as in
Kafka: a group id to its `__consumer_offsets` partition, (group, topic id, partition) to its
`__share_group_state` partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog

from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS, SHARE_GROUP_STATE
from shoal.broker.upstream.assignment import Unit
from shoal.broker.upstream.membership import Endpoint, GroupAssignment, Membership, parse_membership
from shoal.broker.upstream.ownership import Ownership
from shoal.broker.upstream.settings import MEMBERSHIP_PREFIX
from shoal.persister.persister import SharePartitionKey

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig, Listener
    from shoal.broker.share.share_partition_leader import SharePartitionLeaders
    from shoal.broker.share.share_topics import ShareTopicView
    from shoal.broker.upstream.cluster import UpstreamCluster
    from shoal.broker.upstream.state_log import UpstreamStateLog
    from shoal.coordinator.group_coordinator import GroupCoordinator
    from shoal.coordinator.placement import Placement
    from shoal.coordinator.share_coordinator import ShareCoordinator

log = structlog.get_logger("shoal.sidecar")


class SidecarParts(Protocol):
    """What the sidecar group uses of the broker (the server's Broker; named here to keep imports one-way)."""

    config: BrokerConfig
    node_id: int
    advertised: list[Listener]
    upstream_cluster: UpstreamCluster | None
    offsets_placement: Placement[str]
    share_coordinator: ShareCoordinator
    share_partitions: SharePartitionLeaders
    share_topics: ShareTopicView
    group_coordinator: GroupCoordinator
    state_logs: dict[str, UpstreamStateLog]
    state_partition_assigned: Callable[[str, int], bool]

    async def take_state_partition(self, internal_topic: str, partition: int) -> None: ...

    def release_state_partition(self, internal_topic: str, partition: int) -> None: ...


class SidecarGroup:
    def __init__(self, broker: SidecarParts):
        assert broker.upstream_cluster is not None
        self.broker = broker
        self.cluster = broker.upstream_cluster
        self.settings = parse_membership({k[len(MEMBERSHIP_PREFIX):]: v for k, v in broker.config.upstream.items()
                                          if k.startswith(MEMBERSHIP_PREFIX)})
        self.membership = Membership(self.cluster, self.settings, broker.node_id, self.endpoints, self.units,
                                     self._owned, self._assigned, self._lost)
        self.ownership = Ownership(broker.node_id, self.endpoints, self.membership.fresh)
        self._retry: asyncio.TimerHandle | None = None

    # ---- units -------------------------------------------------------------------------------------

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(Endpoint(lst.name, lst.security_protocol, lst.host, lst.port) for lst in self.broker.advertised)

    def units(self) -> set[Unit]:
        """Every unit of work: the upstream's topic-partitions (not its internal topics) and the state
        topics' partitions."""
        units = {(topic, p) for topic, count in self.cluster.partition_counts.items() if not topic.startswith("__")
                 for p in range(count)}
        units |= {(CONSUMER_OFFSETS, p) for p in range(self.broker.offsets_placement.num_partitions)}
        units |= {(SHARE_GROUP_STATE, p) for p in range(self.broker.share_coordinator.placement.num_partitions)}
        return units

    def group_unit(self, group_id: str) -> Unit:
        return CONSUMER_OFFSETS, self.broker.offsets_placement.home(group_id)

    def state_unit(self, group_id: str, topic_id: bytes, partition: int) -> Unit:
        key = SharePartitionKey(group_id, topic_id, partition)
        return SHARE_GROUP_STATE, self.broker.share_coordinator.placement.home(key)

    def leads(self, topic_id: bytes, partition: int) -> bool:
        topic = self.broker.share_topics.topic_by_id(topic_id)
        # A topic the upstream's metadata does not name (yet) is left to the share-partition manager's checks.
        return topic is None or self.ownership.serves((topic[0], partition))

    # ---- lifecycle ---------------------------------------------------------------------------------

    def _owned(self) -> set[Unit]:
        return self.units() if self.ownership.alone else self.ownership.local_units()

    def wire(self) -> None:
        """Before any request: the share-partition leaders lead only what this instance serves, and drop
        what it stops serving; the state partitions follow the assignment."""
        leaders = self.broker.share_partitions
        leaders.leads = self.leads
        # Leadership moves with the assignment, and for the moment between two instances' SyncGroup answers
        # both may lead a partition: each load records a higher leader epoch in the share state, so the
        # share coordinator refuses the earlier leader's writes from then on (FENCED_LEADER_EPOCH).
        leaders.bump_leader_epoch = True
        # A group's offsets may be altered or deleted by its coordinator in another instance.
        leaders.check_stored_state = True
        self.ownership.release_hooks.append(lambda _serves: self._drop_unled())
        self.ownership.release_hooks.append(lambda _serves: self._release_state())
        self.ownership.take_hooks.append(lambda _gained: self._take_state())
        # A state partition lost without a fence is taken again only while it is still this instance's.
        self.broker.state_partition_assigned = lambda topic, p: self.ownership.assigned_here((topic, p))

    def unload_untaken(self) -> None:
        """After the coordinators' start-up load: the partitions not taken answer NOT_COORDINATOR until the
        assignment hands them to this instance (then `take_state_partition` loads them)."""
        for topic, runtime in ((SHARE_GROUP_STATE, self.broker.share_coordinator.runtime),
                               (CONSUMER_OFFSETS, self.broker.group_coordinator.runtime)):
            state_log = self.broker.state_logs.get(topic)
            for p in range(runtime.num_partitions):
                if state_log is None or not state_log.owns(p):
                    runtime.unload(p)

    def _state_units(self) -> list[Unit]:
        return sorted(u for u in self.units() if u[0] in (CONSUMER_OFFSETS, SHARE_GROUP_STATE))

    def _release_state(self) -> None:
        """Stop writing the state partitions this instance no longer owns."""
        for topic, p in self._state_units():
            state_log = self.broker.state_logs.get(topic)
            if state_log is not None and state_log.owns(p) and self.ownership.owner((topic, p)) != self.broker.node_id:
                self.broker.release_state_partition(topic, p)
                log.info("state partition released", topic=topic, partition=p)

    async def _take_state(self) -> None:
        """Take every state partition this instance owns and does not hold (gained now, or lost to a fence
        since): InitProducerId fences the previous owner, then the partition is replayed."""
        wanted = [(topic, p) for topic, p in self._state_units()
                  if self.ownership.owner((topic, p)) == self.broker.node_id
                  and (state_log := self.broker.state_logs.get(topic)) is not None and not state_log.owns(p)]
        if not wanted:
            return
        limit = asyncio.Semaphore(8)

        async def take(topic: str, p: int) -> bool:
            async with limit:
                try:
                    await self.broker.take_state_partition(topic, p)
                    return True
                except Exception as exc:
                    log.warning("taking a state partition failed; trying again", topic=topic, partition=p,
                                error=str(exc))
                    return False

        taken = list(await asyncio.gather(*(take(topic, p) for topic, p in wanted if topic == SHARE_GROUP_STATE)))
        # The group coordinator's take loads every partition it has not loaded, taken or not: one at a time,
        # each followed by unloading those not taken, so a later take still replays its partition.
        for topic, p in wanted:
            if topic == CONSUMER_OFFSETS:
                taken.append(await take(topic, p))
                self.unload_untaken()
        if not all(taken) and self._retry is None:
            def again() -> None:
                self._retry = None
                asyncio.get_running_loop().create_task(self._take_state())

            self._retry = asyncio.get_running_loop().call_later(1.0, again)

    async def _assigned(self, assignment: GroupAssignment) -> None:
        await self.ownership.apply(assignment)

    def _drop_unled(self) -> None:
        dropped = self.broker.share_partitions.drop_unled()
        if dropped:
            log.info("share partitions released to other sidecars", count=dropped)

    def _lost(self) -> None:
        self.ownership.lapse()

    async def start(self) -> None:
        """Join the group once the listeners are bound (members advertise them) and wait for the first
        assignment, up to the session timeout. An upstream that refuses the group leaves this instance alone,
        owning everything; one that is only slow to answer does not (taking everything would fence the
        other members): the instance serves nothing until its assignment comes."""
        self.membership.start()
        if await self.membership.wait_first(self.settings.session_timeout_ms / 1000):
            return
        if self.membership.refused is not None:
            log.warning("the upstream refused the sidecar group; this instance serves everything alone",
                        group=self.settings.group_id, error_code=self.membership.refused)
            await self.ownership.go_alone()
        else:
            log.warning("no sidecar group assignment yet; serving nothing until one arrives",
                        group=self.settings.group_id)

    async def stop(self) -> None:
        await self.membership.stop()
