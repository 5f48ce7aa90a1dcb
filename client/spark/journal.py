"""The acquisition journal of the `kafka-share` source: what a micro-batch acquired, made durable before
its records are accepted, so a batch can hold more records than the group's in-flight limit.

In checkpoint mode a batch's records must stay replayable until Spark's offset log holds the batch, and
Spark writes that log only after `latestOffset` returns. Without a journal the records therefore stay
acquired until then, and a batch can never exceed `share.partition.max.record.locks` per partition.
With it, each acquisition round is appended here (acks=all) and only then ACCEPTed, which frees the
locks for the next round. A driver that dies after a round was journaled but before Spark logged the batch
finds the batch here when it restarts and makes it its next batch, read by offset like any other.

The journal is a compacted topic with one key per query (group and member id: a query keeps its member id
in its offsets); the value is the newest batch's sequence number and ranges, as in the offset log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.client.spark.ranges import BatchRanges, ranges_from_json, ranges_to_json

DEFAULT_JOURNAL_TOPIC = "kafka-share-journal"
DISABLED = "none"
# Every acquisition round of every query appends here, and compaction never cleans the active segment: with
# the usual 1 GiB segments, a restarted driver could have a gigabyte to read before its first batch.
# Small segments keep the partition near one record per query (Kafka allows 1 MiB and up).
JOURNAL_SEGMENT_BYTES = 8 * 1024 * 1024
_TOPIC_CONFIGS = {"cleanup.policy": "compact", "retention.ms": "-1", "segment.bytes": str(JOURNAL_SEGMENT_BYTES)}


@dataclass(frozen=True)
class JournaledBatch:
    seq: int
    ranges: BatchRanges


def journal_key(group_id: str, member_id: str) -> bytes:
    return f"{group_id}/{member_id}".encode()


def encode_entry(seq: int, ranges: BatchRanges) -> bytes:
    return json.dumps({"seq": seq, "ranges": ranges_to_json(ranges)}, separators=(",", ":")).encode()


def decode_entry(value: bytes) -> JournaledBatch:
    raw = json.loads(value)
    return JournaledBatch(int(raw["seq"]), ranges_from_json(raw.get("ranges")))


class AcquisitionJournal:
    """One query's journal: append a batch's ranges (blocking until the broker has them), and read back the
    newest entry of this query after a restart."""

    def __init__(self, bootstrap_servers: str, topic: str, key: bytes, config: Mapping[str, Any]) -> None:
        from shoal.client.producer import Producer

        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key = key
        self.config = dict(config)
        self._ensure_topic()
        self._producer = Producer(bootstrap_servers, acks="all", config=self.config)

    def _ensure_topic(self) -> None:
        from shoal.client.admin import Admin, NewTopic
        from shoal.protocol.errors import ErrorCode

        with Admin(self.bootstrap_servers, config=self.config) as admin:
            # Create only when missing: a principal allowed to write an existing journal need not be
            # allowed to create topics.
            if self.topic in admin.list_topics():
                return
            result = admin.create_topics([NewTopic(self.topic, 1, 1, dict(_TOPIC_CONFIGS))])[self.topic]
        if result.error is not None and result.error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise result.error

    def append(self, seq: int, ranges: BatchRanges) -> None:
        self._producer.send(self.topic, encode_entry(seq, ranges), key=self.key, partition=0).result()

    def newest(self) -> JournaledBatch | None:
        """This query's newest entry (None if it has none): the whole partition is read, which compaction
        keeps to about one record per query."""
        from shoal.client.consumer.offset_reader import OffsetReader
        from shoal.protocol.records import decode_records

        with OffsetReader(self.bootstrap_servers, config=self.config) as reader:
            start = reader.log_start_offset(self.topic, 0)
            end = reader.log_end_offset(self.topic, 0)
            newest: bytes | None = None
            if end > start:
                for _, step in reader.read_ranges(self.topic, 0, [(start, end - 1)]):
                    for header, at in step.batches:
                        for record in decode_records(step.data, at, header):
                            if record.key == self.key and record.offset >= step.first:
                                newest = record.value  # None: a tombstone forgets the entry
        return None if newest is None else decode_entry(newest)

    def close(self) -> None:
        self._producer.close()
