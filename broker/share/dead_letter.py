"""Dead-letter topics for share groups (KIP-1191): the records a share-partition leader gives up on.

A record that a consumer REJECTs, or that reaches the delivery count limit, in a group whose
`errors.deadletterqueue.topic.name` is set goes ACQUIRED -> ARCHIVING (persisted with
WriteShareGroupState) -> dead-letter record appended to the dead-letter topic and fsynced -> ARCHIVED
(persisted). This module writes the dead-letter records; the leader drives the state changes.

Crash safety comes from the share-state log, not from producer idempotence: ARCHIVING is durable
before the dead-letter record is written, so a crash before the append leaves the record ARCHIVING and
the leader writes it after loading the state again (nothing lost). A crash after the append but before
ARCHIVED was persisted also leaves it ARCHIVING; the first write after a load therefore first scans the
dead-letter partition for records already there for the same group, topic, partition and offset and
skips them (nothing twice). The scan runs only when a loaded state holds ARCHIVING records, that is
after a crash or fencing in the middle of dead-lettering.

Kafka checks the prefix and the topic's opt-in when it writes. Shoal also checks them when the group
config is set (`group_configs`), but a topic created later, a changed prefix or a topic whose opt-in was
turned off can still fail them here. A record that cannot be dead-lettered is archived without a
dead-letter record, and the reason is logged with Kafka's wording.

In sidecar mode (`UpstreamDeadLetters`) the dead-letter topic is on the upstream: the records, with the
same headers, are produced with acks=all through the forwarding path, the topic is created there if
missing (with the upstream's partition count and replication factor), and the recovery scan reads the
upstream partition. An upstream that does not know the topic opt-in (Kafka before KIP-1191) neither
stores nor reports it; the group's dead-letter topic config is then the only opt-in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from shoal.broker.common.config import BrokerConfig
from shoal.broker.storage.partition_log import AppendOrigin, AppendRefused, PartitionLog
from shoal.broker.storage.partition_source import EARLIEST, LATEST, LocalPartitionSource, PartitionSource
from shoal.broker.storage.topic_registry import Topic, TopicRegistry
from shoal.broker.upstream.produce import produce_acks_all
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import Header, Record, RecordInput, decode_batches, encode_batch

from .group_configs import (
    DLQ_TOPIC_ENABLE,
    DLQ_TOPIC_NAME,
    DLQ_TOPIC_NAME_PREFIX,
    GroupConfigs,
    dead_letter_enabled,
)

log = structlog.get_logger("shoal.dead_letter")

HEADER_TOPIC = "__dlq.errors.topic"
HEADER_PARTITION = "__dlq.errors.partition"
HEADER_OFFSET = "__dlq.errors.offset"
HEADER_GROUP = "__dlq.errors.group"
HEADER_DELIVERY_COUNT = "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"

REASON_REJECTED = "Offset rejected by client."
REASON_DELIVERY_COUNT = "Offset delivery count exceeded the threshold."

GROUP_COPY_RECORD = "errors.deadletterqueue.copy.record.enable"

# Source records are read in slices of this size when copying, and the recovery scan reads the dead-letter
# partition in slices of this size; the event loop gets a turn between slices, so neither stalls it.
_READ_BYTES = 1024 * 1024
_SCAN_BYTES = 1024 * 1024
_BATCH_OVERHEAD = 61  # v2 batch header
_RECORD_OVERHEAD = 24  # upper bound of a record's varint fields without its key, value and headers


if TYPE_CHECKING:
    from shoal.broker.upstream.forwarder import Forwarder
    from shoal.broker.upstream.topics import UpstreamTopics


class NotDeadLettered(Exception):
    """The group's dead-letter topic is not usable now; the records are archived without one."""


# Records in ARCHIVING: (first offset, last offset, delivery count, rejected by a consumer)
Run = tuple[int, int, int, bool]


