"""Adapters from the broker's parts to the narrow views the layers below take (so a coordinator never
sees the topic registry itself)."""

from __future__ import annotations

from shoal.broker.storage.topic_registry import TopicRegistry


class BrokerTopicMetadata:
    """The coordinator's view of topics, read live from the broker's registry."""

    def __init__(self, registry: TopicRegistry):
        self.registry = registry

    def topic_by_name(self, name: str) -> tuple[bytes, int] | None:
        topic = self.registry.get(name)
        return None if topic is None else (topic.topic_id, len(topic.partitions))

    def topic_by_id(self, topic_id: bytes) -> tuple[str, int] | None:
        topic = self.registry.get_by_id(topic_id)
        return None if topic is None else (topic.name, len(topic.partitions))

    def topic_names(self) -> list[str]:
        """User topics (what a regex subscription may match; internal topics never are)."""
        return [name for name, topic in self.registry.by_name.items() if not topic.internal]
