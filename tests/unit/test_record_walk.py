"""The compiled produce-time record walk against the Python walk it replaces.

`validate_batch_for_append` walks records with protocol/_record_walk.c when it is built and falls back to
the Python walk (`_walk_records`, the walk of issue 16) when it is not. These properties run both over
valid batches, damaged ones and hand-framed record sections, in every codec, and require the same outcome:
accepted, or refused with the same exception class (so the same Kafka error code).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.protocol import compression, records
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import (
    ATTRIBUTES_POS,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    CorruptRecordBatch,
    InvalidRecordBatch,
    compute_crc,
    parse_batch_header,
)
from shoal.protocol.records import (
    Header,
    InvalidRecord,
    InvalidTimestamp,
    RecordInput,
    TimestampBounds,
    encode_batch,
    validate_batch_for_append,
)

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]
NOW = 1_700_000_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

compiled_walk = records._compiled_walk
pytestmark = pytest.mark.skipif(compiled_walk is None, reason="the record walk extension is not built")


@contextmanager
def python_walk() -> Iterator[None]:
    """Validate with the Python walk alone, as a build without the extension does."""
    saved = records._compiled_walk
    records._compiled_walk = None
    try:
        yield
    finally:
        records._compiled_walk = saved


def error_code(exc: InvalidRecordBatch | None) -> ErrorCode:
    """The code the produce handler answers with for this outcome."""
    if exc is None:
        return ErrorCode.NONE
    if isinstance(exc, InvalidTimestamp):
        return ErrorCode.INVALID_TIMESTAMP
    if isinstance(exc, InvalidRecord):
        return ErrorCode.INVALID_RECORD
    return ErrorCode.CORRUPT_MESSAGE


def outcome(buf: bytearray, *, require_keys: bool, bounds: TimestampBounds | None) -> type[Exception] | None:
    header = parse_batch_header(buf, 0)
    try:
        validate_batch_for_append(buf, 0, header, timestamp_bounds=bounds, require_keys=require_keys)
    except InvalidRecordBatch as exc:
        return type(exc)
    return None


def assert_same_outcome(buf: bytearray, *, require_keys: bool, bounds: TimestampBounds | None) -> type[Exception] | None:
    new = outcome(buf, require_keys=require_keys, bounds=bounds)
    with python_walk():
        old = outcome(buf, require_keys=require_keys, bounds=bounds)
    assert new is old
    return new


def with_records_section(batch: bytes, raw: bytes, *, count: int | None = None) -> bytearray:
    """`batch`'s header over a records section `raw` (compressed with the batch's codec), length and CRC
    rewritten so only the record-level checks can refuse it."""
    header = parse_batch_header(batch, 0)
    payload = raw if header.compression == compression.NONE else compression.compress(header.compression, raw)
    buf = bytearray(batch[:HEADER_SIZE]) + payload
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    if count is not None:
        struct.pack_into(">ii", buf, 23, count - 1, count)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return buf


def records_section(batch: bytes) -> bytes:
    header = parse_batch_header(batch, 0)
    body = batch[HEADER_SIZE : header.size]
    return body if header.compression == compression.NONE else compression.decompress(header.compression, body)


_header_st = st.builds(Header, st.text(max_size=6), st.none() | st.binary(max_size=8))
_record_st = st.builds(
    RecordInput,
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=200),
    st.lists(_header_st, max_size=3),
    st.integers(NOW - 5_000, NOW + 5_000),
)
_bounds_st = st.none() | st.builds(TimestampBounds, st.integers(NOW - 3_000, NOW + 3_000), st.integers(0, 6_000),
                                   st.integers(0, 6_000))


@SETTINGS
@given(st.lists(_record_st, min_size=1, max_size=30), st.sampled_from(CODECS), st.booleans(), _bounds_st,
       st.booleans())
def test_valid_batches_walk_the_same(batch_records: list[RecordInput], codec: int, require_keys: bool,
                                     bounds: TimestampBounds | None, log_append_time: bool) -> None:
    buf = bytearray(encode_batch(batch_records, compression=codec,
                                 timestamp_type=records.LOG_APPEND_TIME if log_append_time else records.CREATE_TIME))
    got = assert_same_outcome(buf, require_keys=require_keys, bounds=bounds)
    if not require_keys and bounds is None:
        assert got is None
    # Well-framed records never fall back to the Python walk: the compiled walk gives the same deltas.
    assert compiled_walk is not None
    raw = records_section(bytes(buf))
    assert compiled_walk(raw, len(batch_records), require_keys) == (
        None if require_keys and any(r.key is None for r in batch_records)
        else records._walk_records(raw, len(batch_records))
    )


@SETTINGS
@given(st.lists(_record_st, min_size=1, max_size=8), st.sampled_from(CODECS), st.booleans(), _bounds_st, st.data())
def test_damaged_record_sections_are_refused_the_same(
    batch_records: list[RecordInput], codec: int, require_keys: bool, bounds: TimestampBounds | None,
    data: st.DataObject,
) -> None:
    """Edit the records inside a batch (then compress and CRC it again): the record walk alone decides."""
    batch = encode_batch(batch_records, compression=codec)
    raw = bytearray(records_section(batch))
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        kind = data.draw(st.sampled_from(["set", "insert", "delete", "cut"]), label="kind")
        at = data.draw(st.integers(0, len(raw)), label="at")
        if kind == "set" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del raw[at : at + data.draw(st.integers(1, 4))]
        else:
            del raw[at:]
    count = data.draw(st.none() | st.integers(1, len(batch_records) + 2), label="count")
    if not raw:
        raw = bytearray(b"\x00")
    assert_same_outcome(with_records_section(batch, bytes(raw), count=count), require_keys=require_keys, bounds=bounds)


@SETTINGS
@given(st.lists(_record_st, min_size=1, max_size=8), st.sampled_from(CODECS), st.booleans(), st.data())
def test_damaged_batches_are_refused_the_same(batch_records: list[RecordInput], codec: int, fix_crc: bool,
                                              data: st.DataObject) -> None:
    """Flip bytes anywhere in the batch, codec stream included: CRC, codec and framing faults."""
    buf = bytearray(encode_batch(batch_records, compression=codec))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(ATTRIBUTES_POS, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    header = parse_batch_header(buf, 0)
    if fix_crc:
        struct.pack_into(">I", buf, 17, compute_crc(buf, 0, header.size))
    assert_same_outcome(buf, require_keys=False, bounds=TimestampBounds(NOW, 10_000, 10_000))


def _varint(value: int, padding: int) -> bytes:
    """Zigzag varint of `value` (any size), with `padding` redundant continuation bytes at the end."""
    u = (value << 1) ^ (value >> 80) if value < 0 else value << 1
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    if padding:
        out[-1] |= 0x80
        out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


# Odd field values: null and invalid lengths, values that need nine, ten or more varint bytes.
_odd_value_st = st.one_of(
    st.sampled_from([-1, -2, -3, 0, 1]), st.sampled_from([-1, -2]), st.integers(-3, 40),
    st.integers(2**62, 2**64) | st.integers(-(2**64), -(2**62)), st.integers(-(2**70), 2**70),
)


@st.composite
def framed_records(draw: st.DrawFn) -> tuple[bytes, int]:
    """A records section framed by hand: truthful lengths and deltas, except that a record may get one
    odd field (a null or negative size, a wrong offset delta or header count, a value of nine, ten or more
    varint bytes, with or without the bytes it announces); any varint may be padded with redundant bytes."""
    count = draw(st.integers(1, 4))
    out = bytearray()
    for index in range(count):
        headers = draw(st.lists(st.tuples(st.binary(max_size=5), st.none() | st.binary(max_size=5)), max_size=3))
        odd_field = draw(st.none() | st.integers(0, 5 + 2 * len(headers)), label="odd field")
        fields = iter(range(7 + 2 * len(headers)))

        def field(value: int, blob: bytes = b"", fields: Iterator[int] = fields, odd_field: int | None = odd_field
                  ) -> bytes:
            if next(fields) == odd_field:
                value = draw(_odd_value_st, label="odd value")
                # Mostly framed as the odd value says (no bytes for a size below one), so the fault is the value.
                blob = draw(st.sampled_from([b"" if value <= 0 else blob, b"" if value <= 0 else blob, blob,
                                             blob + b"\x00"]), label="odd bytes")
            return _varint(value, draw(st.sampled_from([0] * 8 + [1, 9]), label="padding")) + blob

        def sized(blob: bytes | None, field: Callable[..., bytes] = field) -> bytes:
            return field(-1) if blob is None else field(len(blob), blob)

        body = bytearray(draw(st.binary(min_size=1, max_size=1)))  # attributes
        body += field(draw(st.integers(-(2**40), 2**40)))
        body += field(index)
        body += sized(draw(st.none() | st.binary(max_size=12)))
        body += sized(draw(st.none() | st.binary(max_size=12)))
        body += field(len(headers))
        for key, value in headers:
            body += sized(key) + sized(value)
        out += field(len(body)) + body
    return bytes(out), count


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(framed_records(), st.sampled_from(CODECS), st.booleans(), _bounds_st)
def test_hand_framed_records_walk_the_same(framed: tuple[bytes, int], codec: int, require_keys: bool,
                                          bounds: TimestampBounds | None) -> None:
    raw, count = framed
    batch = encode_batch([RecordInput(b"k", b"v", (), NOW)], compression=codec)
    assert_same_outcome(with_records_section(batch, raw, count=count), require_keys=require_keys, bounds=bounds)
    # Where the compiled walk answers at all, it answers what the Python walk does.
    assert compiled_walk is not None
    fast = compiled_walk(raw, count, require_keys)
    if fast is not None:
        assert fast == records._walk_records(raw, count, require_keys=require_keys)


def test_outcomes_map_to_kafka_codes() -> None:
    """Each kind of refusal reaches the producer as the code Kafka's log validator gives it."""
    batch = encode_batch([RecordInput(None, b"v", (), NOW)])
    assert error_code(None) == ErrorCode.NONE
    keyless = assert_same_outcome(bytearray(batch), require_keys=True, bounds=None)
    assert keyless is InvalidRecord
    late = assert_same_outcome(bytearray(batch), require_keys=False, bounds=TimestampBounds(NOW + 10_000, 1, 1))
    assert late is InvalidTimestamp
    stamped = bytearray(batch)
    stamped[ATTRIBUTES_POS + 1] |= TIMESTAMP_TYPE_MASK
    struct.pack_into(">I", stamped, 17, compute_crc(stamped, 0, len(stamped)))
    assert assert_same_outcome(stamped, require_keys=False, bounds=TimestampBounds(NOW + 10_000, 1, 1)) is None
    bad_crc = bytearray(batch)
    bad_crc[-1] ^= 1
    refused = assert_same_outcome(bad_crc, require_keys=False, bounds=None)
    assert refused is CorruptRecordBatch
    codes = {error_code(exc("x")) for exc in (InvalidRecord, InvalidTimestamp, CorruptRecordBatch)}
    assert codes == {ErrorCode.INVALID_RECORD, ErrorCode.INVALID_TIMESTAMP, ErrorCode.CORRUPT_MESSAGE}


