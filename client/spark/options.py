"""Option parsing shared by the `kafka-share` Spark source and sink.

Names follow Spark's own Kafka connector where the meaning is the same: `kafka.bootstrap.servers`, and
any other `kafka.<client config>` is handed to the bundled client (security settings, client.id, ...).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Options read by the source/sink themselves; every other `kafka.*` option goes to the client config.
_OWN_KAFKA_KEYS = frozenset({"kafka.bootstrap.servers", "kafka.group.id"})


class SparkOptionError(ValueError):
    """An option passed to `.option(...)` is missing or malformed."""


@dataclass(frozen=True)
class ClientOptions:
    bootstrap_servers: str
    client_config: dict[str, str] = field(default_factory=dict)


def lowered(options: Mapping[str, Any]) -> dict[str, str]:
    # Spark hands us a case-insensitive dict; a plain dict with lower-case keys pickles the same everywhere.
    return {str(k).lower(): str(v) for k, v in options.items()}


def client_options(options: Mapping[str, str]) -> ClientOptions:
    bootstrap = options.get("kafka.bootstrap.servers") or options.get("bootstrap.servers")
    if not bootstrap:
        raise SparkOptionError("option 'kafka.bootstrap.servers' is required")
    config = {
        key[len("kafka.") :]: value
        for key, value in options.items()
        if key.startswith("kafka.") and key not in _OWN_KAFKA_KEYS
    }
    return ClientOptions(bootstrap, config)


UPSTREAM_PREFIX = "upstream."


def upstream_options(options: Mapping[str, str]) -> ClientOptions | None:
    """`upstream.bootstrap.servers` and any other `upstream.<client config>`: the cluster behind a Shoal
    sidecar, for reading records straight from its brokers; None when the option is not given."""
    config = {
        key[len(UPSTREAM_PREFIX) :]: value
        for key, value in options.items()
        if key.startswith(UPSTREAM_PREFIX) and key != "upstream.bootstrap.servers"
    }
    bootstrap = options.get("upstream.bootstrap.servers", "").strip()
    if not bootstrap:
        if config:
            raise SparkOptionError(
                f"option '{UPSTREAM_PREFIX}{next(iter(config))}' needs 'upstream.bootstrap.servers'")
        return None
    check_connection_config(config, UPSTREAM_PREFIX)
    return ClientOptions(bootstrap, config)


def check_known(options: Mapping[str, str], known: Iterable[str], what: str,
                client_prefixes: tuple[str, ...] = ("kafka.",)) -> None:
    """Fail on an option nobody reads (a typo would otherwise be ignored silently), naming it and the
    closest known name. Options with one of `client_prefixes` are checked as client settings instead."""
    names = {name.lower(): name for name in known}
    for key in options:
        if key.startswith(client_prefixes) or key in names:
            continue
        close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.75)
        hint = f"; did you mean {names[close[0]]!r}?" if close else ""
        raise SparkOptionError(f"unknown option {key!r} for the {what}{hint}")


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise SparkOptionError(f"option {name!r} must be true or false, not {raw!r}")


def choice_option(options: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first is the default), matched case-insensitively."""
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return choices[0]
    for choice in choices:
        if raw.strip().lower() == choice.lower():
            return choice
    raise SparkOptionError(f"option {name!r} must be one of {', '.join(choices)}, not {raw!r}")


def check_connection_config(config: Mapping[str, str], prefix: str = "kafka.") -> None:
    """Reject unknown client settings when the query is defined, not later inside Spark's worker processes."""
    from shoal.client.security import ClientConfig

    try:
        ClientConfig.from_dict(config)
    except ValueError as exc:
        raise SparkOptionError(f"{prefix}* option: {exc}") from None


def int_option(options: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise SparkOptionError(f"option {name!r} must be >= {minimum}, not {value}")
    return value

