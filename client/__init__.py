"""Shoal's bundled Kafka client: producer, share consumer and admin, each async with a sync facade.

The names below load their modules on first use: Spark's helper processes import `shoal.client.spark`
and should not pay for the protocol classes unless they talk to a broker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .admin import RESOURCE_BROKER, RESOURCE_GROUP, RESOURCE_TOPIC, Admin, AsyncAdmin, NewTopic
    from .consumer import AcknowledgeType, AsyncShareConsumer, ShareConsumer, ShareRecord
    from .errors import KafkaError
    from .producer import AsyncProducer, Producer, RecordMetadata

_HOMES = {
    "RESOURCE_BROKER": ".admin",
    "RESOURCE_GROUP": ".admin",
    "RESOURCE_TOPIC": ".admin",
    "Admin": ".admin",
    "AsyncAdmin": ".admin",
    "NewTopic": ".admin",
    "AcknowledgeType": ".consumer",
    "AsyncShareConsumer": ".consumer",
    "ShareConsumer": ".consumer",
    "ShareRecord": ".consumer",
    "KafkaError": ".errors",
    "AsyncProducer": ".producer",
    "Producer": ".producer",
    "RecordMetadata": ".producer",
}

__all__ = [
    "RESOURCE_BROKER",
    "RESOURCE_GROUP",
    "RESOURCE_TOPIC",
    "AcknowledgeType",
    "Admin",
    "AsyncAdmin",
    "AsyncProducer",
    "AsyncShareConsumer",
    "KafkaError",
    "NewTopic",
    "Producer",
    "RecordMetadata",
    "ShareConsumer",
    "ShareRecord",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
