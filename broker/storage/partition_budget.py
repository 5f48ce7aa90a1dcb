"""How many partitions the broker may still create: Kafka's per-request bound (max.partitions.per.request)
and a budget of open files (max.partitions), since every partition keeps its active segment open."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from shoal.broker.common.config import BrokerConfig
from shoal.broker.storage.topic_registry import TopicRegistry


@dataclass(frozen=True, slots=True)
class PartitionBudget:
    config: BrokerConfig
    topics: TopicRegistry

    def problem(self, adding: int, added_so_far: int = 0) -> str | None:
        """Why `adding` more partitions cannot be created (after `added_so_far` in the same request), or None."""
        per_request = int(self.config["max.partitions.per.request"])
        if added_so_far + adding > per_request:
            return (f"Unable to perform excessively large batch operation: {added_so_far + adding} partitions "
                    f"in one request exceed max.partitions.per.request={per_request}.")
        limit = broker_partition_limit(int(self.config["max.partitions"]))
        held = self.topics.partition_count
        if held + added_so_far + adding > limit:
            return (f"Unable to create {adding} partitions: the broker holds {held} and its limit is {limit} "
                    f"(max.partitions, bounded by the open-file limit).")
        return None


def broker_partition_limit(configured: int) -> int:
    """max.partitions, or with -1 what the open-file limit allows: every partition keeps its segment open."""
    if configured >= 0:
        return configured
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    # Leave a quarter (at least 256) for connections, index files and the internal topics' extra segments.
    return max(0, soft - max(256, soft // 4))
