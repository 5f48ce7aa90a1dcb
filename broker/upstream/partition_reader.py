"""Reading an upstream partition as a `PartitionSource`: Fetch from its leader, through a batch cache.

Several share consumers of one partition read the same offsets one after another (each acquires what the
last left), so recent batches are kept: a read that finds the batch holding its offset in the cache is
answered from there, following the batches that came after it in the same upstream read, and costs no
upstream request. Concurrent reads of one offset share one upstream Fetch. read_committed reads always go
upstream (the aborted transactions of a range come with the Fetch), and their batches fill the cache too.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import structlog

from shoal.broker.storage.partition_source import (
    EARLIEST,
    LATEST,
    OffsetOutOfRange,
    SourceRead,
    SourceUnavailable,
)
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import BatchHeader, parse_batch_header

from .cluster import LEADERSHIP_ERRORS, UpstreamCluster, UpstreamUnavailable
from .metrics import UpstreamMetrics

log = structlog.get_logger("shoal.upstream.reader")

_LENGTH_END = 12  # base offset (8) and batch length (4): enough to know a batch's size
# An upstream read asks for at least this much: a share acquisition is sized to the records one pass may
# take, and the cache keeps the rest for the next pass and the other consumers of the partition.
MIN_UPSTREAM_READ_BYTES = 1 << 20
# The long poll of an upstream read. Kafka answers at once when records are there; some Kafka-protocol
# brokers (Tansu) answer a Fetch with max_wait_ms=0 before reading anything, with no partitions at all.
READ_MAX_WAIT_MS = 1


@dataclass(slots=True)
class _Cached:
    header: BatchHeader
    data: bytes
    # Base offset of the batch that followed this one in the upstream read (None: the read ended here).
    next_base: int | None


class _PartitionCache:
    __slots__ = ("bases", "batches", "size")

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.batches: dict[int, _Cached] = {}
        self.size = 0


class BatchCache:
    """Recent upstream batches, by partition and base offset, within `max_bytes` (least recently read
    partitions are dropped first, oldest batches first)."""

    def __init__(self, max_bytes: int, metrics: UpstreamMetrics | None = None):
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._partitions: OrderedDict[tuple[str, int], _PartitionCache] = OrderedDict()

    def get(self, key: tuple[str, int], offset: int, max_bytes: int, limit: int) -> list[tuple[BatchHeader, memoryview]]:
        """The cached run of batches from the one holding `offset`, below `limit`, within `max_bytes` (at
        least one batch); empty when the batch holding `offset` is not cached."""
        part = self._partitions.get(key)
        found: list[tuple[BatchHeader, memoryview]] = []
        if part is not None:
            i = bisect.bisect_right(part.bases, offset) - 1
            entry = part.batches.get(part.bases[i]) if i >= 0 else None
            if entry is not None and entry.header.last_offset < offset:
                entry = None
            budget = max_bytes
            while entry is not None and entry.header.base_offset < limit and (not found or len(entry.data) <= budget):
                found.append((entry.header, memoryview(entry.data)))
                budget -= len(entry.data)
                entry = part.batches.get(entry.next_base) if entry.next_base is not None else None
            self._partitions.move_to_end(key)
        if found:
            self.hits += 1
            if self.metrics is not None:
                self.metrics.cache_hits.inc()
        else:
            self.miss()
        return found

    @staticmethod
    def _holding(part: _PartitionCache, offset: int) -> _Cached | None:
        i = bisect.bisect_right(part.bases, offset) - 1
        entry = part.batches.get(part.bases[i]) if i >= 0 else None
        return entry if entry is not None and entry.header.last_offset >= offset else None

    def run_after(self, key: tuple[str, int], offset: int, enough: int) -> tuple[int, int]:
        """(bytes, end): the cached run from the batch holding `offset`, followed until it holds `enough`
        bytes or ends; `end` is the offset after its last batch (`offset` itself when nothing holds it). A
        look that counts neither a hit nor a miss."""
        part = self._partitions.get(key)
        entry = None if part is None else self._holding(part, offset)
        total, end = 0, offset
        while entry is not None and part is not None and total < enough:
            total += len(entry.data)
            end = entry.header.last_offset + 1
            entry = part.batches.get(entry.next_base) if entry.next_base is not None else None
        return total, end

    def miss(self) -> None:
        """Count a read the cache could not answer (also one that could not even look: a partition's first
        read, before its high watermark is known), so hits / (hits + misses) is the hit rate."""
        self.misses += 1
        if self.metrics is not None:
            self.metrics.cache_misses.inc()

    def put(self, key: tuple[str, int], batches: list[tuple[BatchHeader, bytes]], from_offset: int | None = None
            ) -> None:
        """Cache the batches of one upstream read. `from_offset`: the offset the read asked for; a cached batch
        ending just before it leads on to this read's first batch (one run, followed by `get` and `run_after`)."""
        part = self._partitions.get(key)
        if part is None:
            part = self._partitions[key] = _PartitionCache()
        self._partitions.move_to_end(key)
        if batches and from_offset is not None:
            before = self._holding(part, from_offset - 1)
            if before is not None and before.header.last_offset == from_offset - 1 and before.next_base is None:
                before.next_base = batches[0][0].base_offset
        for i, (header, data) in enumerate(batches):
            following = batches[i + 1][0].base_offset if i + 1 < len(batches) else None
            old = part.batches.get(header.base_offset)
            if old is not None:
                old.next_base = old.next_base if following is None else following
                continue
            part.batches[header.base_offset] = _Cached(header, data, following)
            bisect.insort(part.bases, header.base_offset)
            part.size += len(data)
            self.size += len(data)
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_bytes and self._partitions:
            key, part = next(iter(self._partitions.items()))
            while part.bases and self.size > self.max_bytes:
                dropped = part.batches.pop(part.bases.pop(0))
                part.size -= len(dropped.data)
                self.size -= len(dropped.data)
            if not part.bases:
                del self._partitions[key]

    def drop(self, key: tuple[str, int]) -> None:
        part = self._partitions.pop(key, None)
        if part is not None:
            self.size -= part.size


