"""The source's pieces that need no broker: options, how records are cut into tasks, pickling, Arrow rows."""

from __future__ import annotations

import pickle

import pytest

from shoal.client.consumer.share_consumer import ShareRecord
from shoal.client.spark.options import SparkOptionError
from shoal.client.spark.source import KafkaShareStreamReader, SourceOptions, split_into_chunks

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "group.id": "g", "subscribe": "a, b"}


def _record(partition: int, offset: int, size: int = 10, topic: str = "a") -> ShareRecord:
    return ShareRecord(topic, partition, offset, 1_700_000_000_000, 0, b"k", b"v" * size, [("h", b"x")], 1)


def test_options_follow_spark_kafka_names_case_insensitively() -> None:
    opts = SourceOptions.parse({**BASE, "MaxRecordsPerTrigger": "123", "kafka.client.id": "me"})
    assert opts.topics == ("a", "b")
    assert opts.max_records_per_trigger == 123
    assert opts.client_config == {"client.id": "me"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"group.id": ""}, "group.id"),
        ({"subscribe": " , "}, "subscribe"),
        ({"subscribePattern": "a.*"}, "subscribe"),
        ({"startingOffsets": "earliest"}, "share.auto.offset.reset"),
        ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
        ({"kafka.no.such.setting": "1"}, "no.such.setting"),
    ],
)
def test_bad_options_fail_when_the_query_is_defined(extra: dict[str, str], message: str) -> None:
    with pytest.raises(SparkOptionError, match=message):
        SourceOptions.parse({**BASE, **extra})


def test_chunks_stay_under_the_byte_cap_and_keep_partition_order() -> None:
    records = [_record(p, o, size=1000) for o in range(50) for p in (2, 0)]
    chunks = split_into_chunks(records, max_bytes=10_000)
    assert sum(len(c) for c in chunks) == len(records)
    assert all(sum(len(v or b"") for v in c.values) <= 10_000 for c in chunks)
    assert len(chunks) > 2
    for partition in (0, 2):
        offsets = [o for c in chunks if c.partition == partition for o in c.offsets]
        assert offsets == list(range(50))
    # A record larger than the cap still travels, alone.
    (big,) = split_into_chunks([_record(0, 7, size=50_000)], max_bytes=10_000)
    assert big.offsets == [7]


def test_chunk_rows_match_the_schema() -> None:
    (chunk,) = split_into_chunks([_record(1, 5), ShareRecord("a", 1, 6, -1, -1, None, None, [], 3)], 1 << 20)
    batch = chunk.to_arrow()
    rows = batch.to_pylist()
    assert batch.schema.names == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers", "deliveryCount"
    ]
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000
    assert (rows[1]["key"], rows[1]["value"], rows[1]["timestamp"], rows[1]["deliveryCount"]) == (None, None, None, 3)


def test_reader_pickles_without_its_driver_state() -> None:
    reader = KafkaShareStreamReader(SourceOptions.parse(BASE))
    reader._acq = object()  # type: ignore[assignment]  # stands in for the live consumer and its thread
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._acq is None and copy.options == reader.options


def test_offsets_carry_one_member_id_and_a_checkpointed_one_wins() -> None:
    reader = KafkaShareStreamReader(SourceOptions.parse(BASE))
    first = reader.initialOffset()
    assert first["seq"] == 0 and first["member"]
    assert reader.initialOffset() == first  # one member id for the life of the reader
    restarted = KafkaShareStreamReader(SourceOptions.parse(BASE))
    assert restarted.initialOffset()["member"] != first["member"]
    # Before its consumer exists, a restarted reader adopts the id recorded in the checkpoint's offset.
    restarted._adopt_member({"seq": 7, "member": first["member"]})
    assert restarted._offset(8) == {"seq": 8, "member": first["member"]}
    # Offsets from checkpoints written before the id was recorded keep the reader's own.
    restarted._adopt_member({"seq": 7})
    assert restarted._offset(8)["member"] == first["member"]
