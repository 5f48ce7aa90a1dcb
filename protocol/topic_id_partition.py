"""A partition named by its topic's id, as share groups and Fetch v13+ name them on the wire."""

from __future__ import annotations

from typing import NamedTuple


class TopicIdPartition(NamedTuple):
    topic_id: bytes
    partition: int
