"""Transaction markers: the COMMIT or ABORT control batch that ends a producer's transaction on one partition.

One writer serves the transaction coordinator (which ends its own transactions) and the WriteTxnMarkers API
(which an operator's `Admin.abortTransaction` uses to end a hanging one): append the marker as the
coordinator (`PartitionLog.append_as_leader`, which also wakes the partition's long polls), fsync, and only
then report it durable, so whoever reacts to the marker (the group coordinator releases a transaction's
offset commits) never acts on one a power cut could take back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import structlog

from shoal.broker.storage.partition_log import AppendRefused, LogClosed
from shoal.broker.storage.topic_registry import TopicRegistry
from shoal.protocol.errors import ErrorCode

log = structlog.get_logger("shoal.txn")

TopicPartition = tuple[str, int]
# Marker refusals that mean the transaction was ended here by someone newer: retrying cannot succeed.
_FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED})
# Called once a marker is durable: (topic, partition, producer id, commit).
MarkerDurable = Callable[[str, int, int, bool], None]


class TransactionMarkerWriter:
    def __init__(self, topics: TopicRegistry, on_durable: MarkerDurable):
        self.topics = topics
        self.on_durable = on_durable

    async def write_marker(self, topic_name: str, index: int, producer_id: int, producer_epoch: int, commit: bool,
                           coordinator_epoch: int = 0, transaction_version: int = 0) -> bool:
        """Append and fsync one marker; False if the partition does not exist (or was deleted while its
        marker was written)."""
        topic = self.topics.get(topic_name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return False
        plog = topic.partitions[index]
        try:
            result = plog.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch, timestamp_ms=int(time.time() * 1000),
                                        transaction_version=transaction_version)
            await plog.flush(result.last_offset + 1)
        except LogClosed:
            if self.topics.get(topic_name) is not topic:
                log.info("txn.marker_partition_deleted", topic=topic_name, partition=index)
                return False
            raise
        self.on_durable(topic_name, index, producer_id, commit)
        return True

    async def write_markers(self, producer_id: int, producer_epoch: int, commit: bool,
                            partitions: Iterable[TopicPartition], coordinator_epoch: int = 0,
                            transaction_version: int = 0) -> set[TopicPartition]:
        """The transaction coordinator's side: a marker on every partition of the transaction at once.
        A partition deleted since it joined the transaction (or while its marker was written) needs no
        marker, as in Kafka; the partitions whose marker failed are returned, to be retried."""
        parts = list(partitions)
        results: list[object]
        if len(parts) == 1:  # the common case (a sidecar's state write): no task for one marker
            try:
                results = [await self.write_marker(*parts[0], producer_id, producer_epoch, commit, coordinator_epoch,
                                                   transaction_version)]
            except Exception as exc:
                results = [exc]
        else:
            results = await asyncio.gather(*(self.write_marker(topic, index, producer_id, producer_epoch, commit,
                                                               coordinator_epoch, transaction_version)
                                             for topic, index in parts), return_exceptions=True)
        failed: set[TopicPartition] = set()
        for tp, result in zip(parts, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, AppendRefused) and result.error_code in _FENCED:
                # A newer producer epoch or coordinator epoch ended this producer's transaction here already
                # (an operator's abort, or the producer's next incarnation): Kafka stops sending this marker.
                log.warning("txn.marker_fenced", topic=tp[0], partition=tp[1], producer_id=producer_id,
                            error=ErrorCode(result.error_code).name, reason=str(result))
                continue
            if isinstance(result, BaseException):
                log.warning("txn.marker_failed", topic=tp[0], partition=tp[1], error=repr(result))
                failed.add(tp)
        return failed
