"""Sidecar mode: dynamic group configs (ConfigResource GROUP) kept on the upstream.

`<prefix>_group_configs` (`__shoal_group_configs` for the default deployment) is a compacted state topic,
created with the others (`state_topics.py`). As Kafka's
controller keeps a config as one ConfigRecord per resource and name, each change of one group config is one
record, keyed by the group id and the config name (a JSON array of the two), whose value is the config's
value (null: deleted). Compaction keeps the latest record of each (group, name), and changes of different
names made at once through different sidecars both stay: each change writes only the names it changes, and
every sidecar applies the records in the partition's order. Every write goes to partition 0 with acks=all,
one batch per change (so a change's names land together), and a change is answered only once the upstream
has it. Each sidecar reads the whole partition at start-up and then keeps reading it, so a change made
through one sidecar reaches the others; the one that wrote it applies it at once.

Records written before this layout (keyed by the group id alone, the group's whole config map as a JSON
object, null for none) are still read: such a record sets the names it holds and deletes the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence

import structlog

from shoal.broker.storage.partition_source import SourceUnavailable
from shoal.protocol.record_batch import BatchHeader, CorruptRecordBatch
from shoal.protocol.records import RecordInput, decode_records, encode_batch

from .cluster import UpstreamCluster
from .forwarder import Forwarder
from .partition_reader import BatchCache, UpstreamPartitionSource
from .produce import produce_acks_all
from .state_topic_names import StateTopicNames
from .state_topics import ensure_state_topics

log = structlog.get_logger("shoal.upstream.group_configs")

GROUP_CONFIGS_TOPIC = StateTopicNames().group_configs  # the default deployment's
PARTITION = 0
_READ_BYTES = 1 << 20
_CACHE_BYTES = 4 << 20
# How often the tail asks the upstream for changes made through other sidecars, and how long it waits
# before retrying an upstream that did not answer.
TAIL_INTERVAL_S = 0.5
_RETRY_S = 1.0

# Called with (group id, its explicit configs or None) after records of the group were applied.
OnChange = Callable[[str, Mapping[str, str] | None], None]
# A change of one group's configs: each name with its new value, or None to delete it.
Changes = Sequence[tuple[str, str | None]]


def encode_key(group_id: str, name: str) -> bytes:
    return json.dumps([group_id, name], separators=(",", ":")).encode()


def decode_key(key: bytes) -> tuple[str, str | None]:
    """(group id, config name) of a record's key; the name is None for a record of the earlier layout,
    keyed by the group id alone."""
    text = key.decode(errors="replace")
    if text.startswith("["):
        try:
            decoded = json.loads(text)
        except ValueError:
            decoded = None
        if isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(x, str) for x in decoded):
            return decoded[0], decoded[1]
    return text, None


def encode_value(configs: Mapping[str, str] | None) -> bytes | None:
    """The earlier layout's value: a group's whole config map (None when it has none)."""
    return None if not configs else json.dumps(dict(sorted(configs.items())), separators=(",", ":")).encode()


def decode_value(value: bytes | None) -> dict[str, str] | None:
    """The config map of an earlier-layout record's value; ValueError when it is not a JSON object of
    strings."""
    if value is None:
        return None
    decoded = json.loads(value)
    if not isinstance(decoded, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in decoded.items()):
        raise ValueError("not a JSON object of string values")
    return decoded or None


def change_records(group_id: str, changes: Changes) -> list[RecordInput]:
    """One record per name changed (the last change of a name wins, as it would applied in order)."""
    latest = dict(changes)
    return [RecordInput(key=encode_key(group_id, name), value=None if value is None else value.encode())
            for name, value in latest.items()]


class GroupConfigView:
    """The group configs as the records applied so far make them. Records may be applied out of the
    partition's order (a sidecar applies its own write before its tail reaches earlier records of others):
    a change of a name older than the one applied last for it is ignored."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, str]] = {}
        # Per (group, name), the offset of the change applied last.
        self.applied_at: dict[tuple[str, str], int] = {}
        # Groups with an earlier-layout record that is not a tombstone (deleting the group writes one).
        self.whole_map_groups: set[str] = set()

    def explicit(self, group_id: str) -> dict[str, str]:
        return dict(self.groups.get(group_id, {}))

    def apply_record(self, key: bytes, value: bytes | None, offset: int) -> tuple[str, bool]:
        """(group id, whether its configs changed) for the record at `offset`; ValueError when an
        earlier-layout value is unreadable."""
        group, name = decode_key(key)
        if name is not None:
            return group, self._apply(group, name, None if value is None else value.decode(errors="replace"), offset)
        configs = decode_value(value)
        if configs:
            self.whole_map_groups.add(group)
        else:
            self.whole_map_groups.discard(group)
        changed = False
        for each in sorted(set(self.groups.get(group, {})) | set(configs or {})):
            changed |= self._apply(group, each, (configs or {}).get(each), offset)
        return group, changed

    def _apply(self, group: str, name: str, value: str | None, offset: int) -> bool:
        if offset < self.applied_at.get((group, name), -1):
            return False
        self.applied_at[(group, name)] = offset
        configs = self.groups.setdefault(group, {})
        if value is None:
            configs.pop(name, None)
        else:
            configs[name] = value
        if not configs:
            del self.groups[group]
        return True


