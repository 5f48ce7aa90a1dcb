"""Sidecar mode: the upstream topics that hold the coordinators' records.

`__shoal_consumer_offsets` (the share groups of the group coordinator) and `__shoal_share_group_state` (the
share coordinator's state), named with a `__shoal` prefix so they never collide with the internal topics of
an upstream that has share groups of its own. They are created at start-up when missing: compacted, with
the upstream's default replication factor (or `upstream.state.topic.replication.factor`), and with the
`min.insync.replicas` the upstream gives them (not overridden). Their partition count is fixed at creation;
an existing topic's count is read from the upstream. A topic on which an acks=all write cannot succeed
(`min.insync.replicas` above its replica count) is a start-up error that says so.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from shoal.broker.storage.partition_source import SourceUnavailable
from shoal.client.errors import error_name
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .cluster import UpstreamCluster, UpstreamStartError

log = structlog.get_logger("shoal.upstream.state")

STATE_TOPIC_PREFIX = "__shoal"
_RESOURCE_TOPIC = 2
_LEADER_WAIT_S = 0.05


def state_topic_name(internal_topic: str) -> str:
    """`__consumer_offsets` -> `__shoal_consumer_offsets`, `__share_group_state` -> `__shoal_share_group_state`."""
    return STATE_TOPIC_PREFIX + internal_topic[1:]


def is_state_topic(name: str | None) -> bool:
    """One of the sidecars' state topics on the upstream (clients must not write them)."""
    return name is not None and name.startswith(STATE_TOPIC_PREFIX + "_")


@dataclass(frozen=True, slots=True)
class StateTopic:
    name: str
    partitions: int


async def ensure_state_topics(cluster: UpstreamCluster, wanted: dict[str, int],
                              replication_factor: int | None) -> dict[str, StateTopic]:
    """The state topics by name (`wanted`: name -> partitions to create it with), created when missing,
    each with a leader for every partition; raises UpstreamStartError naming the problem otherwise."""
    names = sorted(wanted)
    existing = await _describe(cluster, names)
    missing = [name for name in names if name not in existing]
    if missing and await _serves(cluster, ApiKey.CREATE_TOPICS):
        await _create(cluster, {name: wanted[name] for name in missing}, replication_factor)
    elif missing:
        # An upstream without CreateTopics (librdkafka's mock cluster, some proxies) may still create
        # topics on a Metadata request, with its own defaults: no compaction, its partition count.
        log.warning("the upstream cannot create topics; asking it to auto-create the state topics with its "
                    "defaults (they are not compacted)", topics=missing)
        await _describe(cluster, missing, create=True)
    deadline = time.monotonic() + cluster.config.request_timeout_ms / 1000
    while True:
        described = await _describe(cluster, names)
        ready = all(name in described and all(leader >= 0 for leader, _ in described[name]) for name in names)
        if ready:
            break
        if time.monotonic() >= deadline:
            raise UpstreamStartError(f"upstream state topics {names} have no leader for every partition")
        await asyncio.sleep(_LEADER_WAIT_S)
    await _check_acks_all(cluster, {name: min(replicas for _, replicas in described[name]) for name in names})
    topics = {name: StateTopic(name, len(described[name])) for name in names}
    for topic in topics.values():
        if topic.name in existing and topic.partitions != wanted[topic.name]:
            log.info("upstream state topic keeps the partition count it was created with", topic=topic.name,
                     partitions=topic.partitions, configured=wanted[topic.name])
    return topics


async def _serves(cluster: UpstreamCluster, api_key: int) -> bool:
    conn = await cluster.connection(await cluster.any_node())
    return api_key in conn.api_versions


async def _describe(cluster: UpstreamCluster, names: list[str], *,
                    create: bool = False) -> dict[str, list[tuple[int, int]]]:
    """(leader, replica count) of each partition of the named topics that exist."""
    req = messages.MetadataRequest
    response = await cluster.metadata(
        req(topics=[req.MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=create), 12)
    out: dict[str, list[tuple[int, int]]] = {}
    for topic in response.topics:
        if topic.name in names and topic.error_code in (ErrorCode.NONE, ErrorCode.LEADER_NOT_AVAILABLE):
            out[topic.name] = [(p.leader_id, len(p.replica_nodes or []))
                               for p in sorted(topic.partitions, key=lambda p: p.partition_index)]
        elif topic.name in names and topic.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            raise UpstreamStartError(f"the upstream refuses access to state topic {topic.name} "
                                     "(TOPIC_AUTHORIZATION_FAILED)")
    return {name: parts for name, parts in out.items() if parts}


async def _create(cluster: UpstreamCluster, partitions: dict[str, int], replication_factor: int | None) -> None:
    req = messages.CreateTopicsRequest
    body = req(timeout_ms=cluster.config.request_timeout_ms, validate_only=False, topics=[
        req.CreatableTopic(name=name, num_partitions=count,
                           replication_factor=-1 if replication_factor is None else replication_factor,
                           assignments=[], configs=[req.CreatableTopicConfig(name="cleanup.policy", value="compact")])
        for name, count in sorted(partitions.items())])
    node = await cluster.any_node()
    response = await cluster.send(node, ApiKey.CREATE_TOPICS, body, 5)
    for result in response.topics:
        if result.error_code == ErrorCode.TOPIC_ALREADY_EXISTS:
            continue  # another sidecar created it meanwhile
        if result.error_code != ErrorCode.NONE:
            raise UpstreamStartError(
                f"creating upstream state topic {result.name} failed: {error_name(result.error_code)}"
                + (f" ({result.error_message})" if result.error_message else ""))
        log.info("upstream state topic created", topic=result.name, partitions=partitions[result.name],
                 replication_factor=result.replication_factor)


async def _check_acks_all(cluster: UpstreamCluster, replicas: dict[str, int]) -> None:
    """An acks=all write needs `min.insync.replicas` in-sync replicas: more than the topic has can never be met."""
    if not await _serves(cluster, ApiKey.DESCRIBE_CONFIGS):
        log.warning("the upstream does not describe topic configs; the state topics' min.insync.replicas is "
                    "not checked at start-up")
        return
    req = messages.DescribeConfigsRequest
    body = req(include_synonyms=False, include_documentation=False, resources=[
        req.DescribeConfigsResource(resource_type=_RESOURCE_TOPIC, resource_name=name,
                                    configuration_keys=["min.insync.replicas", "cleanup.policy"])
        for name in sorted(replicas)])
    node = await cluster.any_node()
    try:
        response = await cluster.send(node, ApiKey.DESCRIBE_CONFIGS, body, 4)
    except SourceUnavailable as exc:  # a broker that lists the API and drops the connection (Tansu)
        log.warning("the upstream did not describe the state topics' configs; their min.insync.replicas is not "
                    "checked at start-up", error=str(exc))
        return
    for result in response.results:
        if result.error_code != ErrorCode.NONE:
            log.warning("cannot read the upstream state topic's configs", topic=result.resource_name,
                        error=error_name(result.error_code))
            continue
        configs = {c.name: c.value for c in result.configs}
        min_isr = int(configs.get("min.insync.replicas") or 1)
        have = replicas[result.resource_name]
        if have and min_isr > have:
            raise UpstreamStartError(
                f"upstream state topic {result.resource_name} has min.insync.replicas={min_isr} but "
                f"{have} replica(s): its acks=all writes would fail with NOT_ENOUGH_REPLICAS")
        if "compact" not in (configs.get("cleanup.policy") or "compact"):
            log.warning("upstream state topic is not compacted; its records may be deleted by retention",
                        topic=result.resource_name, cleanup_policy=configs.get("cleanup.policy"))
