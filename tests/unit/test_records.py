"""Record-level v2 batches: codecs, varints, encode/decode, produce validation, and interop."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import cramjam
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.protocol import compression
from shoal.protocol.compression import CompressionError, UnsupportedCompression
from shoal.protocol.record_batch import (
    ATTRIBUTES_POS,
    HEADER_SIZE,
    CorruptRecordBatch,
    InvalidRecordBatch,
    compute_crc,
    iter_batches,
    iter_packed_headers,
    parse_batch_header,
    set_base_offset,
    set_log_append_time,
    verify_crc,
)
from shoal.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    LOG_APPEND_TIME,
    Header,
    InvalidRecord,
    InvalidTimestamp,
    Record,
    RecordInput,
    TimestampBounds,
    control_record_type,
    decode_batch,
    decode_batches,
    encode_batch,
    encode_txn_marker,
    read_uvarint,
    read_varint,
    read_varlong,
    validate_batch_for_append,
    varint_size,
    write_uvarint,
    write_varint,
    write_varlong,
)

# kafka-python emits importlib DeprecationWarnings on import; they are not ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]
GOLDEN = Path("/work/shared/golden")

SAMPLE = [
    RecordInput(
        b"key-0", b"value-0" * 20, [Header("trace", b"abc"), Header("empty", None)], 1_700_000_000_000
    ),
    RecordInput(None, b"no key", (), 1_700_000_000_005),
    RecordInput(b"tombstone", None, [("tuple-header", b"")], 1_699_999_999_990),  # earlier than base
    RecordInput(b"", b"", [Header("ünïcode-ключ", b"\x00\xff")], 1_700_000_000_100),
    RecordInput(None, None, (), 1_700_000_000_001),
]


def _expected(records: list[RecordInput], base_offset: int) -> list[Record]:
    out = []
    for i, rec in enumerate(records):
        headers = [h if isinstance(h, Header) else Header(*h) for h in rec.headers]
        assert rec.timestamp is not None
        out.append(Record(base_offset + i, rec.timestamp, rec.key, rec.value, headers))
    return out


def _recrc(buf: bytearray, pos: int = 0) -> None:
    """Rewrite the CRC after a deliberate edit, so the check under test is not the CRC one."""
    header = parse_batch_header(buf, pos)
    struct.pack_into(">I", buf, pos + 17, compute_crc(buf, pos, header.size))


# --------------------------------------------------------------------------------------------- codecs


@pytest.mark.parametrize("codec", CODECS)
def test_compress_round_trip(codec: int) -> None:
    data = b"".join(b"record %d payload " % i for i in range(5000))  # > one 32 KiB snappy chunk
    packed = compression.compress(codec, data)
    if codec != compression.NONE:
        assert len(packed) < len(data)
    assert compression.decompress(codec, packed) == data
    assert compression.decompress(codec, memoryview(packed)) == data
    assert compression.decompress(codec, compression.compress(codec, b"")) == b""


def test_snappy_writes_xerial_and_reads_raw_blocks() -> None:
    data = b"snappy " * 10_000
    packed = compression.compress(compression.SNAPPY, data)
    assert packed.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    raw_block = bytes(cramjam.snappy.compress_raw(data))
    assert compression.decompress(compression.SNAPPY, raw_block) == data
    # Some producers write the xerial version/compat ints little-endian; only the magic matters.
    block = bytes(cramjam.snappy.compress_raw(b"abc" * 10))
    odd = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert compression.decompress(compression.SNAPPY, odd) == b"abc" * 10
    with pytest.raises(CompressionError):
        compression.decompress(compression.SNAPPY, packed[:-3])


def test_zstd_without_content_size_and_concatenated_frames() -> None:
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    frames = cctx.compress(b"a" * 100_000) + cctx.compress(b"b" * 10)
    assert compression.decompress(compression.ZSTD, frames) == b"a" * 100_000 + b"b" * 10
    with pytest.raises(CompressionError):
        compression.decompress(compression.ZSTD, frames[:20])


def test_lz4_and_gzip_multi_frame() -> None:
    two = lz4.frame.compress(b"x" * 1000) + lz4.frame.compress(b"y" * 10)
    assert compression.decompress(compression.LZ4, two) == b"x" * 1000 + b"y" * 10
    members = gzip.compress(b"one") + gzip.compress(b"two")
    assert compression.decompress(compression.GZIP, members) == b"onetwo"


@pytest.mark.parametrize("codec", CODECS[1:])
def test_garbage_raises_compression_error(codec: int) -> None:
    with pytest.raises(CompressionError):
        compression.decompress(codec, b"\x82SNAPPY\x00 definitely not compressed data \xff\xfe")


def test_unknown_codec() -> None:
    for call in (compression.compress, compression.decompress):
        with pytest.raises(UnsupportedCompression):
            call(5, b"x")
    assert compression.codec_from_name("ZSTD") == compression.ZSTD
    assert compression.codec_name(compression.SNAPPY) == "snappy"
    with pytest.raises(UnsupportedCompression):
        compression.codec_from_name("brotli")


# --------------------------------------------------------------------------------------------- varints


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (300, b"\xd8\x04"),
    ],
)
def test_varint_known_bytes(value: int, encoded: bytes) -> None:
    out = bytearray()
    write_varint(out, value)
    assert bytes(out) == encoded
    assert read_varint(b"\xaa" + encoded, 1) == (value, 1 + len(encoded))
    assert varint_size(value) == len(encoded)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1))
def test_varint_round_trip(long_value: int, int_value: int, unsigned: int) -> None:
    from kafka.record.util import decode_varint

    out = bytearray(b"\x07")
    write_varlong(out, long_value)
    mid = len(out)
    write_varint(out, int_value)
    end = len(out)
    write_uvarint(out, unsigned)
    assert read_varlong(out, 1) == (long_value, mid)
    assert read_varint(out, mid) == (int_value, end)
    assert read_uvarint(out, end) == (unsigned, len(out))
    assert varint_size(long_value) == mid - 1
    # Independent decoder: kafka-python's zigzag varint reader.
    assert decode_varint(bytes(out), 1) == (long_value, mid)


def test_varint_errors() -> None:
    with pytest.raises(InvalidRecordBatch):
        read_varlong(b"\x80\x80", 0)
    with pytest.raises(InvalidRecordBatch):
        read_varint(b"\xff\xff\xff\xff\xff\x01", 0)
    with pytest.raises(ValueError):
        write_varint(bytearray(), 2**31)


# --------------------------------------------------------------------------------------------- batches


@pytest.mark.parametrize("codec", CODECS)
def test_batch_round_trip_every_codec(codec: int) -> None:
    buf = encode_batch(
        SAMPLE,
        base_offset=42,
        compression=codec,
        producer_id=7,
        producer_epoch=3,
        base_sequence=11,
        partition_leader_epoch=5,
    )
    header, records = decode_batch(buf)
    assert header.size == len(buf)
    assert header.compression == codec
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (42, 4, 5)
    assert header.base_timestamp == SAMPLE[0].timestamp
    assert header.max_timestamp == 1_700_000_000_100
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, 11)
    assert header.partition_leader_epoch == 5
    assert not header.is_transactional and not header.is_control and header.timestamp_type == 0
    assert records == _expected(SAMPLE, 42)
    if codec != compression.NONE:
        raw = encode_batch(SAMPLE)
        body = compression.decompress(codec, buf[HEADER_SIZE:])
        assert body == raw[HEADER_SIZE:]


def test_timestamps_and_flags() -> None:
    buf = encode_batch(
        [RecordInput(b"k", b"v", (), 2000), RecordInput(b"k", b"v", (), 1000)],
        base_timestamp=500,
        is_transactional=True,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
    )
    header, records = decode_batch(buf)
    assert header.base_timestamp == 500 and header.max_timestamp == 2000 and header.is_transactional
    assert [r.timestamp for r in records] == [2000, 1000]
    # A record without a timestamp gets "now".
    _, (rec,) = decode_batch(encode_batch([RecordInput(b"k", b"v")]))
    assert rec.timestamp > 1_600_000_000_000


def test_log_append_time_uses_max_timestamp() -> None:
    buf = bytearray(encode_batch([RecordInput(b"a", b"1", (), 10), RecordInput(b"b", b"2", (), 20)]))
    header = parse_batch_header(buf)
    set_log_append_time(buf, 0, header, 99_999)
    header, records = decode_batch(buf)
    assert header.timestamp_type == 1
    assert [r.timestamp for r in records] == [99_999, 99_999]
    header2, records2 = decode_batch(encode_batch([RecordInput(b"a", b"1", (), 10)], timestamp_type=1))
    assert header2.timestamp_type == 1 and records2[0].timestamp == 10


def test_many_records_use_multi_byte_varints() -> None:
    recs = [RecordInput(str(i).encode(), bytes(i % 300), (), 1000 + i * 1000) for i in range(10_000)]
    header, records = decode_batch(encode_batch(recs, compression=compression.LZ4))
    assert header.last_offset_delta == 9_999
    assert records[-1] == Record(9_999, 1000 + 9_999 * 1000, b"9999", bytes(9_999 % 300), [])
    assert [r.offset for r in records] == list(range(10_000))


def test_empty_batch_refused() -> None:
    with pytest.raises(ValueError):
        encode_batch([])


_header_st = st.builds(Header, st.text(max_size=8), st.none() | st.binary(max_size=8))
_record_st = st.builds(
    RecordInput,
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(_header_st, max_size=3),
    st.integers(0, 2**41),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_record_st, min_size=1, max_size=20), st.sampled_from(CODECS), st.integers(0, 2**40))
def test_round_trip_property(records: list[RecordInput], codec: int, base_offset: int) -> None:
    buf = encode_batch(records, compression=codec, base_offset=base_offset)
    header, decoded = decode_batch(buf)
    assert decoded == _expected(records, base_offset)
    assert header.max_timestamp == max(r.timestamp for r in records if r.timestamp is not None)
    produced = bytearray(buf)
    set_base_offset(produced, 0, 0)
    validate_batch_for_append(produced, 0, parse_batch_header(produced), check_records=True)


# --------------------------------------------------------------------------------------------- corruption


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_byte_fails_crc(codec: int) -> None:
    buf = encode_batch(SAMPLE, compression=codec)
    for pos in (ATTRIBUTES_POS + 1, HEADER_SIZE + 3, len(buf) - 1):
        bad = bytearray(buf)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptRecordBatch):
            decode_batch(bad)
        with pytest.raises(CorruptRecordBatch):
            validate_batch_for_append(bad, 0, parse_batch_header(bad))


def test_truncated_batch() -> None:
    buf = encode_batch(SAMPLE)
    for cut in (10, HEADER_SIZE - 1, HEADER_SIZE + 5, len(buf) - 1):
        with pytest.raises(InvalidRecordBatch):
            decode_batch(buf[:cut])


def test_garbled_records_with_valid_crc() -> None:
    good = encode_batch([RecordInput(b"key", b"value", [Header("h", b"v")], 5)])
    # Record count claims two records but only one is present.
    bad = bytearray(good)
    struct.pack_into(">i", bad, 57, 2)
    _recrc(bad)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(bad)
    # The record's length varint overruns the batch.
    bad = bytearray(good)
    bad[HEADER_SIZE] = 0x7E
    _recrc(bad)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(bad)
    # Trailing junk after the last record.
    bad = bytearray(good) + b"\x00\x00"
    struct.pack_into(">i", bad, 8, len(bad) - 12)
    _recrc(bad)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(bad)
    # Key length -5 is not a valid null marker.
    bad = bytearray(good)
    key_len_pos = HEADER_SIZE + 4  # length, attributes, ts delta, offset delta
    assert bad[key_len_pos] == 6
    bad[key_len_pos] = 9
    _recrc(bad)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(bad)
    # A compressed batch whose payload is not valid for its codec.
    bad = bytearray(encode_batch(SAMPLE, compression=compression.ZSTD))
    bad[HEADER_SIZE + 8 : HEADER_SIZE + 20] = b"\x00" * 12
    _recrc(bad)
    with pytest.raises(InvalidRecordBatch):
        decode_batch(bad)


def test_set_base_offset_keeps_crc() -> None:
    buf = bytearray(encode_batch(SAMPLE, compression=compression.GZIP))
    set_base_offset(buf, 0, 1_000_000)
    header = parse_batch_header(buf)
    verify_crc(buf, 0, header)
    _, records = decode_batch(buf)
    assert [r.offset for r in records] == list(range(1_000_000, 1_000_005))


# --------------------------------------------------------------------------------------------- validation


def _validate(buf: bytes | bytearray, **kwargs: bool) -> None:
    validate_batch_for_append(buf, 0, parse_batch_header(buf), **kwargs)


def test_validate_accepts_producer_batches() -> None:
    for codec in CODECS:
        _validate(encode_batch(SAMPLE, compression=codec, producer_id=3, producer_epoch=0, base_sequence=0))
        _validate(encode_batch(SAMPLE, compression=codec), check_records=True)


def test_validate_refusals() -> None:
    good = encode_batch(SAMPLE)
    cases: dict[str, bytearray] = {}
    cases["count"] = bytearray(good)
    struct.pack_into(">i", cases["count"], 23, 3)  # last offset delta 3 with 5 records
    cases["zero"] = bytearray(encode_batch(SAMPLE))
    struct.pack_into(">ii", cases["zero"], 23, -1, 0)
    cases["control"] = bytearray(
        encode_txn_marker(commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=0)
    )
    cases["sequence"] = bytearray(encode_batch(SAMPLE, producer_id=9, producer_epoch=0, base_sequence=-1))
    for name, buf in cases.items():
        _recrc(buf)
        with pytest.raises(InvalidRecord):
            _validate(buf)
        assert issubclass(InvalidRecord, CorruptRecordBatch), name
    with pytest.raises(InvalidRecord):
        _validate(encode_batch(SAMPLE, base_offset=8))

    unknown = bytearray(good)
    struct.pack_into(">h", unknown, ATTRIBUTES_POS, 5)
    _recrc(unknown)
    with pytest.raises(CorruptRecordBatch) as info:
        _validate(unknown)
    assert not isinstance(info.value, InvalidRecord)

    garbled = bytearray(good)
    garbled[HEADER_SIZE] = 0x7E
    _recrc(garbled)
    _validate(garbled, check_records=False)  # only the header checks
    with pytest.raises(InvalidRecord):
        _validate(garbled)  # produce walks every record, as Kafka's log validator does


# --------------------------------------------------------------------------------------------- payloads


def test_decode_batches_control_and_partial() -> None:
    first = encode_batch(
        SAMPLE[:2], base_offset=0, producer_id=4, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    marker = encode_txn_marker(
        commit=False, producer_id=4, producer_epoch=0, coordinator_epoch=3, base_offset=2, timestamp=77
    )
    second = encode_batch(SAMPLE[2:], base_offset=3, compression=compression.SNAPPY)
    payload = first + marker + second
    assert [r.offset for r in decode_batches(payload)] == [0, 1, 3, 4, 5]
    with_control = decode_batches(payload, include_control=True)
    assert [r.offset for r in with_control] == [0, 1, 2, 3, 4, 5]
    assert control_record_type(with_control[2]) == CONTROL_ABORT
    assert with_control[2].value == struct.pack(">hi", 0, 3) and with_control[2].timestamp == 77
    commit = decode_batches(
        encode_txn_marker(commit=True, producer_id=4, producer_epoch=0, coordinator_epoch=3),
        include_control=True,
    )
    assert control_record_type(commit[0]) == CONTROL_COMMIT
    # A fetch cut inside the last batch: consumers drop the partial tail.
    cut = payload[: len(payload) - 5]
    with pytest.raises(InvalidRecordBatch):
        decode_batches(cut)
    assert [r.offset for r in decode_batches(cut, allow_partial=True)] == [0, 1]
    assert decode_batches(payload[:30], allow_partial=True) == []
    assert [pos for pos, _ in iter_batches(payload, check_crc=True)] == [
        0,
        len(first),
        len(first) + len(marker),
    ]


def test_packed_headers_read_back_as_the_batches_headers() -> None:
    batches = [
        encode_batch(SAMPLE[:2], base_offset=0),
        encode_txn_marker(commit=True, producer_id=4, producer_epoch=0, coordinator_epoch=3, base_offset=2),
        encode_batch(SAMPLE[2:], base_offset=3, compression=compression.ZSTD),
    ]
    packed = b"".join(bytes(b[:HEADER_SIZE]) for b in batches)
    whole = [h for _, h in iter_batches(b"".join(batches))]
    assert list(iter_packed_headers(packed)) == whole
    assert [(h.base_offset, h.last_offset, h.size, h.is_control) for h in whole] == [
        (0, 1, len(batches[0]), False),
        (2, 2, len(batches[1]), True),
        (3, 5, len(batches[2]), False),
    ]
    assert list(iter_packed_headers(b"")) == []
    with pytest.raises(InvalidRecordBatch):
        list(iter_packed_headers(packed[:-1]))


# --------------------------------------------------------------------------------------------- interop

# kafka-python needs python-snappy for snappy, absent here; the aiokafka test covers snappy both ways.
KP_CODECS = [compression.NONE, compression.GZIP, compression.LZ4, compression.ZSTD]


def _compressible(i: int) -> bytes:
    return b"payload-%d-" % i + b"z" * 200


@pytest.mark.parametrize("codec", KP_CODECS)
def test_kafka_python_batch_decodes_with_ours(codec: int) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=1_000, key=b"k0", value=_compressible(0), headers=[("h", b"v"), ("n", None)])
    builder.append(1, timestamp=900, key=None, value=_compressible(1), headers=[])
    builder.append(2, timestamp=1_500, key=b"k2", value=None, headers=[])
    buf = bytes(builder.build())
    header, records = decode_batch(buf)
    assert header.compression == codec
    assert records == [
        Record(0, 1_000, b"k0", _compressible(0), [Header("h", b"v"), Header("n", None)]),
        Record(1, 900, None, _compressible(1), []),
        Record(2, 1_500, b"k2", None, []),
    ]
    assert header.max_timestamp == 1_500
    _validate(buf, check_records=True)


@pytest.mark.parametrize("codec", KP_CODECS)
def test_our_batch_decodes_with_kafka_python(codec: int) -> None:
    from kafka.record.memory_records import MemoryRecords

    recs = [
        RecordInput(b"k%d" % i, _compressible(i), [Header("h", b"x"), Header("nil", None)], 5_000 + i)
        for i in range(50)
    ]
    recs.append(RecordInput(None, None, (), 4_000))
    ours = encode_batch(recs, base_offset=100, compression=codec)
    reader = MemoryRecords(ours)
    batch = reader.next_batch()
    assert reader.next_batch() is None
    assert batch.validate_crc()
    assert batch.compression_type == codec
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    want = [
        (100 + i, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers if isinstance(h, Header)])
        for i, r in enumerate(recs)
    ]
    assert got == want


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_both_directions(codec: int) -> None:
    from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, codec, 0, 5, 1, 10, 1 << 20)
    for i in range(20):
        builder.append(i, timestamp=10_000 + i, key=b"a%d" % i, value=_compressible(i), headers=[("x", b"y")])
    theirs = bytes(builder.build())
    header, records = decode_batch(theirs)
    assert header.compression == codec and (
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
    ) == (5, 1, 10)
    assert records == [
        Record(i, 10_000 + i, b"a%d" % i, _compressible(i), [Header("x", b"y")]) for i in range(20)
    ]
    _validate(theirs, check_records=True)

    ours = encode_batch(
        [RecordInput(b"a%d" % i, _compressible(i), [Header("x", None)], 10_000 + i) for i in range(20)],
        base_offset=7,
        compression=codec,
    )
    batch = DefaultRecordBatch(ours)
    assert batch.validate_crc() and batch.compression_type == codec
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(7 + i, 10_000 + i, b"a%d" % i, _compressible(i), [("x", None)]) for i in range(20)]


def _find_batch(frame: bytes) -> int:
    """Position of the first v2 batch in a request frame: magic 2 at +16 and a matching CRC."""
    for pos in range(len(frame) - HEADER_SIZE):
        if frame[pos + 16] != 2:
            continue
        try:
            header = parse_batch_header(frame, pos)
            verify_crc(frame, pos, header)
        except InvalidRecordBatch:
            continue
        return pos
    raise AssertionError("no record batch in frame")


_GOLDEN_EXPECTED = {
    # librdkafka 2.16, uncompressed, idempotent producer: 20 records with one header each.
    "Produce-v10-rdkafka.request.bin": [
        (b"k%d" % i, b"value-none-%d" % i, [Header("h", b"v")]) for i in range(20)
    ],
    "Produce-v7-aiokafka-producer-1.request.bin": [(b"aio", b"aio", [])],
}


@pytest.mark.skipif(not (GOLDEN / "index.json").exists(), reason="golden frames not present")
@pytest.mark.parametrize("name", sorted(_GOLDEN_EXPECTED))
def test_golden_produce_batches(name: str) -> None:
    frames = json.loads((GOLDEN / "index.json").read_text())["frames"]
    assert any(f["request"] == name for f in frames)
    frame = (GOLDEN / name).read_bytes()
    pos = _find_batch(frame)
    header, records = decode_batch(frame, pos)
    # The batch fills the request's `records` field: int32 size (v7) or compact-bytes uvarint size+1 (v10).
    if "v7" in name:
        assert struct.unpack_from(">i", frame, pos - 4)[0] == header.size
    else:
        assert read_uvarint(frame, pos - 2) == (header.size + 1, pos)
    assert len(records) == header.records_count == header.last_offset_delta + 1
    assert [(r.key, r.value, r.headers) for r in records] == _GOLDEN_EXPECTED[name]
    assert [r.offset for r in records] == list(range(len(records)))
    assert all(header.base_timestamp <= r.timestamp <= header.max_timestamp for r in records)
    validate_batch_for_append(frame, pos, header, check_records=True)
    # Our encoder writes the very same bytes for the records section of an uncompressed batch.
    again = encode_batch(records, base_timestamp=header.base_timestamp)
    assert again[HEADER_SIZE:] == frame[pos + HEADER_SIZE : pos + header.size]


@settings(max_examples=200, deadline=None)
@given(st.lists(_record_st, min_size=1, max_size=6), st.data())
def test_produce_validation_agrees_with_the_decoder(records: list[RecordInput], data: st.DataObject) -> None:
    """Damage the records of a CRC-valid batch: produce must refuse exactly what a consumer could not decode."""
    buf = bytearray(encode_batch(records))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(HEADER_SIZE, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    _recrc(buf)
    header = parse_batch_header(buf)
    try:
        _h, decoded = decode_batch(buf)
        decodable = all(r.offset == i for i, r in enumerate(decoded))  # produce also insists on deltas 0..n-1
    except InvalidRecordBatch:
        decodable = False
    if decodable:
        validate_batch_for_append(buf, 0, header)
    else:
        with pytest.raises(InvalidRecord):
            validate_batch_for_append(buf, 0, header)


def test_timestamp_bounds() -> None:
    now = 1_700_000_000_000
    bounds = TimestampBounds(now, 1000, 3_600_000)
    ok = bytearray(encode_batch([RecordInput(b"k", b"v", (), now - 500), RecordInput(b"k", b"v", (), now + 3_600_000)]))
    validate_batch_for_append(ok, 0, parse_batch_header(ok), timestamp_bounds=bounds)
    for ts in (now - 1001, now + 3_600_001):
        bad = bytearray(encode_batch([RecordInput(b"k", b"v", (), now), RecordInput(b"k", b"v", (), ts)]))
        with pytest.raises(InvalidTimestamp):
            validate_batch_for_append(bad, 0, parse_batch_header(bad), timestamp_bounds=bounds)
    # A LogAppendTime batch carries the broker's time; its record timestamps are not checked.
    stamped = bytearray(encode_batch([RecordInput(b"k", b"v", (), 0)], timestamp_type=LOG_APPEND_TIME))
    validate_batch_for_append(stamped, 0, parse_batch_header(stamped), timestamp_bounds=bounds)
