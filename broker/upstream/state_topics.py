"""Sidecar mode: the upstream topics that hold the coordinators' records.

`<prefix>_consumer_offsets` (the share groups of the group coordinator) and `<prefix>_share_group_state` (the
share coordinator's state), with a prefix of one deployment's own (`state_topic_names.py`: `__shoal` for the
default membership group id), so they never collide with the internal topics of an upstream that has share
groups of its own, nor with another deployment's. They are created at start-up when missing: compacted, with
the upstream's default replication factor (or `upstream.state.topic.replication.factor`), and with the
`min.insync.replicas` the upstream gives them (not overridden). Their partition count is fixed at creation;
an existing topic's count is read from the upstream. A topic on which an acks=all write cannot succeed
(`min.insync.replicas` above its replica count) is a start-up error that says so.

`<prefix>_deployment` says whose they are: its first record is keyed by the membership group id of the
deployment that claimed the prefix, before that deployment wrote or read any other state topic. A deployment
whose prefix another one claimed refuses to start (`claim_state_topics`), rather than replay and overwrite
that deployment's state. Compaction keeps one record per key and never reorders them, so the first record
stays the first; two deployments that claim at once both write a record, and the one written first wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from shoal.broker.storage.partition_source import SourceUnavailable
from shoal.client.errors import error_name
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import CorruptRecordBatch
from shoal.protocol.records import RecordInput, decode_records, encode_batch

from .cluster import UpstreamCluster, UpstreamStartError
from .partition_reader import BatchCache, UpstreamPartitionSource
from .produce import UpstreamProduceFailed, produce_acks_all
from .state_topic_names import StateTopicNames

if TYPE_CHECKING:
    from .forwarder import Forwarder


log = structlog.get_logger("shoal.upstream.state")

_RESOURCE_TOPIC = 2
_LEADER_WAIT_S = 0.05
_OWNER_READ_BYTES = 64 << 10


async def claim_state_topics(cluster: UpstreamCluster, forwarder: Forwarder, names: StateTopicNames,
                             membership_group_id: str, replication_factor: int | None) -> None:
    """Make sure the deployment of `membership_group_id` owns the state topics of `names`: claim them when
    nobody has; raises UpstreamStartError when another deployment owns them or the upstream does not answer."""
    topic = names.deployment
    try:
        await ensure_state_topics(cluster, {topic: 1}, replication_factor)
        owner = await deployment_owner(cluster, topic)
        if owner is None:
            marker = encode_batch([RecordInput(key=membership_group_id.encode(), value=membership_group_id.encode())])
            await produce_acks_all(forwarder, topic, 0, marker, timeout_ms=cluster.config.request_timeout_ms,
                                   what="deployment marker")
            owner = await deployment_owner(cluster, topic)  # the first claim wins, whoever's it is
            log.info("upstream state topics claimed", prefix=names.prefix, owner=owner)
    except (SourceUnavailable, UpstreamProduceFailed) as exc:
        raise UpstreamStartError(f"cannot check who owns the upstream state topics {names.prefix}_*: {exc}") from exc
    if owner != membership_group_id:
        raise UpstreamStartError(
            f"the upstream state topics {names.prefix}_* belong to another sidecar deployment "
            f"(upstream.membership.group.id={owner!r}, this one is {membership_group_id!r}): give this deployment "
            f"a prefix of its own (upstream.state.topic.prefix), or, to hand it these topics with the state they "
            f"hold, delete topic {topic} on the upstream first")


async def deployment_owner(cluster: UpstreamCluster, topic: str) -> str | None:
    """The membership group id of the deployment marker topic's first record, None while it has none."""
    source = UpstreamPartitionSource(cluster, BatchCache(_OWNER_READ_BYTES), topic, 0)
    first = 0  # records below the log start (deleted) do not count, even in a batch that holds later ones

    def restarted(log_start_offset: int) -> None:
        nonlocal first
        first = log_start_offset

    async with contextlib.aclosing(source.batches_to_end(0, _OWNER_READ_BYTES, on_log_start=restarted)) as batches:
        async for header, data in batches:
            if header.is_control:
                continue
            try:
                records = decode_records(data, 0, header)
            except CorruptRecordBatch as exc:
                raise SourceUnavailable(f"{topic}: unreadable batch at offset {header.base_offset}: {exc}") from exc
            for record in records:
                if record.offset >= first and record.key is not None:
                    return bytes(record.key).decode(errors="replace")
    return None


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
