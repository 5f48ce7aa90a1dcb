"""The bundled admin client: topics, offsets, groups, share-group offsets and configs.

`AsyncAdmin` is the asyncio client; `Admin` runs one on a background event-loop thread. Results are plain
dataclasses; per-item failures are returned as KafkaError values, request-level ones are raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shoal.client.cluster import Cluster
from shoal.client.errors import KafkaError, for_code
from shoal.client.loop_thread import LoopThread
from shoal.client.security import ClientConfig
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase
from shoal.protocol.errors import ErrorCode

T = TypeVar("T")

# ConfigResource types (DescribeConfigs / IncrementalAlterConfigs).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32
# IncrementalAlterConfigs operations.
OP_SET = 0
OP_DELETE = 1
EARLIEST = -2
LATEST = -1
_COORDINATOR_RETRY = (
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
)

TopicPartition = tuple[str, int]


def _error(code: int, message: str | None = None) -> KafkaError | None:
    return for_code(code, message) if code else None


@dataclass(slots=True)
class NewTopic:
    name: str
    num_partitions: int = 1
    replication_factor: int = 1
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class TopicResult:
    name: str
    topic_id: bytes | None
    num_partitions: int
    error: KafkaError | None


@dataclass(slots=True)
class ListedOffset:
    topic: str
    partition: int
    offset: int
    timestamp: int
    leader_epoch: int
    error: KafkaError | None


@dataclass(slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str | None
    type: str | None


@dataclass(slots=True)
class ShareMemberDescription:
    member_id: str
    client_id: str
    client_host: str
    rack_id: str | None
    member_epoch: int
    subscribed_topics: list[str]
    assignment: list[TopicPartition]


@dataclass(slots=True)
class ShareGroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[ShareMemberDescription]
    authorized_operations: int
    error: KafkaError | None


@dataclass(slots=True)
class SharePartitionOffset:
    topic: str
    partition: int
    start_offset: int
    leader_epoch: int
    lag: int
    error: KafkaError | None


@dataclass(slots=True)
class ConsumerMemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: list[TopicPartition]


@dataclass(slots=True)
class ConsumerGroupDescription:
    """A classic group as DescribeGroups tells it; `protocol` is the assignor of a consumer group."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[ConsumerMemberDescription]
    error: KafkaError | None


