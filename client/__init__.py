"""Shoal's bundled Kafka client: producer, share consumer and admin, each async with a sync facade."""

from .admin import RESOURCE_BROKER, RESOURCE_GROUP, RESOURCE_TOPIC, Admin, AsyncAdmin, NewTopic
from .consumer import AcknowledgeType, AsyncShareConsumer, ShareConsumer, ShareRecord
from .errors import KafkaError
from .producer import AsyncProducer, Producer, RecordMetadata

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
