"""Producer bookkeeping per partition: idempotent sequences, open transactions and aborted transactions.

A retried batch (same producer id, epoch and sequence range as one of the last five appended) is
answered with its original offset instead of being appended twice, as Kafka does.

Transactions (Kafka's ProducerStateManager and transaction index): the first transactional batch of a
producer opens a transaction at its offset; a COMMIT or ABORT marker closes it. The last stable offset
is the first offset of the oldest open transaction (else the high watermark); an aborted transaction is
remembered as (producer id, first offset, marker offset) so read_committed fetches can list it.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from shoal.protocol.errors import ErrorCode

MAX_CACHED_BATCHES = 5
MAX_PRODUCER_EPOCH = 32767
_ID_BLOCK = 1000


@dataclass(slots=True)
class _BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp: int = -1  # max timestamp of its last batch (DescribeProducers)
    # The coordinator epoch of the last marker written for this producer here; a marker with an older one
    # comes from a fenced coordinator (Kafka's ProducerStateEntry.coordinatorEpoch).
    coordinator_epoch: int = -1
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


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of its ABORT marker


class PartitionProducerState:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction, in the order they were opened.
        self.ongoing: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []  # ordered by marker offset
        self.last_timestamps: dict[int, int] = {}

    def first_unstable_offset(self) -> int | None:
        return min(self.ongoing.values()) if self.ongoing else None

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_unstable_offset()
        return high_watermark if first is None else min(first, high_watermark)

    def on_transactional_batch(self, producer_id: int, base_offset: int) -> None:
        self.ongoing.setdefault(producer_id, base_offset)

    def on_marker(self, producer_id: int, epoch: int, commit: bool, offset: int,
                  coordinator_epoch: int = -1) -> AbortedTxn | None:
        """A COMMIT/ABORT control batch at `offset` ends the producer's open transaction; an epoch bump
        (a fenced producer's transaction aborted by the coordinator) restarts its sequences."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        entry.coordinator_epoch = coordinator_epoch
        first = self.ongoing.pop(producer_id, None)
        if commit or first is None:
            return None
        txn = AbortedTxn(producer_id, first, offset)
        self.aborted.append(txn)
        return txn

    def _ending_from(self, offset: int) -> list[AbortedTxn]:
        """Aborted transactions whose marker is at or after `offset` (the list is in marker order)."""
        lo, hi = 0, len(self.aborted)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.aborted[mid].last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return self.aborted[lo:]

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end): those a fetch of that range must drop."""
        return [t for t in self._ending_from(start) if t.first_offset < end]

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return any(t.producer_id == producer_id and t.first_offset <= offset for t in self._ending_from(offset))

    def drop_aborted_before(self, offset: int) -> None:
        """Forget aborted transactions wholly below the log start."""
        self.aborted = [t for t in self.aborted if t.last_offset >= offset]

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Kafka's producer.id.expiration.ms: forget producers with no open transaction here whose last
        batch is that old. Returns how many went."""
        expired = [pid for pid, entry in self.producers.items()
                   if pid not in self.ongoing and now_ms - entry.last_timestamp >= expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int,
                     transaction_version: int = 0) -> tuple[int, str] | None:
        """Kafka's checks of an end-transaction marker against the producer (ProducerAppendInfo): the error
        code and message refusing it, or None. An older producer epoch is INVALID_PRODUCER_EPOCH (for a
        transaction.version 2 marker, whose epoch was bumped, the same epoch too, unless it repeats the marker
        that already ended the transaction here); a coordinator epoch older than the last marker's is a zombie
        coordinator's, TRANSACTION_COORDINATOR_FENCED."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if transaction_version >= 2:
            repeat = epoch == entry.epoch and (producer_id not in self.ongoing or epoch == MAX_PRODUCER_EPOCH)
            invalid = epoch <= entry.epoch and not repeat
        else:
            invalid = epoch < entry.epoch
        if invalid:
            comparison = "<=" if transaction_version >= 2 else "<"
            return (ErrorCode.INVALID_PRODUCER_EPOCH,
                    f"Epoch of producer {producer_id} is {epoch}, which is {comparison} the last seen epoch "
                    f"{entry.epoch} (TV{transaction_version})")
        if entry.coordinator_epoch > coordinator_epoch:
            return (ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                    f"Invalid coordinator epoch for producerId {producer_id}: {coordinator_epoch} (zombie), "
                    f"{entry.coordinator_epoch} (current)")
        return None

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

    def record(self, producer_id: int, epoch: int, first_seq: int, record_count: int, base_offset: int,
               max_timestamp: int = -1) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch:
            # A new epoch restarts the sequences; the last coordinator epoch stays, as in Kafka.
            entry = ProducerEntry(epoch, coordinator_epoch=-1 if entry is None else entry.coordinator_epoch)
            self.producers[producer_id] = entry
        entry.last_timestamp = max_timestamp
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
