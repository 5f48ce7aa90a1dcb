"""Following the upstream's log ends while share fetches wait on them.

A share fetch that acquired nothing parks in the purgatory on its partitions' `LogKey`s. Standalone, a
produce notifies them; in sidecar mode records may be produced straight to the upstream, which notifies
nothing here. So while share fetches wait on upstream partitions, one long-polling Fetch per upstream
leader (`max_wait_ms`, on a connection of its own) asks for every waited partition from its last known
high watermark, as a Kafka follower fetches. When the answer brings records, they go into the batch cache
(the woken acquisition finds them there, read ahead) and the partition's waiters are notified. The poll of
a leader stops once nobody waits on its partitions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from shoal.broker.common.purgatory import LogKey, Purgatory, WakeKey
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .cluster import LEADERSHIP_ERRORS, Lane, UpstreamCluster
from .partition_reader import MIN_UPSTREAM_READ_BYTES, UpstreamPartitionSource

log = structlog.get_logger("shoal.upstream.tail")

# How long one upstream long poll waits (Kafka's replica.fetch.wait.max.ms): a partition that starts to be
# waited on while a poll of its leader is out joins the next one.
TAIL_MAX_WAIT_MS = 500
# Pauses after a failed poll, and after an answer that came back early with nothing (an upstream that
# does not hold a Fetch open), so neither can make the poller spin.
_ERROR_BACKOFF_S = (0.1, 2.0)
_EMPTY_BACKOFF_S = 0.05


class TailPoller:
    def __init__(self, cluster: UpstreamCluster, purgatory: Purgatory,
                 source: Callable[[bytes, int], UpstreamPartitionSource | None]):
        self.cluster = cluster
        self.purgatory = purgatory
        self._source = source
        self._waited: dict[int, dict[LogKey, UpstreamPartitionSource]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._lanes: dict[int, Lane] = {}
        self.polls = 0

    def on_park(self, keys: Sequence[WakeKey]) -> None:
        """A waiter parked on `keys` (the purgatory's hook): follow the upstream partitions among them. It
        runs inside the waiter's wait, so nothing it meets may reach the waiter."""
        try:
            self._follow_keys(keys)
        except Exception:
            log.exception("following upstream partitions for parked share fetches failed")

    def _follow_keys(self, keys: Sequence[WakeKey]) -> None:
        for key in keys:
            if not isinstance(key, LogKey):
                continue
            source = self._source(key.topic_id, key.partition)
            if source is None or source.high_watermark < 0:
                continue  # never read yet: the acquisition that reads it comes first
            leader = self.cluster.leader(*source.key)
            if leader < 0:
                continue
            self._waited.setdefault(leader, {})[key] = source
            task = self._tasks.get(leader)
            if task is None or task.done():
                self._tasks[leader] = asyncio.get_running_loop().create_task(self._follow(leader))

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes.values():
            self.cluster.close_lane(lane)

    def _still_waited(self, leader: int) -> dict[LogKey, UpstreamPartitionSource]:
        waited = self._waited.get(leader, {})
        moved = [k for k, s in waited.items() if self.cluster.leader(*s.key) != leader]
        for key in [k for k in waited if not self.purgatory.watching(k)] + moved:
            waited.pop(key, None)
        # A partition whose upstream leader moved is followed on its new leader.
        self._follow_keys([k for k in moved if self.purgatory.watching(k)])
        return waited

    async def _follow(self, leader: int) -> None:
        lane = self._lanes.setdefault(leader, Lane())
        backoff = _ERROR_BACKOFF_S[0]
        try:
            while waited := self._still_waited(leader):
                started = time.monotonic()
                try:
                    woke, failed = await self._poll(leader, lane, waited)
                except Exception as exc:  # the upstream is away or refused: try again while fetches wait
                    log.warning("upstream tail poll failed", broker=leader, error=str(exc))
                    woke, failed = False, True
                if failed:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _ERROR_BACKOFF_S[1])
                    continue
                backoff = _ERROR_BACKOFF_S[0]
                if not woke and time.monotonic() - started < TAIL_MAX_WAIT_MS / 2000:
                    await asyncio.sleep(_EMPTY_BACKOFF_S)
        finally:
            self._waited.pop(leader, None)
            if self._tasks.get(leader) is asyncio.current_task():
                del self._tasks[leader]

    async def _poll(self, leader: int, lane: Lane,
                    waited: dict[LogKey, UpstreamPartitionSource]) -> tuple[bool, bool]:
        """One long poll of `leader` for the waited partitions: (notified any, a partition had an error)."""
        req = messages.FetchRequest
        wanted: dict[tuple[str, int], tuple[LogKey, UpstreamPartitionSource, int]] = {}
        topics: dict[str, list[messages.FetchRequest.FetchPartition]] = {}
        for key, source in waited.items():
            topic, partition = source.key
            offset = source.high_watermark
            wanted[source.key] = (key, source, offset)
            topics.setdefault(topic, []).append(req.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=MIN_UPSTREAM_READ_BYTES))
        body = req(replica_id=-1, max_wait_ms=TAIL_MAX_WAIT_MS, min_bytes=1,
                   max_bytes=MIN_UPSTREAM_READ_BYTES * len(wanted), isolation_level=0, session_id=0,
                   session_epoch=-1, topics=[req.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
                   forgotten_topics_data=[], rack_id="")
        self.polls += 1
        timeout_ms = self.cluster.config.request_timeout_ms + TAIL_MAX_WAIT_MS
        response: messages.FetchResponse = await self.cluster.send(leader, ApiKey.FETCH, body, 12, lane=lane,
                                                                   timeout_ms=timeout_ms)
        woke = failed = False
        for t in response.responses:
            for part in t.partitions:
                found = wanted.get((t.topic or "", part.partition_index))
                if found is None:
                    continue
                key, source, offset = found
                if part.error_code != ErrorCode.NONE:
                    if part.error_code in LEADERSHIP_ERRORS:
                        self.cluster.request_refresh()
                    # The waiters' own acquisition meets the error and reports it.
                    self.purgatory.notify(key)
                    woke = failed = True
                    continue
                if part.high_watermark > offset or part.records:
                    source.absorb(part, offset)
                    self.purgatory.notify(key)
                    woke = True
        return woke, failed
