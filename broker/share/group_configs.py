"""Dynamic group configs (ConfigResource type GROUP = 32): validated, persisted, applied live.

Values a group does not set fall back to the broker's `group.share.*` settings. A value is checked against
a `ValidationContext`: the broker's current config (its dynamic values included) and the topics that exist,
which the caller supplies.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from shoal.broker.common.config import SHARE_BOUNDS, BrokerConfig
from shoal.broker.upstream.produce import UpstreamProduceFailed
from shoal.iso_duration import parse_iso_duration_ms
from shoal.protocol.errors import shorten

if TYPE_CHECKING:
    from shoal.broker.storage.topic_registry import TopicRegistry

log = structlog.get_logger("shoal.group_configs")

FILE_NAME = "shoal-group-configs.json"


DLQ_TOPIC_NAME = "errors.deadletterqueue.topic.name"  # group config
DLQ_TOPIC_NAME_PREFIX = "errors.deadletterqueue.topic.name.prefix"  # broker config (dynamic)
DLQ_TOPIC_ENABLE = "errors.deadletterqueue.group.enable"  # topic config: the topic's owner opts in


class InvalidGroupConfig(ValueError):
    pass


# The explicit configs of the topic of that name, or None when there is no such topic.
TopicConfigs = Callable[[str], Mapping[str, str] | None]


@dataclass(frozen=True, slots=True)
class ValidationContext:
    """What a group config value is checked against besides itself."""

    broker: BrokerConfig  # read at check time, so the broker's dynamic values count
    topic_configs: TopicConfigs


def validation_context(broker: BrokerConfig, topics: TopicRegistry) -> ValidationContext:
    def topic_configs(name: str) -> Mapping[str, str] | None:
        topic = topics.get(name)
        return None if topic is None else topic.configs

    return ValidationContext(broker, topic_configs)


def dead_letter_enabled(topic_configs: Mapping[str, str]) -> bool:
    """Whether a topic takes share groups' dead-letter records (its opt-in, false unless set)."""
    return topic_configs.get(DLQ_TOPIC_ENABLE, "false").strip().lower() == "true"


Validator = Callable[[str, ValidationContext], None]


@dataclass(frozen=True, slots=True)
class GroupConfigKey:
    name: str
    broker_default: str | None  # broker key supplying the default, or None for a fixed default
    fixed_default: str
    validate: Validator


def _int_between(lo_key: str | int, hi_key: str | int) -> Validator:
    def check(value: str, ctx: ValidationContext) -> None:
        cfg = ctx.broker
        try:
            number = int(value)
        except ValueError as exc:
            raise InvalidGroupConfig("not an integer") from exc
        lo = cfg[lo_key] if isinstance(lo_key, str) else lo_key
        hi = cfg[hi_key] if isinstance(hi_key, str) else hi_key
        if not lo <= number <= hi:
            raise InvalidGroupConfig(f"{number} is outside [{lo}, {hi}]")

    return check


def _offset_reset(value: str, ctx: ValidationContext) -> None:
    if value in ("latest", "earliest"):
        return
    if value.startswith("by_duration:"):
        try:
            duration = parse_iso_duration_ms(value.split(":", 1)[1])
        except ValueError as exc:
            raise InvalidGroupConfig(str(exc)) from exc
        if duration < 0:
            raise InvalidGroupConfig("the duration must not be negative")
        return
    raise InvalidGroupConfig("must be latest, earliest or by_duration:<ISO-8601 duration>")


def _isolation(value: str, ctx: ValidationContext) -> None:
    if value not in ("read_uncommitted", "read_committed"):
        raise InvalidGroupConfig("must be read_uncommitted or read_committed")


def _bounded(name: str, broker_key: str) -> GroupConfigKey:
    """A group config defaulting to `broker_key` and bounded by that key's broker min/max keys."""
    lo_key, hi_key = SHARE_BOUNDS[broker_key]
    return GroupConfigKey(name, broker_key, "", _int_between(lo_key, hi_key))


def _boolean(value: str, ctx: ValidationContext) -> None:
    if value.strip().lower() not in ("true", "false"):
        raise InvalidGroupConfig("Expected value to be either true or false")


class _DlqTopicNameError(InvalidGroupConfig):
    """Worded on its own (the `__` refusal as Kafka words it), without the "Invalid value" preamble."""