def parse_consumer_assignment(data: bytes) -> list[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment (any version: the topic list comes first)."""
    out: list[TopicPartition] = []
    if len(data) < 6:
        return out
    pos = 2
    topics = int.from_bytes(data[pos:pos + 4], "big", signed=True)
    pos += 4
    for _ in range(max(topics, 0)):
        size = int.from_bytes(data[pos:pos + 2], "big", signed=True)
        topic = data[pos + 2:pos + 2 + size].decode()
        pos += 2 + size
        count = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        pos += 4
        for _ in range(max(count, 0)):
            out.append((topic, int.from_bytes(data[pos:pos + 4], "big", signed=True)))
            pos += 4
    return sorted(out)


@dataclass(slots=True)
class ConfigEntry:
    name: str
    value: str | None
    read_only: bool
    source: int
    is_sensitive: bool


@dataclass(slots=True)
class ConfigDescription:
    resource_type: int
    name: str
    entries: dict[str, ConfigEntry]
    error: KafkaError | None


class AsyncAdmin:
    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        *,
        client_id: str | None = None,
        request_timeout_ms: int | None = None,  # default: request.timeout.ms of `config`, else 30 s
        config: Mapping[str, Any] | None = None,
    ):
        self.config = ClientConfig.from_dict(config, client_id=client_id, request_timeout_ms=request_timeout_ms)
        self.cluster = Cluster(bootstrap_servers, self.config)
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self.cluster.start()
            self._started = True

    async def close(self) -> None:
        await self.cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _any(self, api_key: int, body: MessageBase, versions: tuple[int, int]) -> Any:
        await self.start()
        conn = await self.cluster.any_connection()
        return await conn.request(api_key, body, versions=versions)

    async def _controller(self, api_key: int, body: MessageBase, versions: tuple[int, int]) -> Any:
        await self.start()
        node = self.cluster.controller_id
        if node in self.cluster.brokers:
            return await self.cluster.request(node, api_key, body, versions)
        return await self._any(api_key, body, versions)

    async def _coordinated(
        self,
        group_id: str,
        send: Callable[[int], Awaitable[T]],
        error_of: Callable[[T], int],
    ) -> T:
        """Run a request against the group's coordinator, rediscovering it while it moves or loads."""
        await self.start()
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        delay = self.config.reconnect_backoff_ms / 1000
        while True:
            node = await self.cluster.find_coordinator(group_id)
            response = await send(node)
            code = error_of(response)
            if code not in _COORDINATOR_RETRY or time.monotonic() >= deadline:
                return response
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_backoff_max_ms / 1000)

    # ---- topics ------------------------------------------------------------------------------------

    async def create_topics(
        self, topics: Iterable[NewTopic | str], *, timeout_ms: int = 30_000, validate_only: bool = False
    ) -> dict[str, TopicResult]:
        req = messages.CreateTopicsRequest
        items = [NewTopic(t) if isinstance(t, str) else t for t in topics]
        body = req(
            topics=[
                req.CreatableTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    assignments=[],
                    configs=[req.CreatableTopicConfig(name=k, value=v) for k, v in t.configs.items()],
                )
                for t in items
            ],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )
        response = await self._controller(ApiKey.CREATE_TOPICS, body, (2, 7))
        out = {
            r.name: TopicResult(
                r.name,
                r.topic_id if r.topic_id and any(r.topic_id) else None,
                r.num_partitions if r.num_partitions is not None else -1,
                _error(r.error_code, r.error_message),
            )
            for r in response.topics
        }
        await self.cluster.refresh_metadata()
        return out

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int = 30_000) -> dict[str, KafkaError | None]:
        names = list(names)
        req = messages.DeleteTopicsRequest
        body = req(
            topic_names=names,
            topics=[req.DeleteTopicState(name=n) for n in names],
            timeout_ms=timeout_ms,
        )
        response = await self._controller(ApiKey.DELETE_TOPICS, body, (1, 6))
        out = {r.name: _error(r.error_code, r.error_message) for r in response.responses}
        await self.cluster.refresh_metadata()
        return out

    async def list_topics(self) -> dict[str, int]:
        """Topic name -> partition count (internal topics included)."""
        await self.start()
        await self.cluster.refresh_metadata()
        return {name: len(info.partitions) for name, info in self.cluster.topics.items()}

    async def list_offsets(
        self, specs: Mapping[TopicPartition, str | int], *, isolation_level: int = 0
    ) -> dict[TopicPartition, ListedOffset]:
        """Offsets by "earliest", "latest" or a timestamp in ms, for each (topic, partition)."""
        await self.start()
        await self.cluster.refresh_metadata({t for t, _ in specs})
        by_leader: dict[int, dict[str, list[Any]]] = {}
        out: dict[TopicPartition, ListedOffset] = {}
        req = messages.ListOffsetsRequest
        for (topic, partition), spec in specs.items():
            ts = EARLIEST if spec == "earliest" else LATEST if spec == "latest" else int(spec)
            leader = self.cluster.leader(topic, partition)
            if leader < 0:
                err = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
                out[(topic, partition)] = ListedOffset(topic, partition, -1, -1, -1, err)
                continue
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(
                req.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=ts)
            )
        for leader, topics in by_leader.items():
            body = req(
                replica_id=-1,
                isolation_level=isolation_level,
                topics=[req.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
            )
            response = await self.cluster.request(leader, ApiKey.LIST_OFFSETS, body, (1, 10))
            for t in response.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = ListedOffset(
                        t.name,
                        p.partition_index,
                        p.offset,
                        p.timestamp,
                        p.leader_epoch if p.leader_epoch is not None else -1,
                        _error(p.error_code),
                    )
        return out

    # ---- groups ------------------------------------------------------------------------------------

    async def list_groups(
        self, types: Iterable[str] | None = None, states: Iterable[str] | None = None
    ) -> list[GroupListing]:
        """Groups on every broker, optionally filtered by type ("share", "consumer", "classic") and state."""
        await self.start()
        await self.cluster.refresh_metadata()
        body = messages.ListGroupsRequest(states_filter=list(states or []), types_filter=list(types or []))
        out: dict[str, GroupListing] = {}
        nodes = list(self.cluster.brokers) or [-1]
        for node in nodes:
            response = await self.cluster.request(node, ApiKey.LIST_GROUPS, body, (0, 5))
            if response.error_code:
                raise for_code(response.error_code, "ListGroups")
            for g in response.groups:
                out[g.group_id] = GroupListing(g.group_id, g.protocol_type, g.group_state, g.group_type)
        return list(out.values())

    async def describe_share_groups(self, group_ids: Iterable[str]) -> dict[str, ShareGroupDescription]:
        out: dict[str, ShareGroupDescription] = {}
        for group_id in group_ids:
            body = messages.ShareGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=True)

            async def send(node: int, body: MessageBase = body) -> Any:
                return await self.cluster.request(node, ApiKey.SHARE_GROUP_DESCRIBE, body, (1, 1))

            response = await self._coordinated(group_id, send, lambda r: r.groups[0].error_code if r.groups else 0)
            for g in response.groups:
                members = [
                    ShareMemberDescription(
                        m.member_id,
                        m.client_id,
                        m.client_host,
                        m.rack_id,
                        m.member_epoch,
                        list(m.subscribed_topic_names),
                        sorted((tp.topic_name, p) for tp in m.assignment.topic_partitions for p in tp.partitions),
                    )
                    for m in g.members
                ]
                out[g.group_id] = ShareGroupDescription(
                    g.group_id,
                    g.group_state,
                    g.group_epoch,
                    g.assignment_epoch,
                    g.assignor_name,
                    members,
                    g.authorized_operations,
                    _error(g.error_code, g.error_message),
                )
        return out

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, KafkaError | None]:
        out: dict[str, KafkaError | None] = {}
        for group_id in group_ids:
            body = messages.DeleteGroupsRequest(groups_names=[group_id])

            async def send(node: int, body: MessageBase = body) -> Any:
                return await self.cluster.request(node, ApiKey.DELETE_GROUPS, body, (0, 2))

            response = await self._coordinated(group_id, send, lambda r: r.results[0].error_code if r.results else 0)
            for r in response.results:
                out[r.group_id] = _error(r.error_code)
        return out

    # ---- consumer (classic) groups ------------------------------------------------------------------

    async def describe_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, ConsumerGroupDescription]:
        """KIP-848 groups through ConsumerGroupDescribe, classic ones through DescribeGroups (Kafka's order)."""
        out: dict[str, ConsumerGroupDescription] = {}
        classic: list[str] = []
        for group_id in group_ids:
            described = await self._describe_kip848_group(group_id)
            if described is None:
                classic.append(group_id)
            else:
                out[group_id] = described
        for group_id in classic:
            body = messages.DescribeGroupsRequest(groups=[group_id], include_authorized_operations=False)

            async def send(node: int, body: Any = body) -> Any:
                return await self.cluster.request(node, ApiKey.DESCRIBE_GROUPS, body, (0, 6))

            response = await self._coordinated(group_id, send, lambda r: r.groups[0].error_code if r.groups else 0)
            for g in response.groups:
                consumer = g.protocol_type == "consumer"
                members = [
                    ConsumerMemberDescription(
                        m.member_id, m.group_instance_id, m.client_id, m.client_host,
                        parse_consumer_assignment(bytes(m.member_assignment)) if consumer else [],
                    )
                    for m in g.members
                ]
                out[g.group_id] = ConsumerGroupDescription(
                    g.group_id, g.group_state, g.protocol_type, g.protocol_data, members,
                    _error(g.error_code, g.error_message),
                )
        return out

    async def _describe_kip848_group(self, group_id: str) -> ConsumerGroupDescription | None:
        """The group as ConsumerGroupDescribe tells it; None when it is not a KIP-848 group."""
        body = messages.ConsumerGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=False)

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.CONSUMER_GROUP_DESCRIBE, body, (0, 1))

        response = await self._coordinated(group_id, send, lambda r: r.groups[0].error_code if r.groups else 0)
        [g] = response.groups
        if g.error_code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
            return None
        members = [
            ConsumerMemberDescription(m.member_id, m.instance_id, m.client_id, m.client_host, [
                (tp.topic_name, p) for tp in m.assignment.topic_partitions for p in sorted(tp.partitions)])
            for m in g.members
        ]
        return ConsumerGroupDescription(g.group_id, g.group_state, "consumer", g.assignor_name, members,
                                        _error(g.error_code, g.error_message))

    async def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """Committed offsets of a group (OffsetFetch); None = every partition it committed."""
        req = messages.OffsetFetchRequest
        topics: list[Any] | None = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = [req.OffsetFetchRequestTopics(name=t, partition_indexes=sorted(ps))
                      for t, ps in sorted(by_topic.items())]
        body = req(groups=[req.OffsetFetchRequestGroup(group_id=group_id, member_id=None, member_epoch=-1,
                                                       topics=topics)], require_stable=True)

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.OFFSET_FETCH, body, (8, 9))

        response = await self._coordinated(group_id, send, lambda r: r.groups[0].error_code if r.groups else 0)
        out: dict[TopicPartition, int] = {}
        for g in response.groups:
            if g.error_code:
                raise for_code(g.error_code, f"OffsetFetch for group {group_id}")
            for t in g.topics:
                for p in t.partitions:
                    if p.error_code:
                        raise for_code(p.error_code, f"OffsetFetch for {t.name}-{p.partition_index}")
                    if p.committed_offset >= 0:
                        out[(t.name, p.partition_index)] = p.committed_offset
        return out

    async def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Commit offsets for a group without members (OffsetCommit as a simple consumer, generation -1)."""
        req = messages.OffsetCommitRequest
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(req.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""))
        body = req(group_id=group_id, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                   topics=[req.OffsetCommitRequestTopic(name=t, partitions=ps)
                           for t, ps in by_topic.items()])

        def first_error(r: Any) -> int:
            return next((p.error_code for t in r.topics for p in t.partitions if p.error_code), 0)

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.OFFSET_COMMIT, body, (2, 9))

        response = await self._coordinated(group_id, send, first_error)
        return {(t.name, p.partition_index): _error(p.error_code) for t in response.topics for p in t.partitions}

    async def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, KafkaError | None]:
        """OffsetDelete: forget committed offsets; refused for topics the group's members subscribe to."""
        req = messages.OffsetDeleteRequest
        by_topic: dict[str, list[Any]] = {}
        for topic, partition in sorted(set(partitions)):
            by_topic.setdefault(topic, []).append(req.OffsetDeleteRequestPartition(partition_index=partition))
        body = req(group_id=group_id, topics=[req.OffsetDeleteRequestTopic(name=t, partitions=ps)
                                              for t, ps in by_topic.items()])

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.OFFSET_DELETE, body, (0, 0))

        response = await self._coordinated(group_id, send, lambda r: r.error_code)
        if response.error_code:
            raise for_code(response.error_code, f"OffsetDelete for group {group_id}")
        return {(t.name, p.partition_index): _error(p.error_code) for t in response.topics for p in t.partitions}

    # ---- share-group offsets -----------------------------------------------------------------------

    async def list_share_group_offsets(
        self, group_id: str, topics: Mapping[str, Iterable[int]] | Iterable[str] | None = None
    ) -> dict[TopicPartition, SharePartitionOffset]:
        """The share-partition start offsets (and lag, from v1) of a share group; None = every topic it has state for."""
        await self.start()
        req = messages.DescribeShareGroupOffsetsRequest
        req_topics: list[Any] | None = None
        if topics is not None:
            if not isinstance(topics, Mapping):
                names = list(topics)
                await self.cluster.refresh_metadata(names)
                topics = {n: list(self.cluster.topics[n].partitions) if n in self.cluster.topics else [] for n in names}
            req_topics = [
                req.DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=sorted(ps))
                for t, ps in topics.items()
            ]
        body = req(groups=[req.DescribeShareGroupOffsetsRequestGroup(group_id=group_id, topics=req_topics)])

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, body, (0, 1))

        response = await self._coordinated(group_id, send, lambda r: r.groups[0].error_code if r.groups else 0)
        out: dict[TopicPartition, SharePartitionOffset] = {}
        for g in response.groups:
            if g.error_code:
                raise for_code(g.error_code, g.error_message)
            for t in g.topics:
                for p in t.partitions:
                    lag = p.lag if p.lag is not None else -1
                    out[(t.topic_name, p.partition_index)] = SharePartitionOffset(
                        t.topic_name, p.partition_index, p.start_offset, p.leader_epoch, lag,
                        _error(p.error_code, p.error_message),
                    )
        return out

    async def alter_share_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Set share-partition start offsets; the group must be empty."""
        req = messages.AlterShareGroupOffsetsRequest
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(
                req.AlterShareGroupOffsetsRequestPartition(partition_index=partition, start_offset=offset)
            )
        body = req(
            group_id=group_id,
            topics=[req.AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps) for t, ps in by_topic.items()],
        )

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.ALTER_SHARE_GROUP_OFFSETS, body, (0, 0))

        response = await self._coordinated(group_id, send, lambda r: r.error_code)
        if response.error_code:
            raise for_code(response.error_code, response.error_message)
        return {
            (t.topic_name, p.partition_index): _error(p.error_code, p.error_message)
            for t in response.responses
            for p in t.partitions
        }

    async def delete_share_group_offsets(
        self, group_id: str, topics: Iterable[str]
    ) -> dict[str, KafkaError | None]:
        """Forget a share group's state for whole topics; the group must be empty."""
        req = messages.DeleteShareGroupOffsetsRequest
        body = req(
            group_id=group_id,
            topics=[req.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in topics],
        )

        async def send(node: int) -> Any:
            return await self.cluster.request(node, ApiKey.DELETE_SHARE_GROUP_OFFSETS, body, (0, 0))

        response = await self._coordinated(group_id, send, lambda r: r.error_code)
        if response.error_code:
            raise for_code(response.error_code, response.error_message)
        return {t.topic_name: _error(t.error_code, t.error_message) for t in response.responses}

    # ---- configs -----------------------------------------------------------------------------------

    async def describe_configs(
        self, resource_type: int, name: str, keys: Iterable[str] | None = None
    ) -> ConfigDescription:
        """Configs of one resource (RESOURCE_TOPIC, RESOURCE_GROUP or RESOURCE_BROKER)."""
        req = messages.DescribeConfigsRequest
        body = req(
            resources=[
                req.DescribeConfigsResource(
                    resource_type=resource_type, resource_name=name, configuration_keys=None if keys is None else list(keys)
                )
            ],
            include_synonyms=False,
            include_documentation=False,
        )
        if resource_type == RESOURCE_BROKER and name.isdigit() and int(name) in self.cluster.brokers:
            response = await self.cluster.request(int(name), ApiKey.DESCRIBE_CONFIGS, body, (1, 4))
        else:
            response = await self._any(ApiKey.DESCRIBE_CONFIGS, body, (1, 4))
        r = response.results[0]
        entries = {
            c.name: ConfigEntry(c.name, c.value, bool(c.read_only), c.config_source, bool(c.is_sensitive))
            for c in r.configs
        }
        return ConfigDescription(r.resource_type, r.resource_name, entries, _error(r.error_code, r.error_message))

    async def incremental_alter_configs(
        self, resource_type: int, name: str, configs: Mapping[str, str | None], *, validate_only: bool = False
    ) -> KafkaError | None:
        """SET each key to its value, or DELETE it (back to the default) when the value is None."""
        req = messages.IncrementalAlterConfigsRequest
        body = req(
            resources=[
                req.AlterConfigsResource(
                    resource_type=resource_type,
                    resource_name=name,
                    configs=[
                        req.AlterableConfig(
                            name=k, config_operation=OP_DELETE if v is None else OP_SET, value=v
                        )
                        for k, v in configs.items()
                    ],
                )
            ],
            validate_only=validate_only,
        )
        response = await self._any(ApiKey.INCREMENTAL_ALTER_CONFIGS, body, (0, 1))
        r = response.responses[0]
        return _error(r.error_code, r.error_message)