@dataclass(frozen=True, slots=True)
class Source:
    group_id: str
    topic: str
    partition: int
    log: PartitionLog | PartitionSource  # the local log, or the upstream partition in sidecar mode


def _reader(log_or_source: PartitionLog | PartitionSource) -> PartitionSource:
    return LocalPartitionSource(log_or_source) if isinstance(log_or_source, PartitionLog) else log_or_source


class DeadLetterWriter:
    def __init__(
        self,
        topics: TopicRegistry,
        broker_config: BrokerConfig,
        group_configs: GroupConfigs,
        on_topic_created: Callable[[Topic], None],
        partition_budget: Callable[[int], str | None] = lambda _n: None,
        upstream: UpstreamDeadLetters | None = None,
    ) -> None:
        self.topics = topics
        self.upstream = upstream  # sidecar mode: dead-letter topics live on the upstream
        self.broker_config = broker_config
        self.group_configs = group_configs
        self.on_topic_created = on_topic_created
        self.partition_budget = partition_budget  # why n more partitions cannot be created, or None
        # Metric hook: (group, records written), called once per append.
        self.on_written: Callable[[str, int], None] | None = None

    def enabled(self, group_id: str) -> bool:
        return bool(self.group_configs.get(group_id, DLQ_TOPIC_NAME))

    def target(self, group_id: str) -> Topic:
        """The group's dead-letter topic, created if allowed; NotDeadLettered says why not (Kafka's words)."""
        name = self._configured_name(group_id)
        topic = self.topics.get(name)
        if topic is not None and not dead_letter_enabled(topic.configs):
            raise NotDeadLettered(
                f"DLQ is not enabled on configured DLQ topic for share group: {group_id}, topic: {name}.")
        if topic is None and not self.broker_config["errors.deadletterqueue.auto.create.topics.enable"]:
            raise NotDeadLettered(
                "DLQ topic does not exist and auto create is disabled on cluster for share group: "
                f"{group_id}, topic: {name}.")
        self._check_prefix(group_id, name)
        if topic is None:
            partitions = int(self.broker_config["num.partitions"])
            problem = self.partition_budget(partitions)
            if problem is not None:
                raise NotDeadLettered(problem)
            # The record timestamps are the dead-letter time, so pin CreateTime as Kafka does.
            topic = self.topics.create(name, partitions,
                                       {DLQ_TOPIC_ENABLE: "true", "message.timestamp.type": "CreateTime"})
            self.on_topic_created(topic)
            log.info("dead-letter topic created", topic=name, group=group_id)
        return topic

    def topic_name(self, topic_id: bytes) -> str | None:
        """The name of a share partition's topic: the local one, or the upstream's in sidecar mode."""
        if self.upstream is not None:
            found = self.upstream.topics.topic_by_id(topic_id)
            return None if found is None else found[0]
        topic = self.topics.get_by_id(topic_id)
        return None if topic is None else topic.name

    def _configured_name(self, group_id: str) -> str:
        name = self.group_configs.get(group_id, DLQ_TOPIC_NAME)
        if not name:
            raise NotDeadLettered(f"Configured DLQ topic name in share group: {group_id} is empty.")
        if name.startswith("__"):
            raise NotDeadLettered(
                f"Configured DLQ topic name in share group: {group_id} cannot start with __, topic: {name}.")
        return name

    def _check_prefix(self, group_id: str, name: str) -> None:
        prefix = str(self.broker_config[DLQ_TOPIC_NAME_PREFIX])
        if prefix and not name.startswith(prefix):
            raise NotDeadLettered(
                "Configured DLQ topic name does not comply with the DLQ topic prefix in share group: "
                f"{group_id}, topic: {name}, prefix: {prefix}.")

    async def write(self, source: Source, runs: Sequence[Run], *, skip_existing: bool) -> int:
        """Append and fsync (sidecar mode: produce with acks=all to the upstream) one dead-letter record per
        offset of `runs`; returns how many were written.

        Raises NotDeadLettered when the group's dead-letter topic cannot be used.
        """
        if self.upstream is not None:
            name = self._configured_name(source.group_id)
            target = await self.upstream.target(source.group_id, name, source.partition,
                                                lambda: self._check_prefix(source.group_id, name))
            return await self._write(source, runs, target, skip_existing=skip_existing)
        topic = self.target(source.group_id)
        dlq_log = topic.partitions[source.partition % len(topic.partitions)]
        return await self._write(source, runs, _LocalTarget(topic.name, dlq_log), skip_existing=skip_existing)

    async def _write(self, source: Source, runs: Sequence[Run], target: _Target, *, skip_existing: bool) -> int:
        # The reason is the one the archiving transition recorded, not a guess from the delivery count:
        # a REJECT on the last allowed delivery is a rejection.
        offsets = [(o, count, REASON_REJECTED if rejected else REASON_DELIVERY_COUNT)
                   for first, last, count, rejected in runs for o in range(first, last + 1)]
        if skip_existing:
            present = await already_dead_lettered(target.reader, source)
            offsets = [x for x in offsets if x[0] not in present]
        if not offsets:
            return 0
        copies = await self._copies(source, offsets) \
            if self.group_configs.get_bool(source.group_id, GROUP_COPY_RECORD) else {}
        now = int(time.time() * 1000)
        records = []
        for offset, count, reason in offsets:
            key, value = copies.get(offset, (None, None))
            records.append(RecordInput(key=key, value=value, headers=_headers(source, offset, count, reason),
                                       timestamp=now))
        await target.append([encode_batch(chunk) for chunk in _chunks(records, target.max_message_bytes)])
        if self.on_written is not None:
            self.on_written(source.group_id, len(records))
        return len(records)

    @staticmethod
    async def _copies(source: Source, offsets: list[tuple[int, int, str]]) -> dict[int, tuple[bytes | None, bytes | None]]:
        """Key and value of each offset still in the source log (retention may have removed some)."""
        wanted = {o for o, _c, _r in offsets}
        out: dict[int, tuple[bytes | None, bytes | None]] = {}
        reader = _reader(source.log)
        cursor = max(offsets[0][0], await reader.list_offset(EARLIEST))
        async for records in _records_from(reader, cursor, offsets[-1][0] + 1, _READ_BYTES):
            for rec in records:
                if rec.offset in wanted:
                    out[rec.offset] = (rec.key, rec.value)
        return out


