"""Settings for the command-line tools: Java-style properties files (`--command-config`), `key=value`
arguments, and their translation into what Shoal's bundled clients take.

Kafka's tools accept a properties file written for the Java client. The connection settings in such a file
(security protocol, SASL credentials in `sasl.jaas.config`, PEM trust and key stores) are translated here;
settings that only mean something to the Java client are reported and skipped, as Kafka warns about unused
configs instead of failing.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from shoal.client.security import CLIENT_KEY_NAMES
from shoal.java_properties import parse_properties, unescape

# Share-consumer settings by Kafka name -> AsyncShareConsumer keyword (with the value's type).
CONSUMER_KEYS: dict[str, tuple[str, type]] = {
    "max.poll.records": ("max_poll_records", int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "client.rack": ("rack_id", str),
    "share.acknowledgement.mode": ("acknowledgement_mode", str),
}

# Java-client settings with no counterpart here; a file written for the Java tools may well carry them.
_JAVA_ONLY_PREFIXES = ("key.deserializer", "value.deserializer", "check.crcs", "receive.buffer.bytes",
                       "send.buffer.bytes", "ssl.protocol", "ssl.enabled.protocols", "sasl.login.",
                       "ssl.keymanager.", "ssl.trustmanager.", "ssl.secure.random", "interceptor.classes",
                       "metric.reporters", "auto.offset.reset", "enable.auto.commit")

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class ToolConfigError(ValueError):
    """A settings file or property the tool cannot use; the message is meant for the user."""


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a Java .properties file: `key=value`, `key: value` or `key value`, `#`/`!` comments,
    backslash line continuations."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    return parse_properties(text)


def parse_key_values(items: Iterable[str], option: str) -> dict[str, str]:
    """`key=value` arguments (e.g. repeated --consumer-property) as a dict; later ones win."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ToolConfigError(f"{option} expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


@dataclass(slots=True)
class ClientSettings:
    """Properties sorted by who uses them."""

    connection: dict[str, str] = field(default_factory=dict)  # for ClientConfig (config=...)
    consumer: dict[str, Any] = field(default_factory=dict)  # AsyncShareConsumer keywords
    group_id: str | None = None
    client_id: str | None = None
    ignored: list[str] = field(default_factory=list)


def split_settings(props: Mapping[str, str], *, for_consumer: bool = False) -> ClientSettings:
    """Translate Kafka-client properties for the bundled clients; see the module docstring."""
    out = ClientSettings()
    truststore_type = props.get("ssl.truststore.type", "PEM").upper()
    keystore_type = props.get("ssl.keystore.type", "PEM").upper()
    for key, value in props.items():
        if key == "bootstrap.servers":
            continue  # --bootstrap-server always decides, as in Kafka's tools
        if key == "client.id":
            out.client_id = value
        elif key == "request.timeout.ms":
            out.connection[key] = str(_int(key, value))  # checked here, so a bad value gets the tool's error
        elif key in CLIENT_KEY_NAMES:  # passed through as they are
            out.connection[key] = value
        elif key == "sasl.jaas.config":
            user, password = _jaas_credentials(value)
            out.connection.setdefault("sasl.username", user)
            out.connection.setdefault("sasl.password", password)
        elif key == "ssl.truststore.location":
            if truststore_type != "PEM":
                raise ToolConfigError(
                    f"ssl.truststore.type {truststore_type} is not supported; use a PEM file (ssl.truststore.type=PEM "
                    "or ssl.ca.location)"
                )
            out.connection.setdefault("ssl.ca.location", value)
        elif key == "ssl.keystore.location":
            if keystore_type != "PEM":
                raise ToolConfigError(
                    f"ssl.keystore.type {keystore_type} is not supported; use a PEM file holding the certificate "
                    "and key (ssl.keystore.type=PEM) or ssl.certificate.location/ssl.key.location"
                )
            # A PEM key store holds the certificate chain and the private key in one file.
            out.connection.setdefault("ssl.certificate.location", value)
        elif key in ("ssl.truststore.type", "ssl.keystore.type"):
            continue
        elif key == "ssl.keystore.password":
            out.connection.setdefault("ssl.key.password", value)
        elif for_consumer and key == "group.id":
            out.group_id = value
        elif for_consumer and key in CONSUMER_KEYS:
            name, kind = CONSUMER_KEYS[key]
            out.consumer[name] = _int(key, value) if kind is int else value
        else:
            out.ignored.append(key)
    if out.consumer.get("acknowledgement_mode") not in (None, "implicit", "explicit"):
        raise ToolConfigError("share.acknowledgement.mode must be implicit or explicit")
    return out


def warn_ignored(settings: ClientSettings, stream: TextIO = sys.stderr) -> None:
    for key in settings.ignored:
        known = key.startswith(_JAVA_ONLY_PREFIXES)
        reason = "it only applies to the Java client" if known else "it isn't a known config"
        print(f"Warning: the configuration '{key}' was supplied but is not used: {reason}.", file=stream)


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ToolConfigError(f"{key} must be an integer, not {value!r}") from None


def _jaas_credentials(line: str) -> tuple[str, str]:
    """username/password of a PLAIN or SCRAM login-module line (the only SASL mechanisms Shoal speaks)."""
    if "PlainLoginModule" not in line and "ScramLoginModule" not in line:
        raise ToolConfigError("sasl.jaas.config: only PlainLoginModule and ScramLoginModule are supported")
    options = {k: unescape(v) for k, v in _JAAS_OPTION.findall(line)}
    if "username" not in options or "password" not in options:
        raise ToolConfigError("sasl.jaas.config needs username=\"...\" and password=\"...\"")
    return options["username"], options["password"]
