"""Sidecar mode: the names of one deployment's state topics on the upstream.

A deployment (the sidecars sharing one `upstream.membership.group.id`) keeps its state in topics of its own,
all named `<prefix>_<what>`. The prefix is `upstream.state.topic.prefix` when set, otherwise derived from the
membership group id as Kafka Streams derives its internal topics from `application.id`: `__shoal` for the
default group id (`shoal-sidecars`, whose topics keep the names they had before deployments were told apart)
and `__shoal_<group id>` for any other. A prefix must be a legal topic name start (letters, digits, `.`, `_`,
`-`), short enough for the longest topic name to stay within Kafka's 249 characters, and be `__shoal` or
begin with `__shoal_`: clients may not produce to such topics, and they never meet an upstream's own
internal topics. A group id that cannot be part of a topic name is a start-up error that says so (set the
prefix instead), never silently rewritten: two group ids must never map to one prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MEMBERSHIP_GROUP_ID = "shoal-sidecars"
DEFAULT_STATE_TOPIC_PREFIX = "__shoal"
MAX_TOPIC_NAME_LENGTH = 249  # Kafka's Topic.MAX_NAME_LENGTH
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")

# What follows the prefix in each state topic's name; the internal topics' names without their first `_`.
CONSUMER_OFFSETS_SUFFIX = "_consumer_offsets"
SHARE_GROUP_STATE_SUFFIX = "_share_group_state"
GROUP_CONFIGS_SUFFIX = "_group_configs"
# One compacted partition whose first record names the deployment that owns the prefix.
DEPLOYMENT_SUFFIX = "_deployment"
SUFFIXES = (CONSUMER_OFFSETS_SUFFIX, SHARE_GROUP_STATE_SUFFIX, GROUP_CONFIGS_SUFFIX, DEPLOYMENT_SUFFIX)
MAX_PREFIX_LENGTH = MAX_TOPIC_NAME_LENGTH - max(map(len, SUFFIXES))


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot name state topics, or None when it can."""
    if prefix != DEFAULT_STATE_TOPIC_PREFIX and not prefix.startswith(DEFAULT_STATE_TOPIC_PREFIX + "_"):
        return f"it must be {DEFAULT_STATE_TOPIC_PREFIX} or begin with {DEFAULT_STATE_TOPIC_PREFIX}_"
    if not _LEGAL.fullmatch(prefix):
        return "a topic name may hold only ASCII letters, digits, '.', '_' and '-'"
    if len(prefix) > MAX_PREFIX_LENGTH:
        return (f"it is {len(prefix)} characters long, and the state topics' names would pass Kafka's "
                f"{MAX_TOPIC_NAME_LENGTH} (at most {MAX_PREFIX_LENGTH})")
    return None


def derived_prefix(membership_group_id: str) -> str:
    """The prefix of a deployment that does not set one (it may still be unusable: see `prefix_problem`)."""
    if membership_group_id == DEFAULT_MEMBERSHIP_GROUP_ID:
        return DEFAULT_STATE_TOPIC_PREFIX
    return f"{DEFAULT_STATE_TOPIC_PREFIX}_{membership_group_id}"


def is_state_topic(name: str | None) -> bool:
    """One of any deployment's state topics on the upstream (clients must not write them)."""
    return name is not None and name.startswith(DEFAULT_STATE_TOPIC_PREFIX + "_")


@dataclass(frozen=True, slots=True)
class StateTopicNames:
    """One deployment's state topics."""

    prefix: str = DEFAULT_STATE_TOPIC_PREFIX

    def for_internal(self, internal_topic: str) -> str:
        """The upstream topic holding an internal topic's records: `__consumer_offsets` ->
        `<prefix>_consumer_offsets`, `__share_group_state` -> `<prefix>_share_group_state`."""
        return self.prefix + internal_topic[1:]

    @property
    def group_configs(self) -> str:
        return self.prefix + GROUP_CONFIGS_SUFFIX

    @property
    def deployment(self) -> str:
        return self.prefix + DEPLOYMENT_SUFFIX

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(self.prefix + suffix for suffix in SUFFIXES)