class UpstreamPartitionSource:
    """One upstream topic-partition as a `PartitionSource`."""

    def __init__(self, cluster: UpstreamCluster, cache: BatchCache, topic: str, partition: int, *,
                 min_read_bytes: int = 0):
        self.min_read_bytes = min_read_bytes
        self.cluster = cluster
        self.cache = cache
        self.key = (topic, partition)
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.upstream_reads = 0
        self._inflight: dict[tuple[int, int, bool], asyncio.Future[SourceRead]] = {}
        self._read_aheads: set[asyncio.Task[SourceRead]] = set()

    async def read(self, fetch_offset: int, max_bytes: int, *, read_committed: bool = False) -> SourceRead:
        if not read_committed:
            if self.high_watermark >= 0 and fetch_offset >= self.log_start_offset:
                cached = self.cache.get(self.key, fetch_offset, max_bytes, self.high_watermark)
                if cached:
                    self._read_ahead(cached[-1][0].last_offset + 1)
                    return SourceRead(cached, self.high_watermark, self.last_stable_offset, self.log_start_offset)
            else:
                self.cache.miss()
        read = _trimmed(await self._shared_read(fetch_offset, max(max_bytes, self.min_read_bytes), read_committed),
                        max_bytes)
        if read.batches and not read_committed:
            self._read_ahead(read.batches[-1][0].last_offset + 1)
        return read

    async def batches_to_end(self, offset: int, max_bytes: int, *,
                             on_log_start: Callable[[int], None] | None = None,
                             ) -> AsyncGenerator[tuple[BatchHeader, memoryview], None]:
        """Every batch from the one holding `offset` to the high watermark (control batches too), for readers
        of a whole state topic. An offset below the log start (records deleted by retention) or past the end
        (the topic deleted and created again) goes on from the log start, told to `on_log_start` first.
        Raises SourceUnavailable when the upstream does not answer."""
        while True:
            try:
                read = await self.read(offset, max_bytes)
            except OffsetOutOfRange as exc:
                if 0 <= exc.log_start_offset != offset:
                    if on_log_start is not None:
                        on_log_start(exc.log_start_offset)
                    offset = exc.log_start_offset
                    continue
                raise SourceUnavailable(f"{self.key[0]}: {exc}") from exc
            for header, data in read.batches:
                if header.last_offset < offset:
                    continue
                yield header, data
                offset = header.last_offset + 1
            if offset >= read.high_watermark or not read.batches:
                return

    async def _shared_read(self, fetch_offset: int, max_bytes: int, read_committed: bool) -> SourceRead:
        """One upstream Fetch, shared by every read of the same range that comes while it is out."""
        flight = (fetch_offset, max_bytes, read_committed)
        running = self._inflight.get(flight)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[SourceRead] = asyncio.get_running_loop().create_future()
        self._inflight[flight] = future
        try:
            result = await self._fetch(fetch_offset, max_bytes, read_committed)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here; waiters get it too
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[flight]

    def _read_ahead(self, offset: int) -> None:
        """A read handed out the records before `offset`: when less than one upstream read's worth is cached
        from there on, fetch the range after the cached run now, while those records go to the consumer, so
        later acquisitions find it cached (or join the Fetch). So about one to two reads stay ahead of the
        partition's readers, and never past the high watermark."""
        if offset >= self.high_watermark or self.min_read_bytes <= 0:
            return
        ahead, end = self.cache.run_after(self.key, offset, self.min_read_bytes)
        if ahead >= self.min_read_bytes or end >= self.high_watermark:
            return
        if (end, self.min_read_bytes, False) in self._inflight:
            return
        task = asyncio.get_running_loop().create_task(self._shared_read(end, self.min_read_bytes, False))
        self._read_aheads.add(task)
        task.add_done_callback(self._read_ahead_done)

    def _read_ahead_done(self, task: asyncio.Task[SourceRead]) -> None:
        self._read_aheads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The acquisition that needs the range reads it again and reports what fails.
            log.debug("upstream read-ahead failed", topic=self.key[0], partition=self.key[1],
                      error=str(task.exception()))

    async def bytes_from(self, offset: int, enough: int, *, read_committed: bool = False) -> int:
        try:
            read = await self.read(offset, enough, read_committed=read_committed)
        except OffsetOutOfRange:
            return enough  # the acquisition that follows moves past it
        limit = read.last_stable_offset if read_committed else read.high_watermark
        return sum(len(data) for header, data in read.batches if header.base_offset < limit)

    async def list_offset(self, timestamp: int) -> int:
        """ListOffsets on the partition's upstream leader."""
        topic, partition = self.key
        leader = await self._leader()
        req = messages.ListOffsetsRequest
        body = req(replica_id=-1, isolation_level=0, timeout_ms=0, topics=[req.ListOffsetsTopic(
            name=topic, partitions=[req.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                                                             timestamp=timestamp)])])
        response = await self.cluster.send(leader, ApiKey.LIST_OFFSETS, body, 7)
        parts = [p for t in response.topics for p in t.partitions if p.partition_index == partition]
        if not parts:
            raise UpstreamUnavailable(f"upstream ListOffsets of {topic}-{partition}: the answer left the partition out")
        part = parts[0]
        if part.error_code != ErrorCode.NONE:
            if part.error_code in LEADERSHIP_ERRORS:
                self.cluster.request_refresh()
            raise UpstreamUnavailable(f"upstream ListOffsets of {topic}-{partition}: error {part.error_code}")
        if part.offset < 0 and timestamp not in (EARLIEST, LATEST):
            return await self.list_offset(LATEST)  # no record that late: the end of the log
        return int(part.offset)

    async def _leader(self) -> int:
        topic, partition = self.key
        leader = self.cluster.leader(topic, partition)
        if leader < 0:
            await self.cluster.refresh_metadata([topic])
            leader = self.cluster.leader(topic, partition)
            if leader < 0:
                raise UpstreamUnavailable(f"no upstream leader for {topic}-{partition}")
        return leader

    async def _fetch(self, fetch_offset: int, max_bytes: int, read_committed: bool) -> SourceRead:
        topic, partition = self.key
        leader = await self._leader()
        req = messages.FetchRequest
        body = req(replica_id=-1, max_wait_ms=READ_MAX_WAIT_MS, min_bytes=1, max_bytes=max_bytes,
                   isolation_level=1 if read_committed else 0, session_id=0, session_epoch=-1,
                   topics=[req.FetchTopic(topic=topic, partitions=[req.FetchPartition(
                       partition=partition, current_leader_epoch=-1, fetch_offset=fetch_offset,
                       last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)])],
                   forgotten_topics_data=[], rack_id="")
        self.upstream_reads += 1
        response = await self.cluster.send(leader, ApiKey.FETCH, body, 12)
        parts = [p for t in response.responses for p in t.partitions if p.partition_index == partition]
        if not parts:
            raise UpstreamUnavailable(f"upstream Fetch of {topic}-{partition}: the answer left the partition out"
                                      f" (top-level error {response.error_code})")
        part = parts[0]
        if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            raise OffsetOutOfRange(fetch_offset, part.log_start_offset, part.high_watermark)
        if part.error_code != ErrorCode.NONE:
            if part.error_code in LEADERSHIP_ERRORS:
                self.cluster.request_refresh()
            raise UpstreamUnavailable(f"upstream Fetch of {topic}-{partition}: error {part.error_code}")
        batches = self.absorb(part, fetch_offset)
        aborted = [(a.producer_id, a.first_offset) for a in part.aborted_transactions or []] if read_committed else []
        return SourceRead([(h, memoryview(data)) for h, data in batches], self.high_watermark,
                          self.last_stable_offset, self.log_start_offset, aborted)


    def absorb(self, part: messages.FetchResponse.PartitionData, from_offset: int) -> list[tuple[BatchHeader, bytes]]:
        """Take in an error-free Fetch answer for the partition, read from `from_offset`: its watermarks, and
        its batches into the cache (also those the tail poller read, which the next acquisition finds there)."""
        self.high_watermark = part.high_watermark
        self.last_stable_offset = part.last_stable_offset if part.last_stable_offset >= 0 else part.high_watermark
        self.log_start_offset = part.log_start_offset
        batches = whole_batches(part.records or b"")
        if batches:
            self.cache.put(self.key, batches, from_offset)
        return batches


def _trimmed(read: SourceRead, max_bytes: int) -> SourceRead:
    """The read cut to `max_bytes` (at least one batch): an upstream read may be larger than asked."""
    total, keep = 0, 0
    for _header, data in read.batches:
        if keep and total + len(data) > max_bytes:
            break
        total += len(data)
        keep += 1
    if keep == len(read.batches):
        return read
    return SourceRead(read.batches[:keep], read.high_watermark, read.last_stable_offset, read.log_start_offset,
                      read.aborted)


def whole_batches(records: bytes | bytearray | memoryview) -> list[tuple[BatchHeader, bytes]]:
    """The complete batches of a Fetch answer, each as its own bytes; a batch the size limit cut off at the
    end (a broker may send part of one) is left out."""
    view = memoryview(records)
    out: list[tuple[BatchHeader, bytes]] = []
    pos, end = 0, len(view)
    while pos + _LENGTH_END <= end:
        size = _LENGTH_END + int.from_bytes(view[pos + 8 : pos + 12], "big")
        if pos + size > end:
            break
        out.append((parse_batch_header(view, pos), bytes(view[pos : pos + size])))
        pos += size
    return out
