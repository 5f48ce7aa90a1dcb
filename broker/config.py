"""Broker configuration under Kafka's own keys: a server.properties file plus `--override key=value`.

Unknown keys are an error at start-up: a typo such as `log.dir=` silently ignored would put data in
the wrong place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration key or value that the broker cannot start with."""


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
    ConfigKey("log.retention.ms", int, -2, "Retention by time; -1 keeps forever, unset falls back to hours."),
    ConfigKey("log.retention.minutes", int, -2, "Retention by time in minutes."),
    ConfigKey("log.retention.hours", int, 168, "Retention by time in hours."),
    ConfigKey("log.retention.bytes", int, -1, "Retention by size per partition; -1 unlimited."),
    ConfigKey("log.retention.check.interval.ms", int, 300000, "How often retention runs.", 1),
    ConfigKey("log.flush.interval.messages", int, 2**63 - 1, "Fsync after this many messages.", 1),
    ConfigKey("log.flush.interval.ms", int, -1, "Fsync at least this often; -1 never by time."),
    ConfigKey("log.index.interval.bytes", int, 4096, "Bytes between sparse offset index entries.", 1),
    ConfigKey("log.message.timestamp.type", str, "CreateTime", "CreateTime or LogAppendTime."),
    ConfigKey("message.max.bytes", int, 1048588, "Largest record batch accepted.", 0),
    ConfigKey("fetch.max.bytes", int, 57671680, "Most bytes one Fetch answers with.", 1024),
    ConfigKey("offsets.topic.num.partitions", int, 50, "Partitions of __consumer_offsets.", 1),
    ConfigKey("offsets.topic.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("share.coordinator.state.topic.num.partitions", int, 50, "Partitions of __share_group_state.", 1),
    ConfigKey("share.coordinator.state.topic.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("share.coordinator.state.topic.min.isr", int, 1, "Accepted for compatibility."),
    ConfigKey("transaction.state.log.replication.factor", int, 1, "Accepted for compatibility."),
    ConfigKey("transaction.state.log.min.isr", int, 1, "Accepted for compatibility."),
    # Share groups (used by the share-group layers)
    ConfigKey("group.share.enable", _bool, True, "Serve share groups (share.version=1)."),
    ConfigKey("group.share.session.timeout.ms", int, 45000, "Share member session timeout.", 1),
    ConfigKey("group.share.heartbeat.interval.ms", int, 5000, "Share member heartbeat interval.", 1),
    ConfigKey("group.share.max.size", int, 200, "Members per share group.", 1),
    ConfigKey("group.share.assignors", str, "simple", "Server-side assignor."),
    ConfigKey("group.share.delivery.count.limit", int, 5, "Deliveries before a record is archived.", 2),
    ConfigKey("group.share.record.lock.duration.ms", int, 30000, "Acquisition lock duration.", 1000),
    ConfigKey("group.share.min.record.lock.duration.ms", int, 15000, "Lower bound for the group config.", 1000),
    ConfigKey("group.share.max.record.lock.duration.ms", int, 60000, "Upper bound for the group config.", 1000),
    ConfigKey("group.share.partition.max.record.locks", int, 2000, "In-flight records per share partition.", 100),
    ConfigKey("group.share.max.share.sessions", int, 2000, "Share sessions per broker.", 1),
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
]

KEYS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    security_protocol: str
    host: str
    port: int


class BrokerConfig:
    """Typed access to the broker's settings; `cfg["log.segment.bytes"]` returns the parsed value."""

    def __init__(self, values: dict[str, Any], explicit: set[str]):
        self._values = values
        self.explicit = explicit

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    @classmethod
    def from_strings(cls, raw: dict[str, str]) -> BrokerConfig:
        values: dict[str, Any] = {k.name: k.default for k in _KEYS}
        unknown = sorted(set(raw) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
        for key, text in raw.items():
            spec = KEYS[key]
            try:
                value = spec.parse(text)
            except ValueError as exc:
                raise ConfigError(f"invalid value for {key}: {text!r} ({exc})") from exc
            if spec.minimum is not None and isinstance(value, int) and value < spec.minimum:
                raise ConfigError(f"{key} must be at least {spec.minimum}, got {value}")
            values[key] = value
        if "log.dirs" not in raw and raw.get("log.dir"):
            values["log.dirs"] = values["log.dir"]
        if "node.id" not in raw and values["broker.id"] >= 0:
            values["node.id"] = values["broker.id"]
        if values["log.message.timestamp.type"] not in ("CreateTime", "LogAppendTime"):
            raise ConfigError("log.message.timestamp.type must be CreateTime or LogAppendTime")
        if values["log.format"] not in ("console", "json"):
            raise ConfigError("log.format must be console or json")
        config = cls(values, set(raw))
        config.listeners()  # validate early
        return config

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Iterable[str] = ()) -> BrokerConfig:
        raw: dict[str, str] = {}
        if path is not None:
            raw.update(parse_properties(Path(path).read_text()))
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override must be key=value, got {item!r}")
            key, _, value = item.partition("=")
            raw[key.strip()] = value.strip()
        return cls.from_strings(raw)

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
        out = []
        for text in self["listeners"]:
            out.append(_parse_listener(text, protocol_map))
        if not out:
            raise ConfigError("listeners must name at least one listener")
        return out

    def advertised(self, bound: list[Listener]) -> list[Listener]:
        """Advertised addresses, with port 0 replaced by the port actually bound."""
        protocol_map = {lst.name: lst.security_protocol for lst in bound}
        if not self["advertised.listeners"]:
            return bound
        by_name = {lst.name: lst for lst in bound}
        out = []
        for text in self["advertised.listeners"]:
            lst = _parse_listener(text, protocol_map)
            port = lst.port or by_name[lst.name].port if lst.name in by_name else lst.port
            out.append(Listener(lst.name, lst.security_protocol, lst.host, port))
        return out


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


def parse_properties(text: str) -> dict[str, str]:
    """Java-properties subset: `key=value` or `key: value`, `#`/`!` comments, backslash line continuation."""
    out: dict[str, str] = {}
    pending = ""
    for raw_line in text.splitlines():
        line = pending + raw_line.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        for i, ch in enumerate(line):
            if ch in "=:":
                out[line[:i].strip()] = line[i + 1 :].strip()
                break
        else:
            out[line] = ""
    return out
