"""The log seam: where a partition's records come from, for a reader that does not care which.

A share-partition leader (and later the fetch path) asks a `PartitionSource` for whole batches from an
offset and learns the partition's watermarks with them. Standalone, the source is the local
`PartitionLog` (`LocalPartitionSource`); in sidecar mode it is the upstream cluster, read with Fetch
through a batch cache (`shoal.broker.upstream.partition_reader.UpstreamPartitionSource`). Both hand out
stored batch bytes as they are, never re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shoal.protocol.record_batch import BatchHeader

from .partition_log import OffsetOutOfRange, PartitionLog

__all__ = ["EARLIEST", "LATEST", "LocalPartitionSource", "OffsetOutOfRange", "PartitionSource", "SourceRead",
           "SourceUnavailable", "undeliverable"]

# ListOffsets' special timestamps (Kafka's ListOffsetsRequest.EARLIEST_TIMESTAMP and LATEST_TIMESTAMP).
EARLIEST = -2
LATEST = -1


class SourceUnavailable(Exception):
    """The source cannot be read now (an upstream unreachable or without a leader); retriable."""


@dataclass(frozen=True, slots=True)
class SourceRead:
    """Whole batches from the one holding the offset asked for, and the partition's state at the read."""

    batches: list[tuple[BatchHeader, memoryview]]
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # read_committed: (producer id, first offset) of each aborted transaction with records in the range
    # read, as Fetch lists them; empty for read_uncommitted.
    aborted: list[tuple[int, int]] = field(default_factory=list)


class PartitionSource(Protocol):
    async def read(self, fetch_offset: int, max_bytes: int, *, read_committed: bool = False) -> SourceRead:
        """Batches from `fetch_offset` within `max_bytes` (at least one batch when there is one), stopping at
        the high watermark, or at the last stable offset when `read_committed`. Raises OffsetOutOfRange
        when `fetch_offset` lies outside the log."""
        ...

    async def bytes_from(self, offset: int, enough: int, *, read_committed: bool = False) -> int:
        """Bytes readable from `offset` on, counted up to at least `enough` (what a long poll weighs against
        MinBytes); 0 at or past the end (the last stable offset when `read_committed`)."""
        ...

    async def list_offset(self, timestamp: int) -> int:
        """The log start offset for EARLIEST, the high watermark for LATEST, else the first offset whose
        record's timestamp is at or after `timestamp` (the high watermark when there is none)."""
        ...


class LocalPartitionSource:
    """The local log as a `PartitionSource`."""

    def __init__(self, plog: PartitionLog):
        self.plog = plog

    async def read(self, fetch_offset: int, max_bytes: int, *, read_committed: bool = False) -> SourceRead:
        plog = self.plog
        # The last stable offset and aborted transactions need the producer state (built lazily, in slices).
        await plog.load_producer_state(only_for_transactions=True)
        limit = plog.last_stable_offset if read_committed else plog.high_watermark
        if limit <= fetch_offset <= plog.high_watermark:
            # Nothing to read yet (read_committed: only an open transaction's records lie ahead).
            return SourceRead([], plog.high_watermark, plog.last_stable_offset, plog.log_start_offset)
        batches = plog.read_batch_headers(fetch_offset, max_bytes, max_offset=limit)
        aborted: list[tuple[int, int]] = []
        if read_committed and batches:
            end = batches[-1][0].last_offset + 1
            aborted = [(t.producer_id, t.first_offset) for t in plog.aborted_transactions(fetch_offset, end)]
        return SourceRead(batches, plog.high_watermark, plog.last_stable_offset, plog.log_start_offset, aborted)

    async def bytes_from(self, offset: int, enough: int, *, read_committed: bool = False) -> int:
        await self.plog.load_producer_state(only_for_transactions=True)
        if read_committed and offset >= self.plog.last_stable_offset:
            return 0
        return self.plog.bytes_from(offset, enough)

    async def list_offset(self, timestamp: int) -> int:
        plog = self.plog
        if timestamp == EARLIEST:
            return plog.log_start_offset
        if timestamp == LATEST:
            return plog.high_watermark
        found = plog.offset_for_timestamp(timestamp)
        return found[0] if found is not None else plog.high_watermark


def undeliverable(read: SourceRead) -> set[tuple[int, int]]:
    """(first, last) offsets of the batches a reader must not hand out: control batches, and under
    read_committed the batches of aborted transactions. As Kafka's consumer does it: a producer listed
    as aborted from a first offset is aborted from the first of its batches at or past that offset until
    its ABORT marker."""
    pending = sorted(read.aborted, key=lambda entry: entry[1])
    aborting: set[int] = set()
    out: set[tuple[int, int]] = set()
    for header, _ in read.batches:
        while pending and pending[0][1] <= header.base_offset:
            aborting.add(pending.pop(0)[0])
        if header.is_control:
            out.add((header.base_offset, header.last_offset))
            aborting.discard(header.producer_id)
        elif header.is_transactional and header.producer_id in aborting:
            out.add((header.base_offset, header.last_offset))
    return out