def _headers(source: Source, offset: int, count: int, reason: str) -> list[Header]:
    return [
        Header(HEADER_TOPIC, source.topic.encode()),
        Header(HEADER_PARTITION, str(source.partition).encode()),
        Header(HEADER_OFFSET, str(offset).encode()),
        Header(HEADER_GROUP, source.group_id.encode()),
        Header(HEADER_DELIVERY_COUNT, str(count).encode()),
        Header(HEADER_MESSAGE, reason.encode()),
    ]


async def _records_from(reader: PartitionSource, cursor: int, end: int, slice_bytes: int
                        ) -> AsyncIterator[list[Record]]:
    """The records of `reader` from `cursor` up to `end` (exclusive), one slice at a time with a turn for
    the event loop after each, so requests keep being answered while a large range is read."""
    while cursor < end:
        read = await reader.read(cursor, slice_bytes)
        if not read.batches:
            return
        records = decode_batches(b"".join(view for _header, view in read.batches))
        if not records:
            return
        yield [rec for rec in records if rec.offset < end]
        cursor = read.batches[-1][0].last_offset + 1
        await asyncio.sleep(0)


class _Target(Protocol):
    """One partition of a dead-letter topic."""

    @property
    def max_message_bytes(self) -> int: ...
    @property
    def reader(self) -> PartitionSource: ...
    async def append(self, batches: list[bytes]) -> None:
        """The batches, each within max.message.bytes; durable when it returns; NotDeadLettered when the
        topic refuses the records."""
        ...


