"""How many log bytes one acquisition pass of a share partition reads.

A ShareFetch allows a partition its share of MaxBytes (fetch.max.bytes split evenly: megabytes), but a
pass acquires at most MaxRecords. Kafka reads its log as file slices that cost nothing until sent; this
broker copies what it reads and walks every batch header in it, so reading the whole allowance would
cost a consumer asking for 500 records a 16 MiB copy per partition and fetch. The read is sized to the
records the pass may take instead, judged by the bytes per offset of the batches the partition's last
pass read. A pass that comes up short only means the consumer's next fetch goes on from there.
"""

from __future__ import annotations

from collections.abc import Iterable

from shoal.protocol.record_batch import BatchHeader

# Below this a read is mostly per-call cost; a log of tiny batches still gets a few hundred per pass.
MIN_READ_BYTES = 64 * 1024
# Before anything has been read the batch sizes are unknown: as much as a consumer's partition fetch.
FIRST_READ_BYTES = 1024 * 1024
# Batches do not end where the wanted records do, and sizes vary along the log.
_SLACK = 1.25


class AcquireReadSize:
    """Bytes per offset of the partition's last read, and the read size it implies."""

    __slots__ = ("bytes_per_offset",)

    def __init__(self) -> None:
        self.bytes_per_offset: float | None = None

    def bytes_for(self, max_records: int, max_bytes: int) -> int:
        """What to read for `max_records` offsets, never over the request's `max_bytes` (at least 1)."""
        if self.bytes_per_offset is None:
            want = FIRST_READ_BYTES
        else:
            want = max(MIN_READ_BYTES, int(max_records * self.bytes_per_offset * _SLACK))
        return max(1, min(max_bytes, want))

    def observe(self, headers: Iterable[BatchHeader]) -> None:
        """Learn from the batches a pass read (offsets, not records: compaction leaves gaps)."""
        size = offsets = 0
        for h in headers:
            size += h.size
            offsets += h.last_offset - h.base_offset + 1
        if offsets > 0:
            self.bytes_per_offset = size / offsets
