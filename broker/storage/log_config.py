"""Per-topic configuration as Kafka 4.x's `LogConfig` defines it: every key, its type, default, broker
synonyms, documentation and validation, and what each one means on a single broker.

Keys with meaning on one node are applied (`TopicRegistry.log_config` builds the partition logs' `LogConfig`,
`ProducePolicy.of` what produce checks and rewrites). Keys about replication or tiered storage are accepted
and shown by DescribeConfigs, and logged once as having no effect, with the reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.config import (
    CLUSTER_DEFAULT,
    KEYS,
    THIS_BROKER,
    cleanup_policies,
    valid_cleanup_policy,
)
from shoal.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from shoal.protocol.errors import shorten
from shoal.protocol.recompress import recompress_batch
from shoal.protocol.record_batch import BatchHeader, iter_batches

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig

log = structlog.get_logger("shoal.topic_configs")

# DescribeConfigs' ConfigType.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 1, 2, 3, 5, 6, 7
TYPE_NAMES = {TYPE_BOOLEAN: "BOOLEAN", TYPE_STRING: "STRING", TYPE_INT: "INT", TYPE_LONG: "LONG",
              TYPE_DOUBLE: "DOUBLE", TYPE_LIST: "LIST"}
# DescribeConfigs' ConfigSource.
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

_INT = (-(1 << 31), (1 << 31) - 1)
_LONG = (-(1 << 63), (1 << 63) - 1)
_RANGES = {TYPE_INT: _INT, TYPE_LONG: _LONG}
# Kafka 4 refuses segments under 1 MiB (KIP-1030).
MIN_SEGMENT_BYTES = 1024 * 1024
# Test-only topic key (Kafka's name) that allows small segments; not listed by DescribeConfigs.
INTERNAL_SEGMENT_BYTES = "internal.segment.bytes"
# The smallest v2 batch: a segment must hold one.
_MIN_INTERNAL_SEGMENT_BYTES = 14

_REPLICATION = "this broker holds the only replica of every partition, so there is no replication to tune"
_TIERED = "this broker has no remote (tiered) storage; every segment stays in its log directory"
_DOWNCONVERSION = "Kafka 4 no longer down-converts records for old clients; the key is kept as a no-op"


@dataclass(frozen=True, slots=True)
class Synonym:
    """A broker key that gives a topic key its default, with the factor that turns its unit into the topic's."""

    name: str
    factor: int = 1


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    name: str
    type: int
    default: str | None  # Kafka's default, used when no broker synonym is set
    doc: str
    synonyms: tuple[Synonym, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # Why the key changes nothing on this broker; None when it is applied.
    no_effect: str | None = None
    # The key's value may also be this sentinel (Kafka's gzip level -1 = the codec's default).
    also: int | None = None


def _s(*names: str) -> tuple[Synonym, ...]:
    return tuple(Synonym(n) for n in names)


_HOURS = 3_600_000
_MINUTES = 60_000

_DEFS: list[TopicConfigDef] = [
    TopicConfigDef("segment.bytes", TYPE_INT, "1073741824",
                   "The size of a segment file of the log; retention deletes and compaction cleans whole segments.",
                   _s("log.segment.bytes"), minimum=MIN_SEGMENT_BYTES),
    TopicConfigDef("segment.ms", TYPE_LONG, str(7 * 24 * _HOURS),
                   "The time after which the active segment is rolled even if it is not full, so retention can delete "
                   "or compact old data.", (Synonym("log.roll.ms"), Synonym("log.roll.hours", _HOURS)), minimum=1),
    TopicConfigDef("segment.jitter.ms", TYPE_LONG, "0",
                   "The most random jitter subtracted from segment.ms, so segments do not all roll at once.",
                   (Synonym("log.roll.jitter.ms"), Synonym("log.roll.jitter.hours", _HOURS)), minimum=0),
    TopicConfigDef("segment.index.bytes", TYPE_INT, "10485760",
                   "The size of a segment's offset and time indexes; a segment whose index is full is rolled.",
                   _s("log.index.size.max.bytes"), minimum=4),
    TopicConfigDef("flush.messages", TYPE_LONG, str((1 << 63) - 1),
                   "Force an fsync of the log after this many messages.", _s("log.flush.interval.messages"), minimum=1),
    TopicConfigDef("flush.ms", TYPE_LONG, str((1 << 63) - 1),
                   "Force an fsync of the log at least this often.", _s("log.flush.interval.ms"), minimum=0),
    TopicConfigDef("retention.bytes", TYPE_LONG, "-1",
                   "The most bytes a partition keeps before old segments are deleted (cleanup.policy delete); -1 "
                   "means no limit.", _s("log.retention.bytes")),
    TopicConfigDef("retention.ms", TYPE_LONG, str(7 * 24 * _HOURS),
                   "How long a segment is kept after its newest record before it is deleted (cleanup.policy delete); "
                   "-1 means no limit.",
                   (Synonym("log.retention.ms"), Synonym("log.retention.minutes", _MINUTES),
                    Synonym("log.retention.hours", _HOURS)), minimum=-1),
    TopicConfigDef("max.message.bytes", TYPE_INT, "1048588",
                   "The largest record batch (after compression, if compressed) the topic accepts.",
                   _s("message.max.bytes"), minimum=0),
    TopicConfigDef("index.interval.bytes", TYPE_INT, "4096",
                   "How many bytes of log lie between two entries of the offset index.", _s("log.index.interval.bytes"),
                   minimum=0),
    TopicConfigDef("delete.retention.ms", TYPE_LONG, "86400000",
                   "How long compaction keeps delete tombstones.", _s("log.cleaner.delete.retention.ms"), minimum=0),
    TopicConfigDef("min.compaction.lag.ms", TYPE_LONG, "0",
                   "The least time a message stays uncompacted.", _s("log.cleaner.min.compaction.lag.ms"), minimum=0),
    TopicConfigDef("max.compaction.lag.ms", TYPE_LONG, str((1 << 63) - 1),
                   "The most time a message stays ineligible for compaction.", _s("log.cleaner.max.compaction.lag.ms"),
                   minimum=1),
    TopicConfigDef("file.delete.delay.ms", TYPE_LONG, "60000",
                   "How long a deleted segment's files wait before they are removed from the file system.",
                   _s("log.segment.delete.delay.ms"), minimum=0),
    TopicConfigDef("min.cleanable.dirty.ratio", TYPE_DOUBLE, "0.5",
                   "The dirty share of a log that makes the cleaner compact it.", _s("log.cleaner.min.cleanable.ratio"),
                   minimum=0.0, maximum=1.0),
    TopicConfigDef("cleanup.policy", TYPE_LIST, "delete",
                   "delete, compact, or both: how old segments are removed.", _s("log.cleanup.policy"),
                   choices=("compact", "delete")),
    TopicConfigDef("unclean.leader.election.enable", TYPE_BOOLEAN, "false",
                   "Whether a replica outside the ISR may become leader.", no_effect=_REPLICATION),
    # This broker is every partition's only in-sync replica: above 1, acks=all writes fail with
    # NOT_ENOUGH_REPLICAS, as Kafka's do when the ISR is smaller than the topic's minimum.
    TopicConfigDef("min.insync.replicas", TYPE_INT, "1",
                   "The least number of in-sync replicas an acks=all write needs.", minimum=1),
    TopicConfigDef("compression.type", TYPE_STRING, "producer",
                   "The codec of stored batches: uncompressed, zstd, lz4, snappy, gzip, or producer (keep the "
                   "producer's).", _s("compression.type"),
                   choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    TopicConfigDef("compression.gzip.level", TYPE_INT, "-1", "The gzip level batches are recompressed with.",
                   _s("compression.gzip.level"), minimum=1, maximum=9, also=-1),
    TopicConfigDef("compression.lz4.level", TYPE_INT, "9", "The lz4 level batches are recompressed with.",
                   _s("compression.lz4.level"), minimum=1, maximum=17),
    TopicConfigDef("compression.zstd.level", TYPE_INT, "3", "The zstd level batches are recompressed with.",
                   _s("compression.zstd.level"), minimum=-131072, maximum=22),
    TopicConfigDef("preallocate", TYPE_BOOLEAN, "false", "Reserve disk space for a new segment when it is created.",
                   _s("log.preallocate")),
    TopicConfigDef("message.timestamp.type", TYPE_STRING, "CreateTime",
                   "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's time.",
                   _s("log.message.timestamp.type"), choices=("CreateTime", "LogAppendTime")),
    TopicConfigDef("message.timestamp.before.max.ms", TYPE_LONG, str((1 << 63) - 1),
                   "How far before the broker's time a CreateTime record's timestamp may lie.",
                   _s("log.message.timestamp.before.max.ms"), minimum=0),
    TopicConfigDef("message.timestamp.after.max.ms", TYPE_LONG, "3600000",
                   "How far after the broker's time a CreateTime record's timestamp may lie.",
                   _s("log.message.timestamp.after.max.ms"), minimum=0),
    TopicConfigDef("leader.replication.throttled.replicas", TYPE_LIST, "",
                   "Replicas whose log replication is throttled on the leader side.", no_effect=_REPLICATION),
    TopicConfigDef("follower.replication.throttled.replicas", TYPE_LIST, "",
                   "Replicas whose log replication is throttled on the follower side.", no_effect=_REPLICATION),
    TopicConfigDef("message.downconversion.enable", TYPE_BOOLEAN, "true",
                   "Whether records are down-converted for old consumers.", no_effect=_DOWNCONVERSION),
    TopicConfigDef("remote.storage.enable", TYPE_BOOLEAN, "false", "Whether the topic uses tiered storage.",
                   no_effect=_TIERED),
    TopicConfigDef("local.retention.ms", TYPE_LONG, "-2",
                   "How long a tiered topic keeps segments locally; -2 means retention.ms.",
                   _s("log.local.retention.ms"), minimum=-2, no_effect=_TIERED),
    TopicConfigDef("local.retention.bytes", TYPE_LONG, "-2",
                   "How many bytes a tiered topic keeps locally; -2 means retention.bytes.",
                   _s("log.local.retention.bytes"), minimum=-2, no_effect=_TIERED),
    TopicConfigDef("remote.log.copy.disable", TYPE_BOOLEAN, "false",
                   "Stop copying segments of a tiered topic to remote storage.", no_effect=_TIERED),
    TopicConfigDef("remote.log.delete.on.disable", TYPE_BOOLEAN, "false",
                   "Delete remote segments when tiered storage is turned off for the topic.", no_effect=_TIERED),
    # KIP-1191: a topic takes dead-lettered records of share groups only when its owner opts in.
    TopicConfigDef("errors.deadletterqueue.group.enable", TYPE_BOOLEAN, "false",
                   "Whether share groups may write dead-lettered records to this topic."),
]

TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in _DEFS}
_INTERNAL_DEF = TopicConfigDef(INTERNAL_SEGMENT_BYTES, TYPE_INT, None, "Test-only segment size without the 1 MiB floor.",
                               minimum=_MIN_INTERNAL_SEGMENT_BYTES)
LIST_TYPED = frozenset(d.name for d in _DEFS if d.type == TYPE_LIST)

_logged_no_effect: set[str] = set()


def validate_topic_config(key: str, value: str | None) -> str | None:
    """None if `key=value` is a legal topic config (value None = reset to default), else Kafka's reason."""
    spec = TOPIC_CONFIGS.get(key) or (_INTERNAL_DEF if key == INTERNAL_SEGMENT_BYTES else None)
    if spec is None:
        return f"Unknown topic config name: {shorten(key)}"
    if value is None:
        return None
    return _check_value(spec, value)


def _check_value(spec: TopicConfigDef, value: str) -> str | None:
    key = spec.name
    bad = f"Invalid value {shorten(value)} for configuration {key}"
    if spec.type == TYPE_BOOLEAN:
        if value.strip().lower() not in ("true", "false"):
            return f"{bad}: Expected value to be either true or false"
        return None
    if spec.type == TYPE_STRING:
        if spec.choices and value not in spec.choices:
            return f"{bad}: String must be one of: {', '.join(spec.choices)}"
        return None
    if spec.type == TYPE_LIST:
        if key == "cleanup.policy":
            if not valid_cleanup_policy(value):
                return f"{bad}: String must be one of: compact, delete"
            return None
        return _check_throttled_replicas(bad, value)
    if spec.type == TYPE_DOUBLE:
        try:
            number: float = float(value.strip())
        except ValueError:
            return f"{bad}: Not a number of type DOUBLE"
    else:
        low, high = _RANGES[spec.type]
        try:
            number = int(value.strip())
        except ValueError:
            return f"{bad}: Not a number of type {TYPE_NAMES[spec.type]}"
        if not low <= number <= high:
            return f"{bad}: Not a number of type {TYPE_NAMES[spec.type]}"
        if spec.also is not None and number == spec.also:
            return None
    if spec.minimum is not None and number < spec.minimum:
        if spec.maximum is not None:
            return f"Invalid value {value.strip()} for configuration {key}: Value must be between {spec.minimum} and {spec.maximum}"
        return f"Invalid value {value.strip()} for configuration {key}: Value must be at least {_num(spec.minimum)}"
    if spec.maximum is not None and number > spec.maximum:
        return f"Invalid value {value.strip()} for configuration {key}: Value must be no more than {_num(spec.maximum)}"
    return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _check_throttled_replicas(bad: str, value: str) -> str | None:
    """Kafka's ThrottledReplicaListValidator: "*" or partition:broker pairs."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if parts == ["*"] or not parts:
        return None
    for part in parts:
        left, sep, right = part.partition(":")
        if not sep or not left.isdigit() or not right.isdigit():
            return f"{bad}: must be the literal '*' or a list of replicas in the following format: " \
                   "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
    return None


def note_no_effect(topic: str, configs: dict[str, str]) -> None:
    """Log once per key that a replication or tiered-storage config is kept but changes nothing here."""
    for key in configs:
        spec = TOPIC_CONFIGS.get(key)
        if spec is not None and spec.no_effect is not None and key not in _logged_no_effect:
            _logged_no_effect.add(key)
            log.info("topic config has no effect on this broker", key=key, topic=topic, reason=spec.no_effect)


# ---- effective values -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """A topic key's value, where it comes from, and the synonyms behind it (most specific first)."""

    value: str | None
    source: int
    synonyms: tuple[tuple[str, str | None, int], ...]

    @property
    def explicit(self) -> bool:
        return self.source == SOURCE_TOPIC


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return ",".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _broker_synonyms(spec: TopicConfigDef, broker: BrokerConfig) -> list[tuple[str, str | None, int, int]]:
    """(broker key, value text, source, unit factor) of each synonym set dynamically or in the file, then the
    first synonym's default."""
    out: list[tuple[str, str | None, int, int]] = []
    for syn in spec.synonyms:
        try:
            value = broker[syn.name]
        except KeyError:
            continue
        level = broker.dynamic_source(syn.name)
        if level == THIS_BROKER:
            out.append((syn.name, _text(value), SOURCE_DYNAMIC_BROKER, syn.factor))
        elif level == CLUSTER_DEFAULT:
            out.append((syn.name, _text(value), SOURCE_DYNAMIC_DEFAULT_BROKER, syn.factor))
        elif syn.name in broker.explicit:
            out.append((syn.name, _text(value), SOURCE_STATIC_BROKER, syn.factor))
    for syn in spec.synonyms:
        key = KEYS.get(syn.name)
        if key is None:
            continue
        if key.default is None or _UNSET_DEFAULTS.get(syn.name) == key.default:
            continue  # no default of its own: the next synonym (or the topic key's own default) gives it
        out.append((syn.name, _text(key.default), SOURCE_DEFAULT, syn.factor))
        break
    return out


# Broker defaults that stand for "not set": Kafka leaves these keys null.
_UNSET_DEFAULTS = {"log.retention.ms": -2, "log.retention.minutes": -2, "log.flush.interval.ms": -1}


def _scaled(text: str | None, factor: int) -> str | None:
    if text is None or factor == 1:
        return text
    return str(int(text) * factor)


def resolve(key: str, overrides: dict[str, str], broker: BrokerConfig) -> ConfigValue:
    spec = TOPIC_CONFIGS[key]
    synonyms: list[tuple[str, str | None, int]] = []
    if key in overrides:
        synonyms.append((key, overrides[key], SOURCE_TOPIC))
    from_broker = _broker_synonyms(spec, broker)
    synonyms.extend((name, text, source) for name, text, source, _f in from_broker)
    if key in overrides:
        return ConfigValue(overrides[key], SOURCE_TOPIC, tuple(synonyms))
    if from_broker:
        _name, text, source, factor = from_broker[0]
        return ConfigValue(_scaled(text, factor), source, tuple(synonyms))
    synonyms.append((key, spec.default, SOURCE_DEFAULT))
    return ConfigValue(spec.default, SOURCE_DEFAULT, tuple(synonyms))


def effective_configs(overrides: dict[str, str], broker: BrokerConfig) -> dict[str, ConfigValue]:
    """Every topic key with its value and source, as DescribeConfigs lists them."""
    return {key: resolve(key, overrides, broker) for key in TOPIC_CONFIGS}


def effective_value(key: str, overrides: dict[str, str], broker: BrokerConfig) -> str:
    value = resolve(key, overrides, broker).value
    if value is None:
        raise ValueError(f"{key} has no value")
    return value


def segment_bytes(overrides: dict[str, str], broker: BrokerConfig) -> int:
    """The segment size: the test-only internal key wins over segment.bytes."""
    if INTERNAL_SEGMENT_BYTES in overrides:
        return int(overrides[INTERNAL_SEGMENT_BYTES])
    return int(effective_value("segment.bytes", overrides, broker))


def apply_list_op(current: str, values: str, append: bool) -> str:
    """IncrementalAlterConfigs APPEND/SUBTRACT on a list-typed key: Kafka keeps order and drops duplicates."""
    items = [part.strip() for part in current.split(",") if part.strip()]
    changes = [part.strip() for part in values.split(",") if part.strip()]
    if append:
        return ",".join(items + [c for c in changes if c not in items])
    return ",".join(i for i in items if i not in changes)


# ---- produce-time policy ----------------------------------------------------------------------------

_CODECS = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}