class _LocalTarget:
    def __init__(self, topic: str, dlq_log: PartitionLog):
        self.topic, self.dlq_log = topic, dlq_log
        self.max_message_bytes = dlq_log.config.produce.max_message_bytes
        self.reader: PartitionSource = LocalPartitionSource(dlq_log)

    async def append(self, batches: list[bytes]) -> None:
        dlq_log = self.dlq_log
        try:
            # The topic's rules (compression.type, timestamps, max.message.bytes) apply as to a produce, and
            # long polls on the partition wake.
            result = dlq_log.append_as_leader(b"".join(batches), origin=AppendOrigin.COORDINATOR)
        except AppendRefused as exc:
            raise NotDeadLettered(f"The DLQ topic {self.topic} refused the records: {exc}") from exc
        await dlq_log.flush(result.last_offset + 1)


def _chunks(records: list[RecordInput], max_batch_bytes: int) -> list[list[RecordInput]]:
    """Records split into batches within the topic's max.message.bytes (a record too big goes alone)."""
    out: list[list[RecordInput]] = [[]]
    size = _BATCH_OVERHEAD
    for rec in records:
        n = _RECORD_OVERHEAD + len(rec.key or b"") + len(rec.value or b"") + sum(
            len(h.key) + len(h.value or b"") + 4 for h in rec.headers if isinstance(h, Header))
        if out[-1] and size + n > max_batch_bytes:
            out.append([])
            size = _BATCH_OVERHEAD
        out[-1].append(rec)
        size += n
    return out


async def already_dead_lettered(dlq_log: PartitionLog | PartitionSource, source: Source) -> set[int]:
    """Source offsets of `source`'s share partition that already have a record in `dlq_log`.

    The whole partition is read, one slice at a time with a turn for the event loop after each, so
    requests keep being answered while a large dead-letter partition is scanned."""
    found: set[int] = set()
    want_group, want_topic, want_partition = source.group_id.encode(), source.topic.encode(), str(source.partition).encode()
    reader = _reader(dlq_log)
    start, end = await reader.list_offset(EARLIEST), await reader.list_offset(LATEST)
    async for records in _records_from(reader, start, end, _SCAN_BYTES):
        for rec in records:
            h = {x.key: x.value for x in rec.headers}
            if h.get(HEADER_GROUP) == want_group and h.get(HEADER_TOPIC) == want_topic \
                    and h.get(HEADER_PARTITION) == want_partition and h.get(HEADER_OFFSET) is not None:
                found.add(int(h[HEADER_OFFSET] or b"-1"))
    return found


# ---- sidecar mode -----------------------------------------------------------------------------------

# Kafka's default max.message.bytes: the upstream topic's own setting is not read, so batches stay below it.
_UPSTREAM_MAX_BATCH_BYTES = 1024 * 1024
_CREATE_TOPICS_VERSION = 5
_DESCRIBE_CONFIGS_VERSION = 4
_CONFIG_TOPIC = 2  # ConfigResource.Type.TOPIC


