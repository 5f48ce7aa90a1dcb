"""The producer: batches records per partition, picks partitions like Kafka's default partitioner."""

from .partitioner import StickyPartitioner, murmur2, partition_for_key
from .producer import INIT_PRODUCER_ID_VERSIONS, PRODUCE_VERSIONS, AsyncProducer, Producer, RecordMetadata

__all__ = [
    "INIT_PRODUCER_ID_VERSIONS",
    "PRODUCE_VERSIONS",
    "AsyncProducer",
    "Producer",
    "RecordMetadata",
    "StickyPartitioner",
    "murmur2",
    "partition_for_key",
]