@dataclass(frozen=True, slots=True)
class ProducePolicy:
    """What produce checks and rewrites for one topic (Kafka's LogValidator inputs)."""

    max_message_bytes: int = 1048588
    log_append_time: bool = False
    timestamp_before_max_ms: int = (1 << 63) - 1
    timestamp_after_max_ms: int = 3600000
    # The codec stored batches must have, None to keep the producer's (compression.type=producer).
    codec: int | None = None
    level: int | None = None
    # An acks=all write needs this many in-sync replicas; this broker is the only one.
    min_insync_replicas: int = 1

    @classmethod
    def of(cls, overrides: dict[str, str], broker: BrokerConfig) -> ProducePolicy:
        def value(key: str) -> str:
            return effective_value(key, overrides, broker)

        name = value("compression.type")
        codec = _CODECS.get(name)
        level: int | None = None
        if codec == GZIP:
            level = int(value("compression.gzip.level"))
            level = None if level == -1 else level
        elif codec == LZ4:
            level = int(value("compression.lz4.level"))
        elif codec == ZSTD:
            level = int(value("compression.zstd.level"))
        return cls(
            max_message_bytes=int(value("max.message.bytes")),
            log_append_time=value("message.timestamp.type") == "LogAppendTime",
            timestamp_before_max_ms=int(value("message.timestamp.before.max.ms")),
            timestamp_after_max_ms=int(value("message.timestamp.after.max.ms")),
            codec=codec,
            level=level,
            min_insync_replicas=int(overrides.get("min.insync.replicas", "1")),
        )


