"""The columnar record decoder of the Spark source gives exactly what the reference decoder gives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

from shoal.client.spark.record_columns import decode_columns, record_sections  # noqa: E402
from shoal.protocol.compression import GZIP, LZ4, NONE, ZSTD  # noqa: E402
from shoal.protocol.record_batch import InvalidRecordBatch, parse_batch_header  # noqa: E402
from shoal.protocol.records import (  # noqa: E402
    LOG_APPEND_TIME,
    Record,
    RecordInput,
    decode_records,
    encode_batch,
    iter_complete_batches,
)

# Sizes around the one/two/three-byte varint edges (63/64, 8191/8192 after zigzag).
_blob = st.one_of(
    st.none(),
    st.binary(max_size=70),
    st.integers(8180, 8200).map(lambda n: b"k" * n),
)
_record = st.builds(
    RecordInput,
    key=_blob,
    value=_blob,
    headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
    timestamp=st.one_of(st.integers(-1, 1 << 41), st.just(-1)),
)
_batch = st.tuples(
    st.lists(_record, min_size=1, max_size=70),
    st.sampled_from([NONE, NONE, GZIP, LZ4, ZSTD]),
    st.booleans(),  # LogAppendTime
)


def _payload(batches: list[tuple[list[RecordInput], int, bool]]) -> bytes:
    out = b""
    base = 0
    for records, codec, log_append in batches:
        out += encode_batch(
            records,
            base_offset=base,
            compression=codec,
            timestamp_type=LOG_APPEND_TIME if log_append else 0,
        )
        base += len(records) + 3  # gaps, as compaction or other consumers' offsets leave
    return out


def _reference(payload: bytes, first: int, last: int) -> list[Record]:
    return [
        r
        for h, at in iter_complete_batches(payload)
        for r in decode_records(payload, at, h)
        if first <= r.offset <= last
    ]


def _columns(payload: bytes, first: int, last: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    batches = list(iter_complete_batches(payload))
    data, sections = record_sections(payload, batches)
    cols = decode_columns(data, sections, first, last)
    assert len(cols.keys) == len(cols.values) == len(cols)
    # batch/record indexes point back at each record, as the headers column needs them to.
    decoded = [decode_records(payload, at, header) for header, at in batches]
    for b, r, offset in zip(cols.batch_index.tolist(), cols.record_index.tolist(), cols.offsets.tolist(), strict=True):
        assert decoded[b][r].offset == offset
    return list(
        zip(cols.offsets.tolist(), cols.timestamps.tolist(), cols.keys.to_pylist(), cols.values.to_pylist(), strict=True)
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_batch, min_size=1, max_size=4), st.integers(-5, 300), st.integers(-5, 300))
def test_columns_match_the_reference_decoder(
    batches: list[tuple[list[RecordInput], int, bool]], first: int, last: int
) -> None:
    payload = _payload(batches)
    expected = [(r.offset, r.timestamp, r.key, r.value) for r in _reference(payload, first, last)]
    assert _columns(payload, first, last) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_record, min_size=1, max_size=20), st.data())
def test_a_damaged_batch_fails_cleanly_or_reads_as_the_reference_does(
    records: list[RecordInput], data: st.DataObject
) -> None:
    payload = bytearray(encode_batch(records))
    header = parse_batch_header(payload)
    # Damage the records section only: the header and CRC are checked before decoding.
    at = data.draw(st.integers(61, header.size - 1))
    payload[at] = data.draw(st.integers(0, 255))
    try:
        expected = [(r.offset, r.timestamp, r.key, r.value) for r in _reference(bytes(payload), 0, 1 << 40)]
    except InvalidRecordBatch:
        expected = None
    try:
        got = _columns(bytes(payload), 0, 1 << 40)
    except InvalidRecordBatch:
        return
    if expected is not None:
        assert got == expected


def test_nothing_kept_gives_empty_columns() -> None:
    payload = encode_batch([RecordInput(b"k", b"v")] * 3, base_offset=10)
    assert _columns(payload, 0, 9) == []
    assert _columns(payload, 11, 11) == [(11, parse_batch_header(payload).base_timestamp, b"k", b"v")]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 200)), min_size=1, max_size=8))
def test_runs_of_equal_length_records_and_stretches_of_unequal_ones(runs: list[tuple[int, int]]) -> None:
    # Long runs of one record length take the vectorised path, short ones the record-by-record walk.
    records = [
        RecordInput(b"k", bytes(size + (i % 3 if length == 1 else 0)), (), 1000 + i)
        for length, size in runs
        for i in range(length)
    ]
    payload = encode_batch(records)
    expected = [(r.offset, r.timestamp, r.key, r.value) for r in _reference(payload, 0, 1 << 40)]
    assert _columns(payload, 0, 1 << 40) == expected