class UpstreamGroupConfigLog:
    """The `GroupConfigStore` of sidecar mode, and the reader that keeps this sidecar's copy current."""

    def __init__(self, cluster: UpstreamCluster, forwarder: Forwarder, on_change: OnChange, *,
                 timeout_ms: int = 30_000, topic: str = GROUP_CONFIGS_TOPIC):
        self.topic = topic
        self.cluster = cluster
        self.forwarder = forwarder
        self.on_change = on_change
        self.timeout_ms = timeout_ms
        self.source = UpstreamPartitionSource(cluster, BatchCache(_CACHE_BYTES), topic, PARTITION)
        self.next_offset = 0  # the next offset to read
        # The configs as the records read so far (and this sidecar's own writes) make them.
        self.view = GroupConfigView()
        self._tail: asyncio.Task[None] | None = None
        self._reading = asyncio.Lock()  # one reader at a time: the tail, or a change that reads first

    async def start(self, replication_factor: int | None) -> None:
        """Create the topic when missing, read it to its end (raises SourceUnavailable when the upstream does
        not answer), then keep reading it in the background."""
        await ensure_state_topics(self.cluster, {self.topic: 1}, replication_factor)
        await self.catch_up()
        self._tail = asyncio.get_running_loop().create_task(self._tail_loop())

    async def stop(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)

    async def write(self, group_id: str, changes: Changes) -> None:
        """Produce the changed names of the group with acks=all, then apply them here (`on_change`); raises
        UpstreamProduceFailed when the upstream does not take them."""
        await self._produce(group_id, change_records(group_id, changes))

    async def delete_group(self, group_id: str) -> None:
        """Delete every config of the group: a tombstone for each name it has once this sidecar has read
        the partition to its end (a name set through another sidecar since is deleted too, unless it lands
        after the tombstones)."""
        await self.refresh()
        records = change_records(group_id, [(name, None) for name in sorted(self.view.explicit(group_id))])
        if group_id in self.view.whole_map_groups:
            records.append(RecordInput(key=group_id.encode(), value=None))
        await self._produce(group_id, records)

    async def refresh(self) -> None:
        """Read what other sidecars added, when the upstream answers (else go on with what was read)."""
        try:
            await self.catch_up()
        except SourceUnavailable as exc:
            log.info("reading the upstream group configs failed", error=str(exc))

    async def _produce(self, group_id: str, records: list[RecordInput]) -> None:
        if not records:
            return
        base = await produce_acks_all(self.forwarder, self.topic, PARTITION, encode_batch(records),
                                      timeout_ms=self.timeout_ms, what="group configs")
        changed = False
        for i, record in enumerate(records):
            assert record.key is not None
            changed |= self.view.apply_record(record.key, record.value, base + i)[1]
        if changed:
            self.on_change(group_id, self.view.groups.get(group_id))

    async def catch_up(self) -> None:
        """Read and apply every record up to the partition's current end."""
        async with self._reading:
            await self._read_to_end()

    async def _read_to_end(self) -> None:
        def restarted(log_start_offset: int) -> None:
            if log_start_offset < self.next_offset:
                self.view.applied_at.clear()  # offsets start again: the new topic's records all count
            self.next_offset = log_start_offset

        async with contextlib.aclosing(self.source.batches_to_end(self.next_offset, _READ_BYTES,
                                                                   on_log_start=restarted)) as batches:
            async for header, data in batches:
                if not header.is_control:
                    self._apply_batch(header, data)
                self.next_offset = header.last_offset + 1

    def _apply_batch(self, header: BatchHeader, data: memoryview) -> None:
        try:
            records = decode_records(data, 0, header)
        except CorruptRecordBatch as exc:
            log.warning("unreadable group-config batch skipped", offset=header.base_offset, error=str(exc))
            return
        changed: set[str] = set()
        for record in records:
            if record.offset < self.next_offset or record.key is None:
                continue
            try:
                group, group_changed = self.view.apply_record(
                    bytes(record.key), None if record.value is None else bytes(record.value), record.offset)
            except ValueError as exc:
                log.warning("unreadable group-config record skipped", key=bytes(record.key)[:200],
                            offset=record.offset, error=str(exc))
                continue
            if group_changed:
                changed.add(group)
        for group in sorted(changed):
            self.on_change(group, self.view.groups.get(group))

    async def _tail_loop(self) -> None:
        while True:
            await asyncio.sleep(TAIL_INTERVAL_S)
            try:
                await self.catch_up()
            except SourceUnavailable as exc:
                log.info("reading the upstream group configs failed; retrying", error=str(exc))
                await asyncio.sleep(_RETRY_S)
            except Exception:
                log.exception("reading the upstream group configs failed; retrying")
                await asyncio.sleep(_RETRY_S)