def roll_jitter_ms(jitter_ms: int, segment_ms: int) -> int:
    """Kafka's random per-segment jitter: below both segment.jitter.ms and segment.ms."""
    if jitter_ms <= 0:
        return 0
    return random.randrange(min(jitter_ms, segment_ms))


def cleanup_flags(overrides: dict[str, str], broker: BrokerConfig) -> tuple[bool, bool]:
    """(delete, compact) from cleanup.policy."""
    policies = cleanup_policies(effective_value("cleanup.policy", overrides, broker))
    return "delete" in policies, "compact" in policies


def batch_too_large(header: BatchHeader, policy: ProducePolicy) -> str | None:
    """Kafka's RecordTooLargeException check of one batch against the topic's max.message.bytes."""
    if header.size > policy.max_message_bytes:
        return (f"The record batch size {header.size} bytes exceeds the topic's max.message.bytes "
                f"({policy.max_message_bytes})")
    return None


def needs_recompression(headers: list[tuple[int, BatchHeader]], policy: ProducePolicy) -> bool:
    """Whether some batch is not in the topic's codec (Kafka recompresses when the codec types differ)."""
    return policy.codec is not None and any(h.compression != policy.codec for _p, h in headers)


def recompress(buf: bytearray | memoryview, headers: list[tuple[int, BatchHeader]],
               policy: ProducePolicy) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """Validated batches rewritten in the topic's codec and level; batches already in it are kept as they are."""
    assert policy.codec is not None
    out = bytearray()
    for pos, header in headers:
        if header.compression == policy.codec:
            out += memoryview(buf)[pos : pos + header.size]
        else:
            out += recompress_batch(buf, pos, header, policy.codec, policy.level)
    return out, list(iter_batches(out))
