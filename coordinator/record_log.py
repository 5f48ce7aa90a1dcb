"""The small interface through which coordinators reach their internal topic, without broker internals.

A coordinator writes records, waits until they are durable, and only then replays them into its
in-memory state; on start-up it replays everything the topic still holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from shoal.broker.storage.internal_topic_log import CoordinatorLogError
from shoal.protocol.coordinator_records import (
    NO_PRODUCER_ID,
    CoordinatorRecord,
    EndTransactionMarker,
    LoggedRecord,
)

__all__ = ["NO_PRODUCER_ID", "CoordinatorLogError", "CoordinatorRecordLog", "EndTransactionMarker", "LoggedRecord", "TransactionalRecordLog"]


class CoordinatorRecordLog(Protocol):
    """One internal topic (`__consumer_offsets`, `__share_group_state` or `__transaction_state`) seen as
    partitions of records."""

    @property
    def num_partitions(self) -> int: ...

    async def append(self, partition: int, records: list[CoordinatorRecord]) -> int:
        """Append records as one batch and return once they are fsynced; returns the first offset. A log that
        can refuse (sidecar mode's upstream) raises CoordinatorLogError with the code to answer."""
        ...

    def append_nowait(self, partition: int, records: list[CoordinatorRecord]) -> int:
        """Append records as one batch, not yet durable (`flush` waits for that); returns the first offset."""
        ...

    async def flush(self, partition: int, end_offset: int) -> None:
        """Return once every record below `end_offset` is fsynced (appends waiting together share one fsync)."""
        ...

    def replay(self, partition: int) -> Iterator[tuple[int, CoordinatorRecord]]:
        """Every (offset, record) the partition holds, oldest first."""
        ...

    def delete_before(self, partition: int, offset: int) -> None:
        """Drop records below `offset` (pruning of records no longer needed)."""
        ...


@runtime_checkable
class TransactionalRecordLog(CoordinatorRecordLog, Protocol):
    """`__consumer_offsets`, which also holds transactional offset commits and their markers."""

    def append_transactional_nowait(self, partition: int, records: list[CoordinatorRecord], producer_id: int,
                                    producer_epoch: int) -> int:
        """Append records as one transactional batch of the producer (not yet durable); returns the first offset."""
        ...

    def replay_transactional(self, partition: int) -> Iterator[LoggedRecord | EndTransactionMarker]:
        """Every record and end-transaction marker, in log order, transactional records at their own offset."""
        ...
