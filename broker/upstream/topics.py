"""The upstream's topics as share groups see them: names, ids and partition counts from the upstream's
metadata, and each partition's records read through one batch cache.

It serves both the share-partition manager (`ShareTopicView`) and the group coordinator's topic view
(`topic_by_name`, `topic_by_id`, `topic_names`), so share-group assignment follows the upstream's topics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from shoal.broker.common.purgatory import Purgatory
from shoal.protocol.uuids import ZERO_UUID

from .cluster import UpstreamCluster
from .partition_reader import MIN_UPSTREAM_READ_BYTES, BatchCache, UpstreamPartitionSource
from .tail_poller import TailPoller

# The upstream's topic list is re-read this often, so topics created there reach share-group assignment.
METADATA_REFRESH_S = 5.0


class UpstreamTopics:
    def __init__(self, cluster: UpstreamCluster, cache: BatchCache):
        self.cluster = cluster
        self.cache = cache
        self._sources: dict[tuple[bytes, int], UpstreamPartitionSource] = {}
        self._refresher: asyncio.Task[None] | None = None
        self.tail: TailPoller | None = None

    def start(self) -> None:
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    def follow(self, purgatory: Purgatory) -> None:
        """Wake the share fetches parked on upstream partitions when records reach the upstream."""
        self.tail = TailPoller(self.cluster, purgatory, lambda tid, p: self._sources.get((tid, p)))
        purgatory.on_park = self.tail.on_park

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        if self.tail is not None:
            await self.tail.stop()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(METADATA_REFRESH_S)
            self.cluster.request_refresh()

    # ---- the group coordinator's view -------------------------------------------------------------

    async def learn_topics(self, names: Iterable[str]) -> None:
        """Re-read the upstream's metadata now when some of `names` is not known yet (coalesced, backed
        off per unknown name), so a topic created on the upstream is seen by the heartbeat naming it."""
        await self.cluster.learn_topics(names)

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        topic_id = self.cluster.topic_ids.get(name)
        count = self.cluster.partition_counts.get(name)
        if topic_id is None or count is None:
            self.cluster.request_refresh_for(name)  # perhaps created upstream since the last read
            return None
        return topic_id, count

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        name = self.cluster.topic_names.get(topic_id)
        count = None if name is None else self.cluster.partition_counts.get(name)
        if name is None or count is None:
            if topic_id != ZERO_UUID:
                self.cluster.request_refresh_for(topic_id)
            return None
        return name, count

    def topic_names(self) -> list[str]:
        """The upstream's topics a regex subscription may match (internal ones never are)."""
        return [name for name in self.cluster.topic_ids if not name.startswith("__")]

    # ---- the share-partition manager's view -------------------------------------------------------

    def source(self, topic_id: bytes, partition: int) -> UpstreamPartitionSource | None:
        found = self.topic_by_id(topic_id)
        if found is None or not 0 <= partition < found[1]:
            return None
        source = self._sources.get((topic_id, partition))
        if source is None:
            source = self._sources[(topic_id, partition)] = UpstreamPartitionSource(
                self.cluster, self.cache, found[0], partition, min_read_bytes=MIN_UPSTREAM_READ_BYTES)
        return source