class Admin:
    """Synchronous facade over AsyncAdmin (background event-loop thread); same methods, blocking."""

    def __init__(self, bootstrap_servers: str | Iterable[str], **kwargs: Any):
        self._thread = LoopThread("shoal-admin")
        self._admin: AsyncAdmin = self._thread.run(self._make(bootstrap_servers, kwargs))

    @staticmethod
    async def _make(bootstrap_servers: str | Iterable[str], kwargs: dict[str, Any]) -> AsyncAdmin:
        admin = AsyncAdmin(bootstrap_servers, **kwargs)
        await admin.start()
        return admin

    def create_topics(self, topics: Iterable[NewTopic | str], **kw: Any) -> dict[str, TopicResult]:
        return self._thread.run(self._admin.create_topics(list(topics), **kw))

    def delete_topics(self, names: Iterable[str], **kw: Any) -> dict[str, KafkaError | None]:
        return self._thread.run(self._admin.delete_topics(list(names), **kw))

    def list_topics(self) -> dict[str, int]:
        return self._thread.run(self._admin.list_topics())

    def list_offsets(self, specs: Mapping[TopicPartition, str | int], **kw: Any) -> dict[TopicPartition, ListedOffset]:
        return self._thread.run(self._admin.list_offsets(dict(specs), **kw))

    def list_groups(self, types: Iterable[str] | None = None, states: Iterable[str] | None = None) -> list[GroupListing]:
        return self._thread.run(self._admin.list_groups(types, states))

    def describe_share_groups(self, group_ids: Iterable[str]) -> dict[str, ShareGroupDescription]:
        return self._thread.run(self._admin.describe_share_groups(list(group_ids)))

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, KafkaError | None]:
        return self._thread.run(self._admin.delete_groups(list(group_ids)))

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, ConsumerGroupDescription]:
        return self._thread.run(self._admin.describe_consumer_groups(list(group_ids)))

    def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        return self._thread.run(self._admin.list_consumer_group_offsets(group_id, partitions))

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, KafkaError | None]:
        return self._thread.run(self._admin.alter_consumer_group_offsets(group_id, dict(offsets)))

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, KafkaError | None]:
        return self._thread.run(self._admin.delete_consumer_group_offsets(group_id, list(partitions)))

    def list_share_group_offsets(
        self, group_id: str, topics: Mapping[str, Iterable[int]] | Iterable[str] | None = None
    ) -> dict[TopicPartition, SharePartitionOffset]:
        return self._thread.run(self._admin.list_share_group_offsets(group_id, topics))

    def alter_share_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, KafkaError | None]:
        return self._thread.run(self._admin.alter_share_group_offsets(group_id, dict(offsets)))

    def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]) -> dict[str, KafkaError | None]:
        return self._thread.run(self._admin.delete_share_group_offsets(group_id, list(topics)))

    def describe_configs(self, resource_type: int, name: str, keys: Iterable[str] | None = None) -> ConfigDescription:
        return self._thread.run(self._admin.describe_configs(resource_type, name, keys))

    def incremental_alter_configs(
        self, resource_type: int, name: str, configs: Mapping[str, str | None], **kw: Any
    ) -> KafkaError | None:
        return self._thread.run(self._admin.incremental_alter_configs(resource_type, name, dict(configs), **kw))

    def close(self) -> None:
        try:
            self._thread.run(self._admin.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
