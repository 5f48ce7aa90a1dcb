"""Adapts an internal topic's partition logs to the coordinators' record-log interface."""

from __future__ import annotations

from collections.abc import Iterator

import structlog

from shoal.protocol.coordinator_records import CoordinatorRecord, decode_record, encode_record
from shoal.protocol.record_batch import InvalidRecordBatch, iter_batches
from shoal.protocol.records import RecordInput, decode_records, encode_batch

from .topic_registry import CONSUMER_OFFSETS, Topic

log = structlog.get_logger("shoal.internal_topic")

_READ_CHUNK = 4 * 1024 * 1024


class InternalTopicLog:
    def __init__(self, topic: Topic):
        self.topic = topic
        self.offsets_topic = topic.name == CONSUMER_OFFSETS

    @property
    def num_partitions(self) -> int:
        return len(self.topic.partitions)

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        first = self.append_nowait(partition, records)
        await self.flush(partition, first + len(records))
        return first

    def append_nowait(self, partition: int, records: list[CoordinatorRecord]) -> int:
        plog = self.topic.partitions[partition]
        batch = bytearray(encode_batch([RecordInput(key=k, value=v) for k, v in map(encode_record, records)]))
        return plog.append(batch, list(iter_batches(batch))).base_offset

    async def flush(self, partition: int, end_offset: int) -> None:
        await self.topic.partitions[partition].flush(end_offset)

    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        """Every readable record, oldest first. A batch or record that cannot be read is skipped with an
        error line, never fatal: one bad batch must not keep the broker from starting (log recovery
        has already cut torn or CRC-damaged tails; what is left here is framed but unreadable)."""
        plog = self.topic.partitions[partition]
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            data = plog.read(offset, _READ_CHUNK)
            if not data:
                break
            last = None
            for pos, header in iter_batches(data):
                last = header.last_offset
                if header.is_control or header.last_offset < offset:
                    continue
                try:
                    records = decode_records(data, pos, header)
                except InvalidRecordBatch as exc:
                    log.error("skipping unreadable batch in internal topic", topic=self.topic.name,
                              partition=partition, base_offset=header.base_offset,
                              last_offset=header.last_offset, error=str(exc))
                    continue
                for record in records:
                    if record.offset < offset or record.key is None:
                        continue
                    try:
                        decoded = decode_record(record.key, record.value, offsets_topic=self.offsets_topic)
                    except ValueError as exc:  # DecodeError, or a value version no spec knows
                        log.warning("skipping undecodable coordinator record", topic=self.topic.name,
                                    partition=partition, offset=record.offset, error=str(exc))
                        continue
                    yield record.offset, decoded
            if last is None:
                break
            offset = last + 1

    def delete_before(self, partition: int, offset: int) -> None:
        self.topic.partitions[partition].delete_records_before(offset)