def _dlq_topic_name(value: str, ctx: ValidationContext) -> None:
    # Kafka 4.4 refuses only internal-looking names here and checks the prefix and the topic's opt-in when
    # a record is dead-lettered. Shoal also refuses a name that fails those checks now, so a mistake shows
    # when it is made; the dead-letter-time checks stay, as the prefix and the topic's config can change.
    # An empty value is no dead-letter topic; a topic that does not exist yet may be created later.
    if value.startswith("__"):
        raise _DlqTopicNameError(f"{DLQ_TOPIC_NAME}: DLQ topic name must not start with '__'")
    prefix = str(ctx.broker[DLQ_TOPIC_NAME_PREFIX])
    if value and prefix and not value.startswith(prefix):
        raise _DlqTopicNameError(
            f"The dead-letter topic name '{shorten(value)}' must start with the prefix '{shorten(prefix)}'")
    topic_configs = ctx.topic_configs(value) if value else None
    if topic_configs is not None and not dead_letter_enabled(topic_configs):
        raise _DlqTopicNameError(f"Topic '{shorten(value)}' is not enabled as a dead-letter topic for share "
                                 f"groups ({DLQ_TOPIC_ENABLE}=false)")


KEYS: dict[str, GroupConfigKey] = {
    k.name: k
    for k in (
        GroupConfigKey("share.auto.offset.reset", None, "latest", _offset_reset),
        GroupConfigKey("share.isolation.level", None, "read_uncommitted", _isolation),
        GroupConfigKey(
            "share.record.lock.duration.ms",
            "group.share.record.lock.duration.ms",
            "",
            _int_between("group.share.min.record.lock.duration.ms", "group.share.max.record.lock.duration.ms"),
        ),
        _bounded("share.session.timeout.ms", "group.share.session.timeout.ms"),
        _bounded("share.heartbeat.interval.ms", "group.share.heartbeat.interval.ms"),
        _bounded("share.delivery.count.limit", "group.share.delivery.count.limit"),
        _bounded("share.partition.max.record.locks", "group.share.partition.max.record.locks"),
        # Kafka 4.3 (KIP-1240, KIP-1263)
        GroupConfigKey("share.renew.acknowledge.enable", None, "true", _boolean),
        _bounded("share.assignment.interval.ms", "group.share.assignment.interval.ms"),
        # KIP-848 consumer groups: bounded by the broker's group.consumer.min/max keys
        GroupConfigKey("consumer.session.timeout.ms", "group.consumer.session.timeout.ms", "",
                       _int_between("group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms")),
        GroupConfigKey("consumer.heartbeat.interval.ms", "group.consumer.heartbeat.interval.ms", "",
                       _int_between("group.consumer.min.heartbeat.interval.ms",
                                    "group.consumer.max.heartbeat.interval.ms")),
        # Kafka 4.4 (KIP-1191)
        GroupConfigKey(DLQ_TOPIC_NAME, None, "", _dlq_topic_name),
        GroupConfigKey("errors.deadletterqueue.copy.record.enable", None, "false", _boolean),
    )
}


# A store's write that did not succeed (sidecar mode: the upstream refused it or did not answer), with the
# Kafka error code to answer the change with.
GroupConfigStoreError = UpstreamProduceFailed


class GroupConfigStore(Protocol):
    """Where group configs are kept when not in the local directory (sidecar mode: a topic on the upstream)."""

    async def write(self, group_id: str, changes: Sequence[tuple[str, str | None]]) -> None:
        """Store the group's changed names (a value, or None to delete it) and apply them here through
        `GroupConfigs.replace`; returns once durable, raises GroupConfigStoreError when it cannot."""

    async def delete_group(self, group_id: str) -> None:
        """Delete every config of the group, as `write`."""

    async def refresh(self) -> None:
        """Apply here what was stored through other instances so far (as far as the store answers)."""