def _record(*fields: bytes) -> bytes:
    body = b"\x00" + b"".join(fields)  # attributes, then the fields
    return _varint(len(body), 0) + body


@pytest.mark.parametrize(
    ("raw", "count"),
    [
        (_record(_varint(5, 0), _varint(0, 0), _varint(-1, 0), _varint(-2, 0), _varint(0, 0)), 1),  # value -2
        (_record(_varint(5, 0), _varint(0, 0), _varint(-2, 0), _varint(-1, 0), _varint(0, 0)), 1),  # key -2
        (_record(_varint(5, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(1, 0), _varint(-1, 0),
                 _varint(-1, 0)), 1),  # a header with a null key
        (_record(_varint(5, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(1, 0), _varint(0, 0),
                 _varint(-2, 0)), 1),  # a header value of length -2
        (_record(_varint(5, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(-1, 0)), 1),  # headers -1
        (_record(_varint(5, 9), _varint(0, 9), _varint(-1, 9), _varint(-1, 9), _varint(0, 9)), 1),  # ten bytes each
        (_record(_varint(2**63 + 5, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(0, 0)), 1),  # > int64
        (_record(_varint(-(2**63) - 7, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(0, 0)), 1),
        (_record(_varint(2**64 + 1, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(0, 0)), 1),
        (_record(_varint(1, 0), _varint(1, 0), _varint(-1, 0), _varint(-1, 0), _varint(0, 0)), 1),  # offset delta 1
        (_record(_varint(1, 0), _varint(0, 0), _varint(-1, 0), _varint(-1, 0), _varint(0, 0)) * 2, 1),  # extra bytes
        (_record(_varint(1, 0), _varint(0, 0), _varint(3, 0) + b"abc", _varint(-1, 0), _varint(0, 0)), 2),  # short
    ],
)
@pytest.mark.parametrize("require_keys", [False, True])
@pytest.mark.parametrize("bounds", [None, TimestampBounds(0, 10, 10)])
def test_corner_cases_walk_the_same(raw: bytes, count: int, require_keys: bool, bounds: TimestampBounds | None) -> None:
    for codec in CODECS:
        batch = encode_batch([RecordInput(b"k", b"v", (), 0)], compression=codec)
        assert_same_outcome(with_records_section(batch, raw, count=count), require_keys=require_keys, bounds=bounds)


def test_every_keyless_record_of_a_batch_is_named() -> None:
    """A compacted topic's refusal lists each keyless record by its index in the batch, as Kafka's
    RecordErrors do, whichever walk found the first one."""
    keys = [b"a", None, b"c", None, None, b"f"]
    buf = bytearray(encode_batch([RecordInput(key, b"v", (), NOW) for key in keys]))
    header = parse_batch_header(buf, 0)
    with pytest.raises(InvalidRecord) as info:
        validate_batch_for_append(buf, 0, header, require_keys=True)
    assert info.value.keyless == (1, 3, 4)
    validate_batch_for_append(buf, 0, header, require_keys=False)
