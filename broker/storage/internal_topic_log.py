"""Adapts an internal topic's partition logs to the coordinators' record-log interface."""

from __future__ import annotations

from collections.abc import Iterator

import structlog

from shoal.protocol.codec import DecodeError
from shoal.protocol.coordinator_records import CoordinatorRecord, decode_record, encode_record
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, decode_batches, encode_batch

from .topic_registry import Topic

log = structlog.get_logger("shoal.internal_topic")

_READ_CHUNK = 4 * 1024 * 1024


class InternalTopicLog:
    def __init__(self, topic: Topic):
        self.topic = topic

    @property
    def num_partitions(self) -> int:
        return len(self.topic.partitions)

    def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        plog = self.topic.partitions[partition]
        batch = bytearray(encode_batch([RecordInput(key=k, value=v) for k, v in map(encode_record, records)]))
        return plog.append(batch, list(iter_batches(batch))).base_offset

    async def flush(self, partition: int, end_offset: int) -> None:
        await self.topic.partitions[partition].flush(end_offset)

    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        plog = self.topic.partitions[partition]
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            data = plog.read(offset, _READ_CHUNK)
            if not data:
                break
            for record in decode_batches(data):
                if record.offset < offset or record.key is None:
                    continue
                try:
                    yield record.offset, decode_record(record.key, record.value)
                except DecodeError as exc:
                    log.warning("skipping undecodable coordinator record", topic=self.topic.name,
                                partition=partition, offset=record.offset, error=str(exc))
            last = None
            for _pos, header in iter_batches(data):
                last = header.last_offset
            if last is None:
                break
            offset = last + 1

    def delete_before(self, partition: int, offset: int) -> None:
        self.topic.partitions[partition].delete_records_before(offset)
