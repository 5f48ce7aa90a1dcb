"""Idempotent-producer bookkeeping: producer id allocation and per-partition sequence checks.

A retried batch (same producer id, epoch and sequence range as one of the last five appended) is
answered with its original offset instead of being appended twice, as Kafka does.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from shoal.protocol.errors import ErrorCode

MAX_CACHED_BATCHES = 5
_ID_BLOCK = 1000


@dataclass(slots=True)
class _BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[_BatchMeta] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class SequenceCheck:
    """Outcome of checking one batch: append it, answer a duplicate with its old offset, or an error."""

    __slots__ = ("error", "duplicate_offset")

    def __init__(self, error: int = ErrorCode.NONE, duplicate_offset: int = -1):
        self.error = error
        self.duplicate_offset = duplicate_offset


OK = SequenceCheck()


class PartitionProducerState:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, record_count: int) -> SequenceCheck:
        entry = self.producers.get(producer_id)
        last_seq = (first_seq + record_count - 1) & 0x7FFFFFFF
        if entry is None:
            # Unknown to this partition (new producer, or state lost at restart): accept and start tracking.
            return OK
        if epoch < entry.epoch:
            return SequenceCheck(ErrorCode.INVALID_PRODUCER_EPOCH)
        if epoch > entry.epoch:
            if first_seq != 0:
                return SequenceCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            return OK
        for meta in entry.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return SequenceCheck(duplicate_offset=meta.base_offset)
        expected = (entry.last_seq + 1) & 0x7FFFFFFF
        if first_seq != expected:
            return SequenceCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return OK

    def record(self, producer_id: int, epoch: int, first_seq: int, record_count: int, base_offset: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        entry.batches.append(_BatchMeta(first_seq, (first_seq + record_count - 1) & 0x7FFFFFFF, base_offset))


class ProducerIdAllocator:
    """Hands out producer ids, reserving them in blocks persisted before use so ids never repeat across restarts."""

    def __init__(self, path: Path):
        self.path = path
        self._next = 0
        self._block_end = 0
        if path.exists():
            self._next = int(path.read_text().strip() or 0)
            self._block_end = self._next

    def allocate(self) -> int:
        if self._next >= self._block_end:
            self._block_end = self._next + _ID_BLOCK
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                fh.write(str(self._block_end))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        pid = self._next
        self._next += 1
        return pid
