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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from shoal.broker.common.config import BrokerConfig
from shoal.broker.storage.partition_log import AppendOrigin, AppendRefused, OffsetOutOfRange, PartitionLog
from shoal.broker.storage.topic_registry import Topic, TopicRegistry
from shoal.protocol.records import Header, RecordInput, decode_batches, encode_batch

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


class NotDeadLettered(Exception):
    """The group's dead-letter topic is not usable now; the records are archived without one."""


# Records in ARCHIVING: (first offset, last offset, delivery count, rejected by a consumer)
Run = tuple[int, int, int, bool]


@dataclass(frozen=True, slots=True)
class Source:
    group_id: str
    topic: str
    partition: int
    log: PartitionLog


class DeadLetterWriter:
    def __init__(
        self,
        topics: TopicRegistry,
        broker_config: BrokerConfig,
        group_configs: GroupConfigs,
        on_topic_created: Callable[[Topic], None],
        partition_budget: Callable[[int], str | None] = lambda _n: None,
    ) -> None:
        self.topics = topics
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
        name = self.group_configs.get(group_id, DLQ_TOPIC_NAME)
        if not name:
            raise NotDeadLettered(f"Configured DLQ topic name in share group: {group_id} is empty.")
        if name.startswith("__"):
            raise NotDeadLettered(
                f"Configured DLQ topic name in share group: {group_id} cannot start with __, topic: {name}.")
        topic = self.topics.get(name)
        if topic is not None and not dead_letter_enabled(topic.configs):
            raise NotDeadLettered(
                f"DLQ is not enabled on configured DLQ topic for share group: {group_id}, topic: {name}.")
        if topic is None and not self.broker_config["errors.deadletterqueue.auto.create.topics.enable"]:
            raise NotDeadLettered(
                "DLQ topic does not exist and auto create is disabled on cluster for share group: "
                f"{group_id}, topic: {name}.")
        prefix = str(self.broker_config[DLQ_TOPIC_NAME_PREFIX])
        if prefix and not name.startswith(prefix):
            raise NotDeadLettered(
                "Configured DLQ topic name does not comply with the DLQ topic prefix in share group: "
                f"{group_id}, topic: {name}, prefix: {prefix}.")
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

    async def write(self, source: Source, runs: Sequence[Run], *, skip_existing: bool) -> int:
        """Append and fsync one dead-letter record per offset of `runs`; returns how many were written.

        Raises NotDeadLettered when the group's dead-letter topic cannot be used.
        """
        topic = self.target(source.group_id)
        index = source.partition % len(topic.partitions)
        dlq_log = topic.partitions[index]
        # The reason is the one the archiving transition recorded, not a guess from the delivery count:
        # a REJECT on the last allowed delivery is a rejection.
        offsets = [(o, count, REASON_REJECTED if rejected else REASON_DELIVERY_COUNT)
                   for first, last, count, rejected in runs for o in range(first, last + 1)]
        if skip_existing:
            present = await already_dead_lettered(dlq_log, source)
            offsets = [x for x in offsets if x[0] not in present]
        if not offsets:
            return 0
        copies = await self._copies(source, offsets) \
            if self.group_configs.get_bool(source.group_id, GROUP_COPY_RECORD) else {}
        now = int(time.time() * 1000)
        records = []
        for offset, count, reason in offsets:
            key, value = copies.get(offset, (None, None))
            headers = [
                Header(HEADER_TOPIC, source.topic.encode()),
                Header(HEADER_PARTITION, str(source.partition).encode()),
                Header(HEADER_OFFSET, str(offset).encode()),
                Header(HEADER_GROUP, source.group_id.encode()),
                Header(HEADER_DELIVERY_COUNT, str(count).encode()),
                Header(HEADER_MESSAGE, reason.encode()),
            ]
            records.append(RecordInput(key=key, value=value, headers=headers, timestamp=now))
        batches = b"".join(encode_batch(chunk) for chunk in _chunks(records, dlq_log.config.produce.max_message_bytes))
        try:
            # The topic's rules (compression.type, timestamps, max.message.bytes) apply as to a produce, and
            # long polls on the partition wake.
            result = dlq_log.append_as_leader(batches, origin=AppendOrigin.COORDINATOR)
        except AppendRefused as exc:
            raise NotDeadLettered(f"The DLQ topic {topic.name} refused the records: {exc}") from exc
        await dlq_log.flush(result.last_offset + 1)
        if self.on_written is not None:
            self.on_written(source.group_id, len(records))
        return len(records)

    @staticmethod
    async def _copies(source: Source, offsets: list[tuple[int, int, str]]) -> dict[int, tuple[bytes | None, bytes | None]]:
        """Key and value of each offset still in the source log (retention may have removed some)."""
        wanted = {o for o, _c, _r in offsets}
        out: dict[int, tuple[bytes | None, bytes | None]] = {}
        cursor, last = offsets[0][0], offsets[-1][0]
        while cursor <= last:
            try:
                data = source.log.read(max(cursor, source.log.log_start_offset), _READ_BYTES)
            except OffsetOutOfRange:
                break
            if not data:
                break
            records = decode_batches(data)
            if not records:
                break
            for rec in records:
                if rec.offset in wanted:
                    out[rec.offset] = (rec.key, rec.value)
            cursor = records[-1].offset + 1
            await asyncio.sleep(0)
        return out


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


async def already_dead_lettered(dlq_log: PartitionLog, source: Source) -> set[int]:
    """Source offsets of `source`'s share partition that already have a record in `dlq_log`.

    The whole partition is read, one slice at a time with a turn for the event loop after each, so
    requests keep being answered while a large dead-letter partition is scanned."""
    found: set[int] = set()
    want_group, want_topic, want_partition = source.group_id.encode(), source.topic.encode(), str(source.partition).encode()
    cursor = dlq_log.log_start_offset
    while cursor < dlq_log.log_end_offset:
        data = dlq_log.read(cursor, _SCAN_BYTES)
        if not data:
            break
        records = decode_batches(data)
        if not records:
            break
        for rec in records:
            h = {x.key: x.value for x in rec.headers}
            if h.get(HEADER_GROUP) == want_group and h.get(HEADER_TOPIC) == want_topic \
                    and h.get(HEADER_PARTITION) == want_partition and h.get(HEADER_OFFSET) is not None:
                found.add(int(h[HEADER_OFFSET] or b"-1"))
        cursor = records[-1].offset + 1
        await asyncio.sleep(0)
    return found
