"""Sidecar mode: dynamic group configs (ConfigResource GROUP) kept on the upstream.

`__shoal_group_configs` is a compacted state topic, created with the others (`state_topics.py`): one
record per change, keyed by the group id, whose value is the group's whole explicit config map as a JSON
object (a null value: the group has none left). Every write goes to partition 0 with acks=all, so the
partition's order is the order of the changes, and a change is answered only once the upstream has it.
Each sidecar reads the whole partition at start-up and then keeps reading it, so a change made through one
sidecar reaches the others; the one that wrote it applies it at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

import structlog

from shoal.broker.storage.partition_source import OffsetOutOfRange, SourceUnavailable
from shoal.protocol.record_batch import BatchHeader, CorruptRecordBatch
from shoal.protocol.records import RecordInput, decode_records, encode_batch

from .cluster import UpstreamCluster
from .forwarder import Forwarder
from .partition_reader import BatchCache, UpstreamPartitionSource
from .produce import produce_acks_all
from .state_topics import ensure_state_topics, state_topic_name

log = structlog.get_logger("shoal.upstream.group_configs")

GROUP_CONFIGS_TOPIC = state_topic_name("__group_configs")
PARTITION = 0
_READ_BYTES = 1 << 20
_CACHE_BYTES = 4 << 20
# How often the tail asks the upstream for changes made through other sidecars, and how long it waits
# before retrying an upstream that did not answer.
TAIL_INTERVAL_S = 0.5
_RETRY_S = 1.0

# Called with (group id, its explicit configs or None) for each record read, in log order.
OnChange = Callable[[str, Mapping[str, str] | None], None]


def encode_value(configs: Mapping[str, str] | None) -> bytes | None:
    return None if not configs else json.dumps(dict(sorted(configs.items())), separators=(",", ":")).encode()


def decode_value(value: bytes | None) -> dict[str, str] | None:
    """The config map of a record's value; ValueError when it is not a JSON object of strings."""
    if value is None:
        return None
    decoded = json.loads(value)
    if not isinstance(decoded, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in decoded.items()):
        raise ValueError("not a JSON object of string values")
    return decoded or None


class UpstreamGroupConfigLog:
    """The `GroupConfigStore` of sidecar mode, and the reader that keeps this sidecar's copy current."""

    def __init__(self, cluster: UpstreamCluster, forwarder: Forwarder, on_change: OnChange, *,
                 timeout_ms: int = 30_000):
        self.cluster = cluster
        self.forwarder = forwarder
        self.on_change = on_change
        self.timeout_ms = timeout_ms
        self.source = UpstreamPartitionSource(cluster, BatchCache(_CACHE_BYTES), GROUP_CONFIGS_TOPIC, PARTITION)
        self.next_offset = 0  # the next offset to read
        # Per group, the offset of the change applied last: a record read later but written earlier (this
        # sidecar's own write applied before the tail reached an older change of another) is not applied.
        self._applied_at: dict[str, int] = {}
        self._tail: asyncio.Task[None] | None = None

    async def start(self, replication_factor: int | None) -> None:
        """Create the topic when missing, read it to its end (raises SourceUnavailable when the upstream does
        not answer), then keep reading it in the background."""
        await ensure_state_topics(self.cluster, {GROUP_CONFIGS_TOPIC: 1}, replication_factor)
        await self.catch_up()
        self._tail = asyncio.get_running_loop().create_task(self._tail_loop())

    async def stop(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)

    async def write(self, group_id: str, configs: Mapping[str, str] | None) -> None:
        """Produce the group's configs with acks=all, then apply them here (`on_change`); raises
        UpstreamProduceFailed when the upstream does not take them."""
        batch = encode_batch([RecordInput(key=group_id.encode(), value=encode_value(configs))])
        offset = await produce_acks_all(self.forwarder, GROUP_CONFIGS_TOPIC, PARTITION, batch,
                                        timeout_ms=self.timeout_ms, what="group configs")
        # The tail may already have applied a later change of the group (made through another sidecar).
        if offset >= self._applied_at.get(group_id, -1):
            self._applied_at[group_id] = offset
            self.on_change(group_id, configs)

    async def catch_up(self) -> None:
        """Read and apply every record up to the partition's current end."""
        while True:
            try:
                read = await self.source.read(self.next_offset, _READ_BYTES)
            except OffsetOutOfRange as exc:
                # Below the log start (records deleted by retention), or past the end (the topic was deleted
                # and created again): read what there is from its start.
                if 0 <= exc.log_start_offset != self.next_offset:
                    if exc.log_start_offset < self.next_offset:
                        self._applied_at.clear()  # offsets start again: the new topic's records all count
                    self.next_offset = exc.log_start_offset
                    continue
                raise SourceUnavailable(f"{GROUP_CONFIGS_TOPIC}: {exc}") from exc
            for header, data in read.batches:
                if header.last_offset < self.next_offset:
                    continue
                if not header.is_control:
                    self._apply_batch(header, data)
                self.next_offset = header.last_offset + 1
            if self.next_offset >= read.high_watermark or not read.batches:
                return

    def _apply_batch(self, header: BatchHeader, data: memoryview) -> None:
        try:
            records = decode_records(data, 0, header)
        except CorruptRecordBatch as exc:
            log.warning("unreadable group-config batch skipped", offset=header.base_offset, error=str(exc))
            return
        for record in records:
            if record.offset < self.next_offset or record.key is None:
                continue
            group_id = record.key.decode(errors="replace")
            if record.offset < self._applied_at.get(group_id, -1):
                continue
            try:
                configs = decode_value(record.value)
            except ValueError as exc:
                log.warning("unreadable group-config record skipped", group=group_id, offset=record.offset,
                            error=str(exc))
                continue
            self._applied_at[group_id] = record.offset
            self.on_change(group_id, configs)

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