class GroupConfigs:
    def __init__(self, data_dir: Path, broker_config: BrokerConfig):
        self.path = data_dir / FILE_NAME
        self.broker_config = broker_config
        self._groups: dict[str, dict[str, str]] = {}
        # None: the local file holds them (standalone); otherwise the store does and the file is not used.
        self.store: GroupConfigStore | None = None
        self._writing = asyncio.Lock()
        if self.path.exists():
            self._groups = json.loads(self.path.read_text())

    def use_store(self, store: GroupConfigStore) -> None:
        """Keep the configs in `store` from now on; what the local file held is dropped (the store's
        reader fills them in through `replace`)."""
        if self._groups:
            log.warning("group configs in the local directory are not used: they are kept on the upstream",
                        path=str(self.path), groups=len(self._groups))
        self._groups = {}
        self.store = store

    def explicit(self, group_id: str) -> dict[str, str]:
        return dict(self._groups.get(group_id, {}))

    def get(self, group_id: str, key: str) -> str:
        value = self._groups.get(group_id, {}).get(key)
        if value is not None:
            return value
        spec = KEYS[key]
        if spec.broker_default is not None:
            return str(self.broker_config[spec.broker_default])
        return spec.fixed_default

    def get_int(self, group_id: str, key: str) -> int:
        return int(self.get(group_id, key))

    def get_bool(self, group_id: str, key: str) -> bool:
        return self.get(group_id, key).strip().lower() == "true"

    def effective(self, group_id: str) -> dict[str, tuple[str, bool]]:
        set_here = self._groups.get(group_id, {})
        return {k: (self.get(group_id, k), k in set_here) for k in KEYS}

    @staticmethod
    def validate(key: str, value: str | None, ctx: ValidationContext) -> None:
        spec = KEYS.get(key)
        if spec is None:
            raise InvalidGroupConfig(f"Unknown group config name: {shorten(key)}")
        if value is not None:
            try:
                spec.validate(value, ctx)
            except _DlqTopicNameError:
                raise
            except InvalidGroupConfig as exc:
                raise InvalidGroupConfig(f"Invalid value {shorten(value)} for configuration {key}: {exc}") from exc

    @classmethod
    def validate_all(cls, changes: list[tuple[str, str | None]], ctx: ValidationContext) -> None:
        for key, value in changes:
            cls.validate(key, value, ctx)

    def planned(self, group_id: str, changes: list[tuple[str, str | None]],
                ctx: ValidationContext) -> dict[str, str]:
        """The group's explicit configs once `changes` (set a value, or delete with None) are made; every
        change validated first. Nothing changes yet."""
        self.validate_all(changes, ctx)
        updated = dict(self._groups.get(group_id, {}))
        for key, value in changes:
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = value
        return updated

    def apply(self, group_id: str, changes: list[tuple[str, str | None]], ctx: ValidationContext) -> None:
        """Standalone: set (value) or delete (None) keys, all validated first, then persisted atomically."""
        assert self.store is None, "with a store, changes go through alter()"
        self.replace(group_id, self.planned(group_id, changes, ctx))

    async def alter(self, group_id: str, changes: list[tuple[str, str | None]], ctx: ValidationContext) -> None:
        """As `apply`, through the store when there is one: in effect here once the store has it. The store
        keeps only the names changed, so a change of other names made meanwhile elsewhere stays."""
        async with self._writing:
            if self.store is None:
                self.replace(group_id, self.planned(group_id, changes, ctx))
            else:
                self.validate_all(changes, ctx)
                await self.store.write(group_id, changes)  # the store applies it here through `replace`

    async def set_all(self, group_id: str, configs: list[tuple[str, str]], ctx: ValidationContext) -> None:
        """AlterConfigs (not incremental): the group's configs become exactly `configs`; with a store, the
        names to delete are those it holds once what other instances stored has been read."""
        await self.refresh()
        names = {name for name, _value in configs}
        deleted: list[tuple[str, str | None]] = [(k, None) for k in self.explicit(group_id) if k not in names]
        await self.alter(group_id, [*configs, *deleted], ctx)

    async def refresh(self) -> None:
        """With a store, apply what other instances stored so far (a read of one's own writes across
        sidecars); standalone, the configs here are all there is."""
        if self.store is not None:
            await self.store.refresh()

    async def delete_group(self, group_id: str) -> None:
        async with self._writing:
            if self.store is not None:
                await self.store.delete_group(group_id)
            elif group_id in self._groups:
                self.replace(group_id, {})

    def replace(self, group_id: str, configs: Mapping[str, str] | None) -> None:
        """Make the group's explicit configs exactly `configs` (empty or None: none), saved to the local
        file when there is no store (the store's reader calls this for what it reads)."""
        if configs:
            self._groups[group_id] = dict(configs)
        elif self._groups.pop(group_id, None) is None:
            return
        if self.store is None:
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(self._groups, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
