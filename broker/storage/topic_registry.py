"""Topics this broker holds: names, stable topic ids, partition logs, per-topic configs.

The registry is persisted as one small JSON file replaced atomically, so topic ids survive restarts;
the partition data itself lives in `<log.dirs>/<topic>-<partition>/` as Kafka lays it out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from shoal.broker.common.config import BrokerConfig
from shoal.broker.common.metrics import BrokerMetrics
from shoal.broker.common.purgatory import Purgatory
from shoal.protocol.errors import shorten
from shoal.protocol.uuids import uuid_to_str as topic_id_to_str

from .log_config import (
    ConfigValue,
    ProducePolicy,
    cleanup_flags,
    effective_configs,
    effective_value,
    note_no_effect,
    segment_bytes,
    validate_topic_config,
)
from .partition_log import LogConfig, LogContext, PartitionLog

log = structlog.get_logger("shoal.topics")

REGISTRY_FILE = "shoal-topics.json"
CONSUMER_OFFSETS = "__consumer_offsets"
SHARE_GROUP_STATE = "__share_group_state"
TRANSACTION_STATE = "__transaction_state"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE})
__all__ = ["validate_topic_config"]  # re-exported: the handlers validate through the registry's module
# The broker setting that gives each internal topic its partition count, once, when the topic is created.
INTERNAL_TOPIC_PARTITIONS_KEYS = {
    CONSUMER_OFFSETS: "offsets.topic.num.partitions",
    SHARE_GROUP_STATE: "share.coordinator.state.topic.num.partitions",
    TRANSACTION_STATE: "transaction.state.log.num.partitions",
}
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249

def validate_topic_name(name: str) -> str | None:
    """None if legal, else the reason (as Kafka words it)."""
    if not name or name in (".", ".."):
        return "Topic name is illegal, it can't be empty, '.' or '..'"
    if len(name) > MAX_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters"
    if not _LEGAL_NAME.match(name):
        return f"Topic name {shorten(name)!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
    return None


@dataclass
class Topic:
    name: str
    topic_id: bytes
    partitions: list[PartitionLog]
    configs: dict[str, str] = field(default_factory=dict)
    # The partition count the topic was created with (None: a registry written before it was kept). An
    # internal topic's coordinators place their keys by it, whatever partitions were added later.
    created_partitions: int | None = None

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


class TopicRegistry:
    def __init__(self, data_dir: Path, broker_config: BrokerConfig, *, purgatory: Purgatory | None = None,
                 metrics: BrokerMetrics | None = None):
        self.data_dir = data_dir
        self.broker_config = broker_config
        # Where every partition's appends are reported: long polls woken, records and bytes counted.
        self.purgatory = purgatory
        self.metrics = metrics
        self.by_name: dict[str, Topic] = {}
        self.by_id: dict[bytes, Topic] = {}

    # ---- persistence -------------------------------------------------------------------------

    def load(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / REGISTRY_FILE
        if not path.exists():
            return
        doc = json.loads(path.read_text())
        for entry in doc["topics"]:
            topic_id = uuid.UUID(entry["id"]).bytes
            created = entry.get("created_partitions")
            topic = Topic(entry["name"], topic_id, [], dict(entry.get("configs", {})),
                          created if isinstance(created, int) and created > 0 else None)
            self._apply(topic)
            cfg = self.log_config(topic.configs)
            topic.partitions = [self._open_partition(topic.name, topic_id, p, cfg) for p in range(entry["partitions"])]
            self._index(topic)
        log.info("topics loaded", count=len(self.by_name))

    def _save(self) -> None:
        doc = {
            "topics": [
                {
                    "name": t.name,
                    "id": str(uuid.UUID(bytes=t.topic_id)),
                    "partitions": len(t.partitions),
                    "configs": t.configs,
                    **({} if t.created_partitions is None else {"created_partitions": t.created_partitions}),
                }
                for t in self.by_name.values()
            ]
        }
        path = self.data_dir / REGISTRY_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # ---- queries -------------------------------------------------------------------------------

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _open_partition(self, topic: str, topic_id: bytes, partition: int, cfg: LogConfig) -> PartitionLog:
        context = LogContext(topic, topic_id, partition, topic in INTERNAL_TOPICS, self.purgatory, self.metrics)
        return PartitionLog.open(self.partition_dir(topic, partition), cfg, context)

    def get(self, name: str) -> Topic | None:
        return self.by_name.get(name)

    def get_by_id(self, topic_id: bytes) -> Topic | None:
        return self.by_id.get(topic_id)

    @property
    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.by_name.values())

    def partition(self, name: str, index: int) -> PartitionLog | None:
        topic = self.by_name.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def log_config(self, overrides: dict[str, str]) -> LogConfig:
        bc = self.broker_config

        def pick(key: str) -> int:
            return int(effective_value(key, overrides, bc))

        flush_ms = pick("flush.ms")
        delete, compact = cleanup_flags(overrides, bc)
        return LogConfig(
            cleanup_delete=delete,
            compact=compact,
            min_cleanable_dirty_ratio=float(effective_value("min.cleanable.dirty.ratio", overrides, bc)),
            min_compaction_lag_ms=pick("min.compaction.lag.ms"),
            max_compaction_lag_ms=pick("max.compaction.lag.ms"),
            delete_retention_ms=pick("delete.retention.ms"),
            segment_bytes=segment_bytes(overrides, bc),
            retention_ms=pick("retention.ms"),
            retention_bytes=pick("retention.bytes"),
            flush_interval_messages=pick("flush.messages"),
            # Kafka's default flush.ms is Long.MAX_VALUE; the broker's -1 means the same: never by time.
            flush_interval_ms=flush_ms if 0 < flush_ms < (1 << 63) - 1 else None,
            index_interval_bytes=pick("index.interval.bytes"),
            segment_ms=pick("segment.ms"),
            segment_jitter_ms=pick("segment.jitter.ms"),
            segment_index_bytes=pick("segment.index.bytes"),
            preallocate=effective_value("preallocate", overrides, bc).lower() == "true",
            file_delete_delay_ms=pick("file.delete.delay.ms"),
            produce=ProducePolicy.of(overrides, bc),
        )

    def configs_of(self, topic: Topic) -> dict[str, ConfigValue]:
        """Every topic config with its value, source and synonyms, as DescribeConfigs lists them."""
        return effective_configs(topic.configs, self.broker_config)

    def effective_config(self, topic: Topic) -> dict[str, tuple[str, bool]]:
        """Every topic config with its value and whether it was set on the topic (vs. a default)."""
        return {key: (cv.value if cv.value is not None else "", cv.explicit) for key, cv in self.configs_of(topic).items()}

    def _apply(self, topic: Topic) -> None:
        note_no_effect(topic.name, topic.configs)

    # ---- changes -------------------------------------------------------------------------------

    def create(self, name: str, num_partitions: int, configs: dict[str, str] | None = None) -> Topic:
        if name in self.by_name:
            raise ValueError(f"topic {name} already exists")
        topic_id = uuid.uuid4().bytes
        configs = dict(configs or {})
        cfg = self.log_config(configs)
        partitions = [self._open_partition(name, topic_id, p, cfg) for p in range(num_partitions)]
        topic = Topic(name, topic_id, partitions, configs, num_partitions)
        self._apply(topic)
        self._index(topic)
        self._save()
        log.info("topic created", topic=name, partitions=num_partitions, topic_id=topic_id_to_str(topic_id))
        return topic

    def add_partitions(self, topic: Topic, total: int) -> None:
        cfg = self.log_config(topic.configs)
        for p in range(len(topic.partitions), total):
            topic.partitions.append(self._open_partition(topic.name, topic.topic_id, p, cfg))
        self._save()

    def set_created_partitions(self, topic: Topic, count: int) -> None:
        """Record the creation-time partition count of a topic whose registry entry predates it."""
        topic.created_partitions = count
        self._save()

    def alter_configs(self, topic: Topic, changes: list[tuple[str, str | None]]) -> None:
        for key, value in changes:
            if value is None:
                topic.configs.pop(key, None)
            else:
                topic.configs[key] = value
        cfg = self.log_config(topic.configs)
        for plog in topic.partitions:
            plog.config = cfg
        self._apply(topic)
        self._save()

    def refresh_configs(self) -> None:
        """The broker's topic defaults changed (a dynamic broker config): every topic takes them up at once."""
        for topic in self.by_name.values():
            cfg = self.log_config(topic.configs)
            for plog in topic.partitions:
                plog.config = cfg
            self._apply(topic)

    def delete(self, topic: Topic) -> None:
        self.by_name.pop(topic.name, None)
        self.by_id.pop(topic.topic_id, None)
        self._save()
        for index, plog in enumerate(topic.partitions):
            plog.close()
            shutil.rmtree(self.partition_dir(topic.name, index), ignore_errors=True)
        log.info("topic deleted", topic=topic.name)

    def _index(self, topic: Topic) -> None:
        self.by_name[topic.name] = topic
        self.by_id[topic.topic_id] = topic

    def close(self) -> None:
        for topic in self.by_name.values():
            for plog in topic.partitions:
                plog.close()
