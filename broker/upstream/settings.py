"""`upstream.*` broker keys (Kafka client property names after the prefix) turned into client settings.

Only what Shoal's client can honour is accepted; any other key is a start-up error naming it, rather than
a setting silently dropped (a truststore that is ignored would be a security hole).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.client.cluster import parse_bootstrap
from shoal.client.security import CLIENT_KEY_NAMES, ClientConfig

from .state_topic_names import (
    DEFAULT_MEMBERSHIP_GROUP_ID,
    DEFAULT_STATE_TOPIC_PREFIX,
    StateTopicNames,
    derived_prefix,
    prefix_problem,
)

# upstream.* client keys, with the `ClientConfig.from_dict` key each is passed on as (text values): every
# key it reads, and Kafka's name for the PEM CA file, which librdkafka spells ssl.ca.location.
_DIRECT = {**{key: key for key in CLIENT_KEY_NAMES}, "ssl.truststore.location": "ssl.ca.location"}
# Accepted and meaningless for PEM files (Kafka requires them for JKS).
_ACCEPTED = frozenset({"ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password",
                       "ssl.keystore.password"})
# Shoal's own sidecar keys (not client settings), with their defaults.
_MEMBERSHIP_GROUP_ID = "membership.group.id"
_STATE_TOPIC_PREFIX = "state.topic.prefix"
_STATE_TOPIC_REPLICATION_FACTOR = "state.topic.replication.factor"
_STATE_TRANSACTION_VERSION = "state.transaction.version"
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


MEMBERSHIP_PREFIX = "membership."


class UpstreamConfigError(ValueError):
    """An upstream.* setting Shoal cannot start with."""


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    bootstrap: list[tuple[str, int]]
    client: ClientConfig
    # Sidecars with the same id share the work (and fence each other's state writes).
    membership_group_id: str = DEFAULT_MEMBERSHIP_GROUP_ID
    # The state topics' replication factor when Shoal creates them; None: the upstream's default.
    state_topic_replication_factor: int | None = None
    # The highest transaction.version the state writers use (2 when the upstream finalizes it; 1 always
    # sends AddPartitionsToTxn).
    state_transaction_version: int = 2
    # The deployment's state topics are `<prefix>_...` (state_topic_names.py).
    state_topic_prefix: str = DEFAULT_STATE_TOPIC_PREFIX

    @property
    def state_topics(self) -> StateTopicNames:
        return StateTopicNames(self.state_topic_prefix)

    @property
    def bootstrap_text(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.bootstrap)


def jaas_credentials(line: str) -> tuple[str, str]:
    """username and password of a PlainLoginModule / ScramLoginModule line."""
    # Quoted values as Kafka's JAAS parser reads them: a backslash escapes the next character.
    options = {key: re.sub(r"\\(.)", r"\1", value) for key, value in _JAAS_OPTION.findall(line)}
    if "username" not in options or "password" not in options:
        raise UpstreamConfigError("upstream.sasl.jaas.config needs username=\"...\" and password=\"...\"")
    return options["username"], options["password"]


def parse_upstream(keys: Mapping[str, str]) -> UpstreamSettings:
    """Settings from the `upstream.` keys of the broker config, prefix removed."""
    try:
        bootstrap = parse_bootstrap(keys.get("bootstrap.servers", ""))
    except ValueError as exc:
        raise UpstreamConfigError(f"upstream.bootstrap.servers: {exc}") from exc
    client: dict[str, str] = {"client.id": "shoal-sidecar"}
    group_id = keys.get(_MEMBERSHIP_GROUP_ID, DEFAULT_MEMBERSHIP_GROUP_ID).strip()
    if not group_id:
        raise UpstreamConfigError(f"upstream.{_MEMBERSHIP_GROUP_ID} must not be empty")
    replication: int | None = None
    if _STATE_TOPIC_REPLICATION_FACTOR in keys:
        try:
            replication = int(keys[_STATE_TOPIC_REPLICATION_FACTOR])
        except ValueError:
            replication = 0
        if replication < 1 and replication != -1:
            raise UpstreamConfigError(f"upstream.{_STATE_TOPIC_REPLICATION_FACTOR} must be a positive number "
                                      "(or -1 for the upstream's default)")
        replication = None if replication == -1 else replication
    explicit_prefix = keys.get(_STATE_TOPIC_PREFIX, "").strip()
    prefix = explicit_prefix or derived_prefix(group_id)
    problem = prefix_problem(prefix)
    if problem and explicit_prefix:
        raise UpstreamConfigError(f"upstream.{_STATE_TOPIC_PREFIX}={prefix!r} cannot name the state topics: {problem}")
    if problem:
        raise UpstreamConfigError(
            f"upstream.{_MEMBERSHIP_GROUP_ID}={group_id!r} cannot name this deployment's state topics "
            f"({prefix}_...): {problem}; choose another group id or set upstream.{_STATE_TOPIC_PREFIX}")
    transaction_version = keys.get(_STATE_TRANSACTION_VERSION, "2").strip()
    if transaction_version not in ("1", "2"):
        raise UpstreamConfigError(f"upstream.{_STATE_TRANSACTION_VERSION} must be 1 or 2")
    for key, value in keys.items():
        if key in ("bootstrap.servers", _STATE_TOPIC_REPLICATION_FACTOR, _STATE_TRANSACTION_VERSION,
                   _STATE_TOPIC_PREFIX) \
                or key in _ACCEPTED \
                or key.startswith(MEMBERSHIP_PREFIX):
            continue  # membership.*: the sidecar group's settings (membership.parse_membership)
        if key == "sasl.jaas.config":
            client["sasl.username"], client["sasl.password"] = jaas_credentials(value)
        elif key == "ssl.keystore.location":
            # A PEM keystore holds the certificate chain and the private key in one file.
            client["ssl.certificate.location"] = client["ssl.key.location"] = value
        elif key in _DIRECT:
            client[_DIRECT[key]] = value
        else:
            raise UpstreamConfigError(f"upstream.{key} is not a client setting Shoal supports for the upstream")
    try:
        config = ClientConfig.from_dict(client)
    except ValueError as exc:
        raise UpstreamConfigError(f"upstream settings: {exc}") from exc
    return UpstreamSettings(bootstrap, config, group_id, replication, int(transaction_version), prefix)
