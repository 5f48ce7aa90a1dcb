"""Broker configuration under Kafka's own keys: a server.properties file plus `--override key=value`.

A key Kafka knows but that does not apply to one Shoal broker (KRaft roles, thread pools, replication)
is ignored and logged once with the reason. A key nobody knows is a warning, as in Kafka, or an error
with `--strict`. A known key with a bad value is always an error that names the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.java_properties import parse_properties

from .ignored_keys import ignored_reason


class ConfigError(ValueError):
    """A configuration key or value that the broker cannot start with."""


CLEANUP_POLICIES = frozenset({"delete", "compact"})


def cleanup_policies(text: str) -> frozenset[str]:
    """The parts of a cleanup.policy value ("delete", "compact", "compact,delete")."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def valid_cleanup_policy(text: str) -> bool:
    parts = cleanup_policies(text)
    return bool(parts) and parts <= CLEANUP_POLICIES


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    minimum: int | None = None


_KEYS: list[ConfigKey] = [
    # Identity and network
    ConfigKey("node.id", int, 1, "This broker's node id."),
    ConfigKey("broker.id", int, -1, "Alias of node.id kept for older configs."),
    ConfigKey("cluster.id", str, "shoal-cluster", "Cluster id reported in Metadata and DescribeCluster."),
    ConfigKey("listeners", _list, ["PLAINTEXT://127.0.0.1:9092"], "Listeners as NAME://host:port, comma separated."),
    ConfigKey("advertised.listeners", _list, [], "Addresses clients should use; defaults to listeners."),
    ConfigKey("listener.security.protocol.map", _list, [], "Listener name to security protocol, NAME:PROTOCOL."),
    ConfigKey("controller.listener.names", _list, [], "KRaft controller listeners: named in a Kafka config, not served."),
    ConfigKey("socket.request.max.bytes", int, 104857600, "Largest request frame accepted.", 1),
    ConfigKey("socket.send.buffer.bytes", int, 102400, "SO_SNDBUF; -1 for the OS default."),
    ConfigKey("socket.receive.buffer.bytes", int, 102400, "SO_RCVBUF; -1 for the OS default."),
    ConfigKey("connections.max.idle.ms", int, 600000, "Idle connections are closed after this long.", 1),
    ConfigKey("queued.max.requests", int, 500, "Requests in flight per connection before reads pause.", 1),
    # Log
    ConfigKey("log.dirs", str, "./data", "Directory holding the partition logs (one directory supported)."),
    ConfigKey("log.dir", str, "", "Used when log.dirs is not set."),
    ConfigKey("num.partitions", int, 1, "Partitions of auto-created topics.", 1),
    ConfigKey("default.replication.factor", int, 1, "Accepted for compatibility; this broker holds one replica."),
    ConfigKey("auto.create.topics.enable", _bool, True, "Create a topic when Metadata asks for an unknown one."),
    ConfigKey("delete.topic.enable", _bool, True, "Allow DeleteTopics."),
    ConfigKey("log.segment.bytes", int, 1073741824, "Size at which a segment is rolled.", 14),
    ConfigKey("log.roll.ms", int, None, "Default segment.ms: roll the active segment after this long; unset uses log.roll.hours.", 1),
    ConfigKey("log.roll.hours", int, 168, "Default segment.ms in hours.", 1),
    ConfigKey("log.roll.jitter.ms", int, None, "Default segment.jitter.ms; unset uses log.roll.jitter.hours.", 0),
    ConfigKey("log.roll.jitter.hours", int, 0, "Default segment.jitter.ms in hours.", 0),
    ConfigKey("log.index.size.max.bytes", int, 10485760, "Default segment.index.bytes: a full index rolls the segment.", 4),
    ConfigKey("log.segment.delete.delay.ms", int, 60000, "Default file.delete.delay.ms.", 0),
    ConfigKey("log.preallocate", _bool, False, "Default preallocate: reserve disk space for new segments."),
    ConfigKey("compression.type", str, "producer", "Default compression.type of topics."),
    ConfigKey("compression.gzip.level", int, -1, "Default gzip level of recompressed batches."),
    ConfigKey("compression.lz4.level", int, 9, "Default lz4 level of recompressed batches.", 1),
    ConfigKey("compression.zstd.level", int, 3, "Default zstd level of recompressed batches.", -131072),
    ConfigKey("log.local.retention.ms", int, -2, "Tiered storage: accepted, no effect on this broker.", -2),
    ConfigKey("log.local.retention.bytes", int, -2, "Tiered storage: accepted, no effect on this broker.", -2),
    ConfigKey("log.retention.ms", int, -2, "Retention by time; -1 keeps forever, unset falls back to hours."),
    ConfigKey("log.retention.minutes", int, -2, "Retention by time in minutes."),
    ConfigKey("log.retention.hours", int, 168, "Retention by time in hours."),
    ConfigKey("log.retention.bytes", int, -1, "Retention by size per partition; -1 unlimited."),
    ConfigKey("log.retention.check.interval.ms", int, 300000, "How often retention runs.", 1),
    ConfigKey("log.cleanup.policy", str, "delete",
              "Default cleanup.policy of topics: delete, compact or compact,delete; compact alone never deletes by age or size."),
    ConfigKey("log.cleaner.enable", _bool, True, "Run the log cleaner, which compacts topics with cleanup.policy compact."),
    ConfigKey("log.cleaner.threads", int, 1, "Threads cleaning logs.", 1),
    ConfigKey("log.cleaner.backoff.ms", int, 15000, "Sleep of the cleaner when no log is cleanable.", 0),
    ConfigKey("log.cleaner.dedupe.buffer.size", int, 134217728,
              "Memory for the cleaner's offset maps across all cleaner threads (24 bytes a key, as in Kafka).", 1),
    ConfigKey("log.cleaner.io.buffer.load.factor", float, 0.9, "Fill factor of the cleaner's offset map."),
    ConfigKey("log.cleaner.io.buffer.size", int, 524288, "Accepted for compatibility; the cleaner reads 1 MiB chunks.", 0),
    ConfigKey("log.cleaner.io.max.bytes.per.second", float, 1.7976931348623157e308,
              "Bytes a second the log cleaner threads may read and write together; the default is unthrottled."),
    ConfigKey("log.cleaner.min.cleanable.ratio", float, 0.5,
              "Default min.cleanable.dirty.ratio: the dirty share of a log that makes it worth cleaning."),
    ConfigKey("log.cleaner.min.compaction.lag.ms", int, 0, "Default min.compaction.lag.ms.", 0),
    ConfigKey("log.cleaner.max.compaction.lag.ms", int, 2**63 - 1, "Default max.compaction.lag.ms.", 1),
    ConfigKey("log.cleaner.delete.retention.ms", int, 86400000,
              "Default delete.retention.ms: how long compaction keeps a tombstone.", 0),
    ConfigKey("log.flush.interval.messages", int, 2**63 - 1, "Fsync after this many messages.", 1),
    ConfigKey("log.flush.interval.ms", int, -1, "Fsync at least this often; -1 never by time."),
    ConfigKey("log.index.interval.bytes", int, 4096, "Bytes between sparse offset index entries.", 1),
    ConfigKey("log.message.timestamp.type", str, "CreateTime", "CreateTime or LogAppendTime."),
    ConfigKey("log.message.timestamp.before.max.ms", int, 2**63 - 1,
              "CreateTime records older than this (relative to the broker's clock) are refused.", 0),
    ConfigKey("log.message.timestamp.after.max.ms", int, 3600000,
              "CreateTime records further in the future than this are refused.", 0),
    ConfigKey("max.partitions.per.request", int, 10000,
              "Most partitions one CreateTopics or CreatePartitions request may add (POLICY_VIOLATION above).", 1),
    ConfigKey("max.partitions", int, -1,
              "Most partitions this broker holds; -1 derives it from the open-file limit (one file each).", -1),
    ConfigKey("message.max.bytes", int, 1048588, "Largest record batch accepted.", 0),
    ConfigKey("fetch.max.bytes", int, 57671680, "Most bytes one Fetch answers with.", 1024),
    ConfigKey("offsets.topic.num.partitions", int, 50, "Partitions of __consumer_offsets.", 1),
    ConfigKey("offsets.topic.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("offsets.topic.segment.bytes", int, 104857600, "Segment size of __consumer_offsets.", 1),
    ConfigKey("share.coordinator.state.topic.num.partitions", int, 50, "Partitions of __share_group_state.", 1),
    ConfigKey("transaction.state.log.num.partitions", int, 50, "Partitions of __transaction_state.", 1),
    ConfigKey("transaction.state.log.segment.bytes", int, 104857600, "Segment size of __transaction_state.", 1),
    ConfigKey("transaction.max.timeout.ms", int, 900000, "Largest transaction.timeout.ms a producer may ask for.", 1),
    ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, 10000,
              "How often transactions open past their timeout are looked for and aborted.", 1),
    ConfigKey("transactional.id.expiration.ms", int, 604800000,
              "A transactional id with no transaction in progress and no update for this long is removed.", 1),
    ConfigKey("transaction.remove.expired.transaction.cleanup.interval.ms", int, 3600000,
              "How often expired transactional ids are looked for.", 1),
    ConfigKey("producer.id.expiration.ms", int, 86400000,
              "A partition forgets a producer (its sequences) whose last batch is this old.", 1),
    ConfigKey("producer.id.expiration.check.interval.ms", int, 600000,
              "How often partitions look for expired producer ids.", 1),
    # Client quotas (Kafka's QuotaConfig): the rate a quota bounds is measured over this many windows.
    ConfigKey("quota.window.num", int, 11, "Samples kept per client quota rate.", 1),
    ConfigKey("quota.window.size.seconds", int, 1, "Length of each client quota sample, in seconds.", 1),
    ConfigKey("transaction.partition.verification.enable", _bool, True,
              "Check a transactional batch's partition with the coordinator before appending it (KIP-890)."),
    ConfigKey("share.coordinator.state.topic.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("share.coordinator.state.topic.min.isr", int, 1, "Accepted for compatibility."),
    ConfigKey("share.coordinator.state.topic.segment.bytes", int, 104857600, "Segment size of __share_group_state.", 1),
    ConfigKey("transaction.state.log.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("transaction.state.log.min.isr", int, 1, "Accepted for compatibility."),
    # Classic consumer groups
    ConfigKey("group.min.session.timeout.ms", int, 6000, "Shortest session timeout a member may ask for.", 1),
    ConfigKey("group.max.session.timeout.ms", int, 1800000, "Longest session timeout a member may ask for.", 1),
    ConfigKey("group.initial.rebalance.delay.ms", int, 3000, "Wait for more members before a new group's first rebalance.", 0),
    ConfigKey("group.max.size", int, 2**31 - 1, "Members per classic group.", 1),
    ConfigKey("offset.metadata.max.bytes", int, 4096, "Largest metadata string of a committed offset.", 0),
    ConfigKey("offsets.retention.minutes", int, 10080,
              "How long committed offsets of a group without members (or of topics it no longer reads) are kept.", 1),
    ConfigKey("offsets.retention.check.interval.ms", int, 600000, "How often expired committed offsets are removed.", 1),
    # KIP-848 consumer groups
    ConfigKey("group.consumer.session.timeout.ms", int, 45000, "Consumer-group member session timeout.", 1),
    ConfigKey("group.consumer.heartbeat.interval.ms", int, 5000, "Consumer-group member heartbeat interval.", 1),
    ConfigKey("group.consumer.min.session.timeout.ms", int, 45000, "Lower bound for a group's consumer.session.timeout.ms.", 1),
    ConfigKey("group.consumer.max.session.timeout.ms", int, 60000, "Upper bound for a group's consumer.session.timeout.ms.", 1),
    ConfigKey("group.consumer.min.heartbeat.interval.ms", int, 5000,
              "Lower bound for a group's consumer.heartbeat.interval.ms.", 1),
    ConfigKey("group.consumer.max.heartbeat.interval.ms", int, 15000,
              "Upper bound for a group's consumer.heartbeat.interval.ms.", 1),
    ConfigKey("group.consumer.max.size", int, 2**31 - 1, "Members per consumer group.", 1),
    ConfigKey("group.consumer.assignors", str, "uniform,range",
              "Server-side assignors (names or Kafka class names); the first is the default."),
    # Share groups (used by the share-group layers)
    ConfigKey("group.share.enable", _bool, True, "Serve share groups (share.version=2: KIP-932 and dead-letter topics)."),
    ConfigKey("group.share.session.timeout.ms", int, 45000, "Share member session timeout.", 1),
    ConfigKey("group.share.min.session.timeout.ms", int, 45000, "Lower bound for the session timeouts.", 1),
    ConfigKey("group.share.max.session.timeout.ms", int, 60000, "Upper bound for the session timeouts.", 1),
    ConfigKey("group.share.heartbeat.interval.ms", int, 5000, "Share member heartbeat interval.", 1),
    ConfigKey("group.share.min.heartbeat.interval.ms", int, 5000, "Lower bound for the heartbeat intervals.", 1),
    ConfigKey("group.share.max.heartbeat.interval.ms", int, 15000, "Upper bound for the heartbeat intervals.", 1),
    ConfigKey("group.share.max.size", int, 200, "Members per share group.", 1),
    ConfigKey("group.share.assignors", str, "simple", "Server-side assignor."),
    ConfigKey("group.share.delivery.count.limit", int, 5, "Deliveries before a record is archived.", 2),
    ConfigKey("group.share.min.delivery.count.limit", int, 2, "Lower bound for the delivery count limits.", 2),
    ConfigKey("group.share.max.delivery.count.limit", int, 10, "Upper bound for the delivery count limits.", 2),
    ConfigKey("group.share.record.lock.duration.ms", int, 30000, "Acquisition lock duration.", 1000),
    ConfigKey("group.share.min.record.lock.duration.ms", int, 15000, "Lower bound for the group config.", 1000),
    ConfigKey("group.share.max.record.lock.duration.ms", int, 60000, "Upper bound for the group config.", 1000),
    ConfigKey("group.share.partition.max.record.locks", int, 2000, "In-flight records per share partition.", 100),
    ConfigKey("group.share.min.partition.max.record.locks", int, 100, "Lower bound for the record-lock limits.", 100),
    ConfigKey("group.share.max.partition.max.record.locks", int, 4000, "Upper bound for the record-lock limits.", 100),
    ConfigKey("group.share.max.share.sessions", int, 2000, "Share sessions per broker.", 1),
    ConfigKey("group.share.assignment.interval.ms", int, 1000, "Interval between share-group assignment updates.", 0),
    ConfigKey("group.share.min.assignment.interval.ms", int, 0, "Lower bound for the group config.", 0),
    ConfigKey("group.share.max.assignment.interval.ms", int, 15000, "Upper bound for the group config.", 0),
    # Dead-letter topics for share groups (KIP-1191)
    ConfigKey("errors.deadletterqueue.topic.name.prefix", str, "dlq.",
              "Prefix a share group's dead-letter topic name must have; empty allows any name."),
    ConfigKey("errors.deadletterqueue.auto.create.topics.enable", _bool, False,
              "Create a share group's missing dead-letter topic on its first dead-lettered record."),
    ConfigKey("group.share.initialize.retry.interval.ms", int, 30000, "Retry interval for state initialisation.", 1),
    ConfigKey("share.coordinator.snapshot.update.records.per.snapshot", int, 500, "Updates between snapshots.", 0),
    ConfigKey("share.coordinator.cold.partition.snapshot.interval.ms", int, 300000, "Cold snapshot interval.", 1),
    ConfigKey("share.coordinator.state.topic.prune.interval.ms", int, 300000, "Prune interval.", 1),
    # Operations
    ConfigKey("metrics.port", int, -1, "Port of the Prometheus endpoint; 0 picks a free port, -1 disables."),
    ConfigKey("metrics.host", str, "127.0.0.1", "Address of the Prometheus endpoint."),
    ConfigKey("log.format", str, "console", "Broker log output: console or json."),
    ConfigKey("log.level", str, "info", "debug, info, warning or error."),
    ConfigKey("authorizer.class.name", str, "", "Empty allows everything."),
    ConfigKey("super.users", str, "", "Semicolon-separated principals allowed everything."),
    ConfigKey("allow.everyone.if.no.acl.found", _bool, False, "Allow when no ACL matches a resource."),
    # Security: TLS (PEM only), SASL, re-authentication. Each may also be set per listener with
    # `listener.name.<listener>.<key>`; SASL JAAS per mechanism as `listener.name.<l>.<mech>.sasl.jaas.config`.
    ConfigKey("ssl.keystore.type", str, "PEM", "Only PEM is supported."),
    ConfigKey("ssl.keystore.location", str, "", "PEM file holding the certificate chain and the private key."),
    ConfigKey("ssl.keystore.certificate.chain", str, "", "PEM certificate chain given inline."),
    ConfigKey("ssl.keystore.key", str, "", "PEM private key given inline."),
    ConfigKey("ssl.key.password", str, "", "Password of an encrypted private key."),
    ConfigKey("ssl.keystore.password", str, "", "Accepted for compatibility; PEM keys use ssl.key.password."),
    ConfigKey("ssl.truststore.type", str, "PEM", "Only PEM is supported."),
    ConfigKey("ssl.truststore.location", str, "", "PEM file of CA certificates trusted for client certificates."),
    ConfigKey("ssl.truststore.certificates", str, "", "PEM CA certificates given inline."),
    ConfigKey("ssl.truststore.password", str, "", "Accepted for compatibility; PEM truststores have no password."),
    ConfigKey("ssl.client.auth", str, "none", "none, requested or required."),
    ConfigKey("ssl.enabled.protocols", _list, ["TLSv1.2", "TLSv1.3"], "TLS versions accepted."),
    ConfigKey("ssl.endpoint.identification.algorithm", str, "https", "Accepted for compatibility (client side)."),
    ConfigKey("sasl.enabled.mechanisms", _list, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
              "SASL mechanisms offered: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512."),
    ConfigKey("sasl.jaas.config", str, "", "JAAS login module line; PLAIN users as user_<name>=\"<password>\"."),
    ConfigKey("connections.max.reauth.ms", int, 0, "SASL session lifetime; 0 disables re-authentication.", 0),
    ConfigKey("security.inter.broker.protocol", str, "PLAINTEXT",
              "Sidecar group: the listener named after this protocol carries the sidecars' requests to each other."),
    ConfigKey("inter.broker.listener.name", str, "",
              "Sidecar group: the listener the sidecars' requests to each other use (instead of the protocol key)."),
    ConfigKey("sasl.mechanism.inter.broker.protocol", str, "GSSAPI",
              "Sidecar group: the SASL mechanism (PLAIN, SCRAM-*) on a SASL inter-broker listener."),
]

SUPPORTED_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LISTENER_PREFIX = "listener.name."
# Keys under this prefix configure Shoal's client connections to an upstream cluster (sidecar mode);
# `upstream.bootstrap.servers` turns the mode on. They are kept as text for the upstream client to parse.
UPSTREAM_PREFIX = "upstream."
# Keys that make sense per listener (Kafka's ListenerName.configPrefix overrides).
_PER_LISTENER = ("ssl.", "sasl.", "connections.max.reauth.ms")

KEYS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}


@dataclass(frozen=True, slots=True)
class ConfigNote:
    """A key the broker did not apply: `known` ones are Kafka's and ignored on purpose, the rest unknown."""

    key: str
    reason: str
    known: bool


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    security_protocol: str
    host: str
    port: int


class BrokerConfig:
    """Typed access to the broker's settings; `cfg["log.segment.bytes"]` returns the parsed value."""

    def __init__(self, values: dict[str, Any], explicit: set[str],
                 per_listener: dict[str, dict[str, Any]] | None = None, notes: list[ConfigNote] | None = None):
        self._values = values
        self.explicit = explicit
        # Keys that were accepted but not applied, for the broker to log once logging is set up.
        self.notes = notes or []
        # listener name (upper case) -> key -> parsed value, from `listener.name.<listener>.<key>`.
        self.per_listener = per_listener or {}
        # `upstream.<key>` settings with the prefix removed (sidecar mode); empty in standalone mode.
        self.upstream: dict[str, str] = {}
        # Values set at runtime (IncrementalAlterConfigs on BROKER), per level, as text; see DYNAMIC_KEYS.
        self._dynamic: dict[str, dict[str, str]] = {THIS_BROKER: {}, CLUSTER_DEFAULT: {}}
        self._dynamic_path: Path | None = None

    def __getitem__(self, key: str) -> Any:
        if key in DYNAMIC_KEYS:
            level = self.dynamic_source(key)
            if level is not None:
                return self._effective_dynamic(key, self._dynamic[level][key])
        return self._values[key]

    def dynamic_only_keys(self) -> list[str]:
        """Keys set dynamically that the broker has no static setting for (those without effect here)."""
        return sorted({k for level in self._dynamic.values() for k in level} - set(self._values))

    # ---- dynamic broker configs ----------------------------------------------------------------------

    def dynamic_source(self, key: str) -> str | None:
        """The level a dynamic value of `key` comes from (this broker's wins over the cluster default)."""
        for level in (THIS_BROKER, CLUSTER_DEFAULT):
            if key in self._dynamic[level]:
                return level
        return None

    def dynamic_values(self, level: str) -> dict[str, str]:
        return dict(self._dynamic[level])

    @staticmethod
    def validate_dynamic(changes: Iterable[tuple[str, str | None]]) -> None:
        """Raise ConfigError (Kafka's wording) unless every change may be applied at runtime."""
        static = sorted({key for key, _ in changes if key not in DYNAMIC_KEYS})
        if static:
            raise ConfigError(f"Cannot update these configs dynamically: [{', '.join(static)}]")
        for key, text in changes:
            if text is not None:
                _parse_dynamic(key, text)

    def _effective_dynamic(self, key: str, text: str) -> Any:
        value = _parse_dynamic(key, text)
        bounds = SHARE_BOUNDS.get(key)
        if bounds is not None:
            # As in Kafka, a dynamic value outside the broker's min/max keys is capped, not refused.
            value = min(max(value, self._values[bounds[0]]), self._values[bounds[1]])
        return value

    def apply_dynamic(self, level: str, changes: Iterable[tuple[str, str | None]]) -> None:
        """Set (text) or delete (None) dynamic values at `level`, validated first, then persisted."""
        changes = list(changes)
        self.validate_dynamic(changes)
        current = self._dynamic[level]
        for key, text in changes:
            if text is None:
                current.pop(key, None)
            else:
                current[key] = text
        if self._dynamic_path is not None:
            tmp = self._dynamic_path.with_suffix(".tmp")
            self._dynamic_path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(self._dynamic, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._dynamic_path)

    def load_dynamic(self, path: Path) -> None:
        """Read the dynamic values kept in `path` (if any); later changes are written there."""
        self._dynamic_path = path
        if not path.exists():
            return
        stored = json.loads(path.read_text())
        for level in (THIS_BROKER, CLUSTER_DEFAULT):
            values = {str(k): str(v) for k, v in stored.get(level, {}).items()}
            try:
                self.validate_dynamic(values.items())
            except ConfigError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
            self._dynamic[level] = values

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    @classmethod
    def from_strings(cls, raw: dict[str, str], *, strict: bool = False) -> BrokerConfig:
        values: dict[str, Any] = {k.name: k.default for k in _KEYS}
        per_listener: dict[str, dict[str, Any]] = {}
        notes: list[ConfigNote] = []
        upstream = {k[len(UPSTREAM_PREFIX):]: v for k, v in raw.items() if k.startswith(UPSTREAM_PREFIX)}
        raw = {k: v for k, v in raw.items() if not k.startswith(UPSTREAM_PREFIX)}
        if upstream and not upstream.get("bootstrap.servers", "").strip():
            raise ConfigError("upstream.* keys need upstream.bootstrap.servers (the upstream cluster's brokers)")
        unknown = sorted(k for k in set(raw) - set(KEYS) if _listener_key(k) is None)
        strangers = [k for k in unknown if ignored_reason(k) is None]
        if strangers and strict:
            raise ConfigError(f"unknown configuration key(s): {', '.join(strangers)}")
        for key in unknown:
            reason = ignored_reason(key)
            notes.append(ConfigNote(key, reason or "not a known configuration key", known=reason is not None))
        for key, text in raw.items():
            if key in unknown:
                continue
            split = _listener_key(key) if key not in KEYS else None
            if split is not None:
                listener_name, base, spec = split
                per_listener.setdefault(listener_name, {})[base] = _parse_value(spec, key, text)
                continue
            values[key] = _parse_value(KEYS[key], key, text)
        if "log.dirs" not in raw and raw.get("log.dir"):
            values["log.dirs"] = values["log.dir"]
        if "node.id" not in raw and values["broker.id"] >= 0:
            values["node.id"] = values["broker.id"]
        if values["log.message.timestamp.type"] not in ("CreateTime", "LogAppendTime"):
            raise ConfigError("log.message.timestamp.type must be CreateTime or LogAppendTime")
        if values["compression.type"] not in ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"):
            raise ConfigError("compression.type must be uncompressed, zstd, lz4, snappy, gzip or producer")
        if not valid_cleanup_policy(values["log.cleanup.policy"]):
            raise ConfigError("log.cleanup.policy must be delete, compact or compact,delete")
        if values["log.format"] not in ("console", "json"):
            raise ConfigError("log.format must be console or json")
        config = cls(values, set(raw) - set(unknown), per_listener, notes)
        config.upstream = upstream
        config.listeners()  # validate early
        config._validate_security()
        config._validate_share_bounds()
        return config

    def for_listener(self, listener_name: str, key: str) -> Any:
        """`listener.name.<listener>.<key>` when set, else the broker-wide value of `key`."""
        overrides = self.per_listener.get(listener_name.upper(), {})
        if key in overrides:
            return overrides[key]
        return self._values[key]

    def jaas_config(self, listener_name: str, mechanism: str) -> str:
        """JAAS line for a mechanism: per listener and mechanism, per listener, then broker-wide."""
        overrides = self.per_listener.get(listener_name.upper(), {})
        specific = overrides.get(f"{mechanism.lower()}.sasl.jaas.config")
        if specific is not None:
            return str(specific)
        return str(self.for_listener(listener_name, "sasl.jaas.config"))

    def _validate_share_bounds(self) -> None:
        """Each share-group default lies within its min/max keys, which also bound the group configs."""
        for value_key, (lo_key, hi_key) in SHARE_BOUNDS.items():
            lo, hi, value = self[lo_key], self[hi_key], self[value_key]
            if lo > hi:
                raise ConfigError(f"{lo_key} ({lo}) must not exceed {hi_key} ({hi})")
            if not lo <= value <= hi:
                raise ConfigError(f"{value_key} must be between {lo_key} ({lo}) and {hi_key} ({hi}), got {value}")
        if self["group.share.heartbeat.interval.ms"] >= self["group.share.session.timeout.ms"]:
            raise ConfigError("group.share.heartbeat.interval.ms must be less than group.share.session.timeout.ms")

    def _validate_security(self) -> None:
        names = {lst.name for lst in self.listeners()} | set(self.per_listener)
        for name in names:
            for mech in self.for_listener(name, "sasl.enabled.mechanisms"):
                if mech not in SUPPORTED_SASL_MECHANISMS:
                    raise ConfigError(
                        f"SASL mechanism {mech} is not supported (supported: {', '.join(SUPPORTED_SASL_MECHANISMS)})"
                    )
            if self.for_listener(name, "ssl.client.auth") not in ("none", "requested", "required"):
                raise ConfigError("ssl.client.auth must be none, requested or required")
            for key in ("ssl.keystore.type", "ssl.truststore.type"):
                if str(self.for_listener(name, key)).upper() != "PEM":
                    raise ConfigError(f"{key} must be PEM (JKS and PKCS12 stores are not supported)")

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Iterable[str] = (), *, strict: bool = False) -> BrokerConfig:
        raw: dict[str, str] = {}
        if path is not None:
            raw.update(parse_properties(Path(path).read_text()))
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override must be key=value, got {item!r}")
            key, _, value = item.partition("=")
            raw[key.strip()] = value.strip()
        return cls.from_strings(raw, strict=strict)

    def retention_ms(self) -> int:
        if self["log.retention.ms"] != -2:
            return int(self["log.retention.ms"])
        if self["log.retention.minutes"] != -2:
            return int(self["log.retention.minutes"]) * 60_000
        return int(self["log.retention.hours"]) * 3_600_000

    def listeners(self) -> list[Listener]:
        protocol_map = {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL"}
        for entry in self["listener.security.protocol.map"]:
            name, _, proto = entry.partition(":")
            protocol_map[name.strip().upper()] = proto.strip().upper()
        controllers = {name.upper() for name in self["controller.listener.names"]}
        out = []
        for text in self["listeners"]:
            listener = _parse_listener(text, protocol_map)
            if listener.name not in controllers:
                out.append(listener)
        if not out:
            raise ConfigError("listeners must name at least one listener")
        return out

    def advertised(self, bound: list[Listener]) -> list[Listener]:
        """Advertised addresses, with port 0 replaced by the port actually bound."""
        protocol_map = {lst.name: lst.security_protocol for lst in bound}
        if not self["advertised.listeners"]:
            return bound
        by_name = {lst.name: lst for lst in bound}
        controllers = {name.upper() for name in self["controller.listener.names"]}
        out = []
        for text in self["advertised.listeners"]:
            if text.partition("://")[0].upper() in controllers:
                continue
            lst = _parse_listener(text, protocol_map)
            port = lst.port or by_name[lst.name].port if lst.name in by_name else lst.port
            out.append(Listener(lst.name, lst.security_protocol, lst.host, port))
        return out


# Share-group settings bounded by broker min/max keys (Kafka 4.3's ShareGroupConfig): the broker's own
# default and every group's dynamic value must lie within them.
SHARE_BOUNDS: dict[str, tuple[str, str]] = {
    "group.share.session.timeout.ms": ("group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms"),
    "group.share.heartbeat.interval.ms": (
        "group.share.min.heartbeat.interval.ms", "group.share.max.heartbeat.interval.ms"),
    "group.share.delivery.count.limit": (
        "group.share.min.delivery.count.limit", "group.share.max.delivery.count.limit"),
    "group.share.partition.max.record.locks": (
        "group.share.min.partition.max.record.locks", "group.share.max.partition.max.record.locks"),
    "group.share.assignment.interval.ms": (
        "group.share.min.assignment.interval.ms", "group.share.max.assignment.interval.ms"),
}


# Broker keys IncrementalAlterConfigs may change at runtime, for the whole cluster (resource name "") or
# for this broker (its id): those of Kafka 4.4's GroupCoordinatorConfig.RECONFIGURABLE_CONFIGS that
# Shoal has. Kafka made the two KIP-1191 keys dynamic in 4.4 (KAFKA-20410).
_GROUP_DYNAMIC_KEYS = frozenset({
    "group.share.assignment.interval.ms",
    "errors.deadletterqueue.topic.name.prefix",
    "errors.deadletterqueue.auto.create.topics.enable",
})
# Kafka's DynamicLogConfig: the broker keys that give topics their defaults. A change reaches every topic
# that does not set the key itself, at once.
DYNAMIC_LOG_KEYS = frozenset({
    "log.segment.bytes", "log.roll.ms", "log.roll.jitter.ms", "log.index.size.max.bytes",
    "log.flush.interval.messages", "log.flush.interval.ms", "log.retention.bytes", "log.retention.ms",
    "message.max.bytes", "log.index.interval.bytes", "log.cleaner.delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms", "log.segment.delete.delay.ms",
    "log.cleaner.min.cleanable.ratio", "log.cleanup.policy", "compression.type", "compression.gzip.level",
    "compression.lz4.level", "compression.zstd.level", "log.preallocate", "log.message.timestamp.type",
    "log.message.timestamp.before.max.ms", "log.message.timestamp.after.max.ms", "log.local.retention.ms",
    "log.local.retention.bytes",
})
# Kafka's LogCleaner keys: dynamic there; here the cleaner reads them when the broker starts.
DYNAMIC_AT_RESTART = frozenset({
    "log.cleaner.threads", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size", "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms",
})
_NO_THREADS = "this broker runs one event loop and has no such thread pool"
_NO_KERBEROS = "this broker offers no GSSAPI (Kerberos) or OAUTHBEARER login"
# Keys Kafka changes at runtime that mean nothing on this broker: accepted, kept and described, and logged
# as having no effect, with the reason.
DYNAMIC_NO_EFFECT: dict[str, str] = {
    "num.io.threads": _NO_THREADS, "num.network.threads": _NO_THREADS, "background.threads": _NO_THREADS,
    "num.recovery.threads.per.data.dir": _NO_THREADS,
    "num.replica.fetchers": "this broker holds the only replica of every partition",
    "unclean.leader.election.enable": "this broker holds the only replica of every partition",
    "min.insync.replicas": "this broker holds the only replica of every partition",
    "log.message.downconversion.enable": "Kafka 4 no longer down-converts records; the key is a no-op",
    "metric.reporters": "metrics are served by the Prometheus endpoint (metrics.port)",
    "max.connections": "connections are not capped by count",
    "max.connection.creation.rate": "connections are not rate-limited",
    "producer.id.expiration.ms": "producer ids are kept while the log holds their batches",
    "transaction.partition.verification.enable": "transactional produce is not verified with the coordinator",
    "sasl.kerberos.service.name": _NO_KERBEROS, "sasl.kerberos.kinit.cmd": _NO_KERBEROS,
    "sasl.kerberos.ticket.renew.window.factor": _NO_KERBEROS, "sasl.kerberos.ticket.renew.jitter": _NO_KERBEROS,
    "sasl.kerberos.min.time.before.relogin": _NO_KERBEROS, "sasl.kerberos.principal.to.local.rules": _NO_KERBEROS,
    "sasl.login.refresh.window.factor": _NO_KERBEROS, "sasl.login.refresh.window.jitter": _NO_KERBEROS,
    "sasl.login.refresh.min.period.seconds": _NO_KERBEROS, "sasl.login.refresh.buffer.seconds": _NO_KERBEROS,
}
DYNAMIC_KEYS = _GROUP_DYNAMIC_KEYS | DYNAMIC_LOG_KEYS | DYNAMIC_AT_RESTART | frozenset(DYNAMIC_NO_EFFECT)
_CHOICES = {
    "compression.type": ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    "log.message.timestamp.type": ("CreateTime", "LogAppendTime"),
}
THIS_BROKER, CLUSTER_DEFAULT = "broker", "cluster"
DYNAMIC_CONFIG_FILE = "shoal-broker-configs.json"


def _parse_dynamic(key: str, text: str) -> Any:
    """A dynamic value parsed and checked as Kafka's ConfigDef does, with its messages."""
    spec = KEYS.get(key)
    if spec is None:
        return text  # a key without effect here: kept as given
    if key in _CHOICES and text not in _CHOICES[key]:
        raise ConfigError(f"Invalid value {text} for configuration {key}: String must be one of: {', '.join(_CHOICES[key])}")
    if key == "log.cleanup.policy" and not valid_cleanup_policy(text):
        raise ConfigError(f"Invalid value {text} for configuration {key}: String must be one of: compact, delete")
    if spec.parse is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ConfigError(f"Invalid value {text} for configuration {key}: Not a number of type DOUBLE") from None
    if spec.parse is int:
        try:
            value: Any = int(text.strip())
        except ValueError:
            raise ConfigError(f"Invalid value {text} for configuration {key}: Not a number of type INT") from None
        if spec.minimum is not None and value < spec.minimum:
            raise ConfigError(f"Invalid value {text} for configuration {key}: Value must be at least {spec.minimum}")
        return value
    if spec.parse is _bool:
        if text.strip().lower() not in ("true", "false"):
            raise ConfigError(f"Invalid value {text} for configuration {key}: Expected value to be either true or false")
        return text.strip().lower() == "true"
    return spec.parse(text)


def _parse_value(spec: ConfigKey, key: str, text: str) -> Any:
    try:
        value = spec.parse(text)
    except ValueError as exc:
        raise ConfigError(f"invalid value for {key}: {text!r} ({exc})") from exc
    if spec.minimum is not None and isinstance(value, int) and value < spec.minimum:
        raise ConfigError(f"{key} must be at least {spec.minimum}, got {value}")
    return value


_JAAS_KEY = ConfigKey("sasl.jaas.config", str, "", "JAAS line for one mechanism.")


def _listener_key(key: str) -> tuple[str, str, ConfigKey] | None:
    """Split `listener.name.<listener>.<key>` into (LISTENER, key, spec), or None if it is not one."""
    if not key.startswith(LISTENER_PREFIX):
        return None
    listener_name, sep, base = key[len(LISTENER_PREFIX) :].partition(".")
    if not sep or not listener_name:
        return None
    spec = KEYS.get(base)
    if spec is not None and base.startswith(_PER_LISTENER):
        return listener_name.upper(), base, spec
    mech, _, rest = base.partition(".")
    if rest == "sasl.jaas.config" and mech.upper() in SUPPORTED_SASL_MECHANISMS:
        return listener_name.upper(), base.lower(), _JAAS_KEY
    return None


def _parse_listener(text: str, protocol_map: dict[str, str]) -> Listener:
    name, sep, rest = text.partition("://")
    if not sep:
        raise ConfigError(f"listener must look like NAME://host:port, got {text!r}")
    host, _, port_text = rest.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError as exc:
        raise ConfigError(f"bad port in listener {text!r}") from exc
    name = name.upper()
    proto = protocol_map.get(name)
    if proto is None:
        raise ConfigError(f"listener {name} has no entry in listener.security.protocol.map")
    return Listener(name, proto, host, port)
