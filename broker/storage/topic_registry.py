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

from shoal.broker.common.config import BrokerConfig, cleanup_policies, valid_cleanup_policy
from shoal.protocol.errors import shorten
from shoal.protocol.uuids import uuid_to_str as topic_id_to_str

from .partition_log import LogConfig, PartitionLog

log = structlog.get_logger("shoal.topics")

REGISTRY_FILE = "shoal-topics.json"
CONSUMER_OFFSETS = "__consumer_offsets"
SHARE_GROUP_STATE = "__share_group_state"
TRANSACTION_STATE = "__transaction_state"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE})
# The broker setting that gives each internal topic its partition count, once, when the topic is created.
INTERNAL_TOPIC_PARTITIONS_KEYS = {
    CONSUMER_OFFSETS: "offsets.topic.num.partitions",
    SHARE_GROUP_STATE: "share.coordinator.state.topic.num.partitions",
    TRANSACTION_STATE: "transaction.state.log.num.partitions",
}
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249

# Topic-level configs a user may set, with the broker key each one overrides.
TOPIC_CONFIG_KEYS: dict[str, str | None] = {
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": None,
    "min.insync.replicas": None,
    "index.interval.bytes": "log.index.interval.bytes",
    "errors.deadletterqueue.group.enable": None,
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
}
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "compression.type": "producer",
    "min.insync.replicas": "1",
    # KIP-1191: a topic takes dead-lettered records of share groups only when its owner opts in.
    "errors.deadletterqueue.group.enable": "false",
}

_BOOLEAN_TOPIC_CONFIGS = frozenset({"errors.deadletterqueue.group.enable"})

_INT = (-(1 << 31), (1 << 31) - 1)
_LONG = (-(1 << 63), (1 << 63) - 1)
# Numeric topic configs: (type range, minimum), as Kafka's LogConfig defines them.
_NUMERIC_TOPIC_CONFIGS: dict[str, tuple[tuple[int, int], int | None]] = {
    "retention.ms": (_LONG, -1),
    "retention.bytes": (_LONG, None),
    "segment.bytes": (_INT, 14),
    "flush.messages": (_LONG, 1),
    "flush.ms": (_LONG, 0),
    "max.message.bytes": (_INT, 0),
    "min.insync.replicas": (_INT, 1),
    "index.interval.bytes": (_INT, 0),
    "delete.retention.ms": (_LONG, 0),
    "min.compaction.lag.ms": (_LONG, 0),
    "max.compaction.lag.ms": (_LONG, 1),
}
# Double topic configs with Kafka's bounds.
_DOUBLE_TOPIC_CONFIGS: dict[str, tuple[float, float]] = {"min.cleanable.dirty.ratio": (0.0, 1.0)}
_CHOICES: dict[str, tuple[str, ...]] = {
    "message.timestamp.type": ("CreateTime", "LogAppendTime"),
    "compression.type": ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
}
def validate_topic_config(key: str, value: str | None) -> str | None:
    """None if `key=value` is a legal topic config (value None = reset to default), else Kafka's reason."""
    if key not in TOPIC_CONFIG_KEYS:
        return f"Unknown topic config name: {shorten(key)}"
    if value is None:
        return None
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            return f"Invalid value {shorten(value)} for configuration {key}: String must be one of: {', '.join(_CHOICES[key])}"
        return None
    if key in _BOOLEAN_TOPIC_CONFIGS:
        if value.strip().lower() not in ("true", "false"):
            return f"Invalid value {shorten(value)} for configuration {key}: Expected value to be either true or false"
        return None
    if key == "cleanup.policy":
        if not valid_cleanup_policy(value):
            return f"Invalid value {shorten(value)} for configuration {key}: String must be one of: compact, delete"
        return None
    if key in _DOUBLE_TOPIC_CONFIGS:
        return _validate_double(key, value, *_DOUBLE_TOPIC_CONFIGS[key])
    (low, high), minimum = _NUMERIC_TOPIC_CONFIGS[key]
    try:
        number = int(value.strip())
    except ValueError:
        return f"Invalid value {shorten(value)} for configuration {key}: Not a number of type {'INT' if low == _INT[0] else 'LONG'}"
    if not low <= number <= high:
        return f"Invalid value {shorten(value)} for configuration {key}: out of range"
    if minimum is not None and number < minimum:
        return f"Invalid value {number} for configuration {key}: Value must be at least {minimum}"
    return None


