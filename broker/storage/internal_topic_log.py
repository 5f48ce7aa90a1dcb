"""Adapts an internal topic's partition logs to the coordinators' record-log interface."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import structlog

from shoal.protocol.coordinator_records import (
    NO_PRODUCER_ID,
    CoordinatorRecord,
    EndTransactionMarker,
    LoggedRecord,
    decode_record,
    encode_record,
)
from shoal.protocol.record_batch import BatchHeader, InvalidRecordBatch, iter_batches
from shoal.protocol.records import (
    CONTROL_COMMIT,
    Record,
    RecordInput,
    control_record_type,
    decode_records,
    encode_batch,
)

from .partition_log import AppendOrigin
from .topic_registry import Topic

log = structlog.get_logger("shoal.internal_topic")

_READ_CHUNK = 4 * 1024 * 1024


def logged_records(topic: str, partition: int, header: BatchHeader,
                   records: list[Record]) -> Iterator[LoggedRecord | EndTransactionMarker]:
    """One batch of an internal topic as coordinator records (or its end-transaction marker), as replay
    reads them: a transactional record carries its producer id; records without a key and undecodable
    ones are skipped, the latter with a warning. `topic` is the internal topic whose formats apply."""
    if header.is_control:
        if records:
            commit = control_record_type(records[0]) == CONTROL_COMMIT
            yield EndTransactionMarker(records[0].offset, header.producer_id, commit)
        return
    producer_id = header.producer_id if header.is_transactional else NO_PRODUCER_ID
    for r in records:
        if r.key is None:
            continue
        try:
            decoded = decode_record(bytes(r.key), None if r.value is None else bytes(r.value), topic=topic)
        except ValueError as exc:  # DecodeError, or a value version no spec knows
            log.warning("skipping undecodable coordinator record", topic=topic, partition=partition,
                        offset=r.offset, error=str(exc))
            continue
        yield LoggedRecord(r.offset, decoded, producer_id)


def encode_records(records: list[CoordinatorRecord], *, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                   base_sequence: int = -1, is_transactional: bool = False) -> bytes:
    """Coordinator records as one record batch, in the bytes an internal topic holds."""
    return encode_batch([RecordInput(key=k, value=v) for k, v in map(encode_record, records)],
                        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
                        is_transactional=is_transactional)


class InternalTopicLog:
    def __init__(self, topic: Topic):
        self.topic = topic

    @property
    def num_partitions(self) -> int:
        return len(self.topic.partitions)

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        first = self.append_nowait(partition, records)
        await self.flush(partition, first + len(records))
        return first

    def append_nowait(self, partition: int, records: list[CoordinatorRecord]) -> int:
        """Append as the coordinator, through the checks and bookkeeping every writer gets
        (`PartitionLog.append_as_leader`); raises AppendRefused if the topic's rules refuse the batch."""
        batch = encode_records(records)
        plog = self.topic.partitions[partition]
        return plog.append_as_leader(batch, origin=AppendOrigin.COORDINATOR).base_offset

    def append_transactional_nowait(self, partition: int, records: list[CoordinatorRecord], producer_id: int,
                                    producer_epoch: int) -> int:
        """Append records as one transactional batch of the producer (TxnOffsetCommit); its marker later
        decides whether they count."""
        batch = encode_records(records, producer_id=producer_id, producer_epoch=producer_epoch, is_transactional=True)
        plog = self.topic.partitions[partition]
        return plog.append_as_leader(batch, origin=AppendOrigin.COORDINATOR).base_offset

    async def flush(self, partition: int, end_offset: int) -> None:
        await self.topic.partitions[partition].flush(end_offset)


    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        """Every readable coordinator record written outside a transaction, oldest first (the coordinators
        whose topics hold transactional batches read `replay_transactional`)."""
        for item in self.replay_transactional(partition):
            if isinstance(item, LoggedRecord) and item.producer_id == NO_PRODUCER_ID:
                yield item.offset, item.record

    def replay_transactional(self, partition: int) -> Iterator[LoggedRecord | EndTransactionMarker]:
        """Every readable record and end-transaction marker in log order; a transactional record comes at
        its own offset with its producer id (its marker decides later), not held back until the marker.
        Undecodable records are skipped with a warning."""
        for header, records in self._batches(partition):
            yield from logged_records(self.topic.name, partition, header, records)

    def _batches(self, partition: int) -> Iterator[tuple[BatchHeader, list[Record]]]:
        """Every batch the partition holds with its records, oldest first.

        A batch that cannot be read is skipped with an error line, never fatal: one bad batch must not keep
        the broker from starting (log recovery has already cut torn or CRC-damaged tails; what is left
        here is framed but unreadable)."""
        plog = self.topic.partitions[partition]
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            data = plog.read(offset, _READ_CHUNK)
            if not data:
                break
            last = None
            for pos, header in iter_batches(data):
                last = header.last_offset
                if header.last_offset < offset:
                    continue
                try:
                    records = decode_records(data, pos, header)
                except InvalidRecordBatch as exc:
                    log.error("skipping unreadable batch in internal topic", topic=self.topic.name,
                              partition=partition, base_offset=header.base_offset,
                              last_offset=header.last_offset, error=str(exc))
                    continue
                yield header, [r for r in records if r.offset >= offset]
            if last is None:
                break
            offset = last + 1

    def delete_before(self, partition: int, offset: int) -> None:
        self.topic.partitions[partition].delete_records_before(offset)


class LazyInternalTopicLog:
    """An internal topic created on its first write, as Kafka creates `__transaction_state` when the
    first transactional producer comes (brokers that never see one never pay for its partitions)."""

    def __init__(self, find: Callable[[], Topic | None], create: Callable[[], Topic], num_partitions: int):
        self._find = find
        self._create = create
        self._num_partitions = num_partitions

    def _log(self) -> InternalTopicLog | None:
        topic = self._find()
        return None if topic is None else InternalTopicLog(topic)

    @property
    def num_partitions(self) -> int:
        topic = self._find()
        return self._num_partitions if topic is None else len(topic.partitions)

    def _log_or_create(self) -> InternalTopicLog:
        return self._log() or InternalTopicLog(self._create())

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        return await self._log_or_create().append(partition, records)

    def append_nowait(self, partition: int, records: list[CoordinatorRecord]) -> int:
        return self._log_or_create().append_nowait(partition, records)

    async def flush(self, partition: int, end_offset: int) -> None:
        await self._log_or_create().flush(partition, end_offset)

    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        log_ = self._log()
        if log_ is not None:
            yield from log_.replay(partition)

    def delete_before(self, partition: int, offset: int) -> None:
        log_ = self._log()
        if log_ is not None:
            log_.delete_before(partition, offset)


class CoordinatorLogError(Exception):
    """A coordinator record log's write (or read) that failed with a Kafka error code the coordinator
    answers with: NOT_COORDINATOR when this instance no longer owns the partition (fenced or released),
    a retriable code when the write may be tried again. Nothing of a failed write is replayed."""

    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        self.error_code = error_code
