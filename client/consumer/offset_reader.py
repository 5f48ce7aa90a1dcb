"""Reading a partition by offset with plain Fetch requests: no group, no offsets of its own.

Used where the offsets to read are already known, e.g. a Spark task reading the ranges its micro-batch
acquired through a share group. Offsets below the log start offset (removed by retention or DeleteRecords)
are reported as lost rather than read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shoal.client.admin import AsyncAdmin
from shoal.client.backoff import exponential_backoff_ms
from shoal.client.errors import KafkaConnectionError, KafkaError, for_code
from shoal.client.fetch_defaults import MAX_PARTITION_FETCH_BYTES
from shoal.client.loop_thread import LoopThread
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import BatchHeader, verify_crc
from shoal.protocol.records import iter_complete_batches

FETCH_VERSIONS = (4, 12)  # v13+ names topics by id only
READ_UNCOMMITTED = 0
_LEADER_ERRORS = (
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
)
_MAX_LEADER_RETRIES = 5


@dataclass
class FetchedBatches:
    """One fetch's part of a read of first..last, undecoded: the batches of `data` (header, byte position)
    that hold offsets from `first` on (control batches left out; the first and last batch may hold
    offsets outside the range, which the caller drops), the sub-ranges that no longer exist in the log,
    and where the read goes on (past `last`: done)."""

    data: bytes | memoryview
    batches: list[tuple[BatchHeader, int]]
    first: int
    lost: list[tuple[int, int]]
    next_offset: int


class AsyncOffsetReader(AsyncAdmin):
    """An admin client (for ListOffsets) that also reads partitions by offset."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        *,
        config: Mapping[str, Any] | None = None,
        partition_max_bytes: int = MAX_PARTITION_FETCH_BYTES,
        isolation_level: int = READ_UNCOMMITTED,
    ):
        super().__init__(bootstrap_servers, config=config)
        self.partition_max_bytes = partition_max_bytes
        self.isolation_level = isolation_level

    async def log_start_offset(self, topic: str, partition: int) -> int:
        return await self._listed_offset(topic, partition, "earliest")

    async def log_end_offset(self, topic: str, partition: int) -> int:
        return await self._listed_offset(topic, partition, "latest")

    async def _listed_offset(self, topic: str, partition: int, spec: str) -> int:
        listed = (await self.list_offsets({(topic, partition): spec}))[(topic, partition)]
        if listed.error is not None:
            raise listed.error
        return listed.offset

    async def _leader(self, topic: str, partition: int, *, refresh: bool = False) -> int:
        if refresh or self.cluster.leader(topic, partition) < 0:
            await self.cluster.refresh_metadata([topic])
        leader = self.cluster.leader(topic, partition)
        if leader < 0:
            raise KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {topic}-{partition}")
        return leader

    async def read_step(self, topic: str, partition: int, first: int, last: int) -> FetchedBatches:
        """The next fetch's worth of `topic`-`partition` from offset `first` on, up to `last`."""
        await self.start()
        pos = first
        max_bytes = self.partition_max_bytes
        retries = 0
        unreachable_since: float | None = None
        while True:
            try:
                p = await self._fetch(topic, partition, pos, max_bytes, refresh=retries > 0)
            except KafkaConnectionError:
                # The leader cannot be reached (a sidecar killed, a broker gone): as Kafka's consumer, ask the
                # metadata again and retry, until default.api.timeout.ms has gone by without reaching one.
                config = self.cluster.config
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                elif time.monotonic() - unreachable_since >= config.default_api_timeout_ms / 1000:
                    raise
                retries += 1
                await asyncio.sleep(exponential_backoff_ms(config.reconnect_backoff_ms, config.reconnect_backoff_max_ms,
                                                           retries - 1) / 1000)
                continue
            unreachable_since = None
            if p.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                start = await self.log_start_offset(topic, partition)
                if pos >= start:
                    raise for_code(p.error_code, f"{topic}-{partition} has no offset {pos} (log start {start})")
                return FetchedBatches(b"", [], pos, [(pos, min(last, start - 1))], start)
            if p.error_code in _LEADER_ERRORS and retries < _MAX_LEADER_RETRIES:
                retries += 1
                await asyncio.sleep(0.1 * retries)
                continue
            if p.error_code:
                raise for_code(p.error_code, f"fetch {topic}-{partition} at {pos}")
            retries = 0
            data = p.records or b""
            step = FetchedBatches(data, [], pos, [], pos)
            for header, at in iter_complete_batches(data):
                if header.last_offset < pos:
                    continue
                verify_crc(data, at, header)
                if not header.is_control:
                    step.batches.append((header, at))
                step.next_offset = header.last_offset + 1
                if step.next_offset > last:
                    break
            if step.next_offset > pos:
                return step
            if data and max_bytes < 1 << 30:
                max_bytes *= 4  # one batch is larger than the fetch may return
                continue
            if pos >= p.high_watermark >= 0:
                raise KafkaError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"{topic}-{partition}: offsets {pos}..{last} are beyond the high watermark {p.high_watermark}",
                )
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"fetch {topic}-{partition} at {pos} returned nothing")

    async def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int, *, refresh: bool) -> Any:
        leader = await self._leader(topic, partition, refresh=refresh)
        req = messages.FetchRequest
        body = req(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=max_bytes,
            isolation_level=self.isolation_level,
            session_id=0,
            session_epoch=-1,
            topics=[
                req.FetchTopic(
                    topic=topic,
                    partitions=[
                        req.FetchPartition(
                            partition=partition,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=max_bytes,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        response = await self.cluster.request(leader, ApiKey.FETCH, body, FETCH_VERSIONS)
        if response.error_code:
            raise for_code(response.error_code, f"fetch {topic}-{partition}")
        return response.responses[0].partitions[0]


class OffsetReader:
    """Synchronous facade: an AsyncOffsetReader on its own event-loop thread."""

    def __init__(self, bootstrap_servers: str | Iterable[str], **kwargs: Any):
        self._thread = LoopThread("shoal-offset-reader")
        try:
            self._reader: AsyncOffsetReader = self._thread.run(self._make(bootstrap_servers, kwargs))
        except BaseException:
            self._thread.stop()
            raise

    @staticmethod
    async def _make(bootstrap_servers: str | Iterable[str], kwargs: dict[str, Any]) -> AsyncOffsetReader:
        reader = AsyncOffsetReader(bootstrap_servers, **kwargs)
        await reader.start()
        return reader

    def read_ranges(
        self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]
    ) -> Iterator[tuple[int, FetchedBatches]]:
        """(index of the range, fetched batches) for each fetch that reading the ranges takes, in order.
        The next fetch is already under way while the caller handles one."""
        todo = [(i, first, last) for i, (first, last) in enumerate(ranges) if first <= last]
        todo.reverse()
        if not todo:
            return
        index, pos, last = todo.pop()
        future: concurrent.futures.Future[FetchedBatches] | None = self._submit(topic, partition, pos, last)
        try:
            while future is not None:
                step = future.result()
                current = index
                future = None
                if step.next_offset <= last:
                    future = self._submit(topic, partition, step.next_offset, last)
                elif todo:
                    index, pos, last = todo.pop()
                    future = self._submit(topic, partition, pos, last)
                yield current, step
        finally:
            if future is not None:
                future.cancel()

    def _submit(self, topic: str, partition: int, first: int, last: int) -> concurrent.futures.Future[FetchedBatches]:
        return self._thread.submit(self._reader.read_step(topic, partition, first, last))

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self._thread.run(self._reader.log_start_offset(topic, partition))

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self._thread.run(self._reader.log_end_offset(topic, partition))

    def close(self) -> None:
        try:
            self._thread.run(self._reader.close(), 30)
        finally:
            self._thread.stop()

    def __enter__(self) -> OffsetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