def _validate_double(key: str, value: str, low: float, high: float) -> str | None:
    try:
        number = float(value.strip())
    except ValueError:
        return f"Invalid value {shorten(value)} for configuration {key}: Not a number of type DOUBLE"
    if number < low:
        return f"Invalid value {number} for configuration {key}: Value must be at least {low}"
    if number > high:
        return f"Invalid value {number} for configuration {key}: Value must be no more than {high}"
    return None


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
    def __init__(self, data_dir: Path, broker_config: BrokerConfig):
        self.data_dir = data_dir
        self.broker_config = broker_config
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
            cfg = self.log_config(topic.configs)
            topic.partitions = [
                PartitionLog.open(self.partition_dir(topic.name, p), cfg) for p in range(entry["partitions"])
            ]
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

        def pick(topic_key: str, broker_value: int) -> int:
            return int(overrides[topic_key]) if topic_key in overrides else broker_value

        flush_ms = pick("flush.ms", int(bc["log.flush.interval.ms"]))
        policy = overrides.get("cleanup.policy", str(bc["log.cleanup.policy"]))
        policies = cleanup_policies(policy)
        ratio = overrides.get("min.cleanable.dirty.ratio")
        return LogConfig(
            cleanup_delete="delete" in policies,
            compact="compact" in policies,
            min_cleanable_dirty_ratio=float(ratio) if ratio is not None else float(bc["log.cleaner.min.cleanable.ratio"]),
            min_compaction_lag_ms=pick("min.compaction.lag.ms", int(bc["log.cleaner.min.compaction.lag.ms"])),
            max_compaction_lag_ms=pick("max.compaction.lag.ms", int(bc["log.cleaner.max.compaction.lag.ms"])),
            delete_retention_ms=pick("delete.retention.ms", int(bc["log.cleaner.delete.retention.ms"])),
            segment_bytes=pick("segment.bytes", int(bc["log.segment.bytes"])),
            retention_ms=pick("retention.ms", bc.retention_ms()),
            retention_bytes=pick("retention.bytes", int(bc["log.retention.bytes"])),
            flush_interval_messages=pick("flush.messages", int(bc["log.flush.interval.messages"])),
            flush_interval_ms=flush_ms if flush_ms > 0 else None,
            index_interval_bytes=pick("index.interval.bytes", int(bc["log.index.interval.bytes"])),
        )

    def effective_config(self, topic: Topic) -> dict[str, tuple[str, bool]]:
        """Every topic config with its value and whether it was set on the topic (vs. a default)."""
        out: dict[str, tuple[str, bool]] = {}
        for key, broker_key in TOPIC_CONFIG_KEYS.items():
            if key in topic.configs:
                out[key] = (topic.configs[key], True)
            elif key == "retention.ms":
                out[key] = (str(self.broker_config.retention_ms()), False)
            elif broker_key is not None:
                out[key] = (str(self.broker_config[broker_key]), False)
            else:
                out[key] = (TOPIC_CONFIG_DEFAULTS[key], False)
        return out

    # ---- changes -------------------------------------------------------------------------------

    def create(self, name: str, num_partitions: int, configs: dict[str, str] | None = None) -> Topic:
        if name in self.by_name:
            raise ValueError(f"topic {name} already exists")
        topic_id = uuid.uuid4().bytes
        configs = dict(configs or {})
        cfg = self.log_config(configs)
        partitions = [PartitionLog.open(self.partition_dir(name, p), cfg) for p in range(num_partitions)]
        topic = Topic(name, topic_id, partitions, configs, num_partitions)
        self._index(topic)
        self._save()
        log.info("topic created", topic=name, partitions=num_partitions, topic_id=topic_id_to_str(topic_id))
        return topic

    def add_partitions(self, topic: Topic, total: int) -> None:
        cfg = self.log_config(topic.configs)
        for p in range(len(topic.partitions), total):
            topic.partitions.append(PartitionLog.open(self.partition_dir(topic.name, p), cfg))
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
        self._save()

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