class UpstreamDeadLetters:
    """Dead-letter topics on the upstream, written through the sidecar's forwarding path."""

    def __init__(self, forwarder: Forwarder, topics: UpstreamTopics, broker_config: BrokerConfig,
                 timeout_ms: int = 30_000):
        self.forwarder = forwarder
        self.topics = topics
        self.broker_config = broker_config
        self.timeout_ms = timeout_ms

    async def target(self, group_id: str, name: str, source_partition: int,
                     check_prefix: Callable[[], None]) -> _UpstreamTarget:
        """The partition of the group's dead-letter topic for `source_partition`, the topic created first
        if it is missing and auto-creation is on; the checks in Kafka's order (see DeadLetterWriter.target)."""
        found = self.topics.topic_by_name(name)
        if found is None:
            await self.forwarder.cluster.refresh_metadata([name])
            found = self.topics.topic_by_name(name)
        if found is not None and not await self._opted_in(name):
            raise NotDeadLettered(
                f"DLQ is not enabled on configured DLQ topic for share group: {group_id}, topic: {name}.")
        if found is None and not self.broker_config["errors.deadletterqueue.auto.create.topics.enable"]:
            raise NotDeadLettered(
                "DLQ topic does not exist and auto create is disabled on cluster for share group: "
                f"{group_id}, topic: {name}.")
        check_prefix()
        if found is None:
            await self._create(name)
            log.info("dead-letter topic created on the upstream", topic=name, group=group_id)
            await self.forwarder.cluster.refresh_metadata([name])
            found = self.topics.topic_by_name(name)
            if found is None:
                raise NotDeadLettered(f"The DLQ topic {name} is not in the upstream's metadata yet.")
        topic_id, partitions = found
        index = source_partition % partitions
        reader = self.topics.source(topic_id, index)
        if reader is None:
            raise NotDeadLettered(f"The DLQ topic {name} has no partition {index} on the upstream.")
        return _UpstreamTarget(self, name, index, reader)

    async def _opted_in(self, name: str) -> bool:
        """The topic's opt-in as the upstream reports it; an upstream that does not report the key (Kafka
        before KIP-1191) cannot hold it, and the group's config alone decides."""
        resource = messages.DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=_CONFIG_TOPIC, resource_name=name, configuration_keys=[DLQ_TOPIC_ENABLE])
        response = await self.forwarder.to_any_broker(
            ApiKey.DESCRIBE_CONFIGS, messages.DescribeConfigsRequest(resources=[resource]), _DESCRIBE_CONFIGS_VERSION)
        for result in response.results:
            if result.error_code != ErrorCode.NONE:
                raise NotDeadLettered(f"The upstream could not describe the DLQ topic {name}: error {result.error_code}.")
            for entry in result.configs:
                if entry.name == DLQ_TOPIC_ENABLE:
                    return dead_letter_enabled({DLQ_TOPIC_ENABLE: entry.value or ""})
        return True

    async def _create(self, name: str) -> None:
        """With the upstream's default partition count and replication factor; without the opt-in when the
        upstream does not know it."""
        base = {"message.timestamp.type": "CreateTime"}
        for configs in ({DLQ_TOPIC_ENABLE: "true", **base}, base):
            topic = messages.CreateTopicsRequest.CreatableTopic(
                name=name, num_partitions=-1, replication_factor=-1, assignments=[],
                configs=[messages.CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()])
            response = await self.forwarder.to_any_broker(
                ApiKey.CREATE_TOPICS, messages.CreateTopicsRequest(topics=[topic], timeout_ms=self.timeout_ms,
                                                                   validate_only=False), _CREATE_TOPICS_VERSION)
            code = response.topics[0].error_code
            if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                return
            if code != ErrorCode.INVALID_CONFIG:
                break
        raise NotDeadLettered(f"The upstream refused to create the DLQ topic {name}: error {code}.")

    async def produce(self, topic: str, partition: int, batches: bytes) -> None:
        """Produce with acks=all, retrying what a moving leader or a just-created topic answers; the caller
        logs a failure and archives the records, as Kafka does once its retries are spent."""
        await produce_acks_all(self.forwarder, topic, partition, batches, timeout_ms=self.timeout_ms,
                               what="dead-letter records")


class _UpstreamTarget:
    max_message_bytes = _UPSTREAM_MAX_BATCH_BYTES

    def __init__(self, owner: UpstreamDeadLetters, topic: str, partition: int, reader: PartitionSource):
        self.owner, self.topic, self.partition, self.reader = owner, topic, partition, reader

    async def append(self, batches: list[bytes]) -> None:
        # Kafka takes one batch per partition in a Produce: several (records over max.message.bytes) go in
        # turn. A retry after a partial write skips the offsets already in the topic.
        for batch in batches:
            await self.owner.produce(self.topic, self.partition, batch)
