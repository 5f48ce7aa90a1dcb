"""Where share groups learn of topics and read their records: one view for both modes.

Standalone, topics are the local registry's and records come from the local logs; in sidecar mode both come
from the upstream cluster (`shoal.broker.upstream.topics.UpstreamTopics`). The share-partition manager and
the share group coordinator see only this view, so share groups take one code path in either mode.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

from shoal.broker.storage.partition_source import LocalPartitionSource, PartitionSource

if TYPE_CHECKING:
    from shoal.broker.storage.partition_log import PartitionLog
    from shoal.broker.storage.topic_registry import TopicRegistry


class ShareTopicView(Protocol):
    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        """(topic id, partition count) of the topic, None when unknown."""
        ...

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        """(name, partition count) of the topic, None when unknown."""
        ...

    def source(self, topic_id: bytes, partition: int) -> PartitionSource | None:
        """The partition's records, None when the topic or partition is unknown."""
        ...


class LocalShareTopics:
    """The local registry's topics, read from their logs."""

    def __init__(self, registry: TopicRegistry):
        self.registry = registry
        # One source per log, so a leader can tell a recreated topic's log from the one it read.
        self._sources: weakref.WeakKeyDictionary[PartitionLog, LocalPartitionSource] = weakref.WeakKeyDictionary()

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        topic = self.registry.get(name)
        return None if topic is None else (topic.topic_id, len(topic.partitions))

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        topic = self.registry.get_by_id(topic_id)
        return None if topic is None else (topic.name, len(topic.partitions))

    def source(self, topic_id: bytes, partition: int) -> PartitionSource | None:
        topic = self.registry.get_by_id(topic_id)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None
        plog = topic.partitions[partition]
        found = self._sources.get(plog)
        if found is None:
            found = self._sources[plog] = LocalPartitionSource(plog)
        return found
