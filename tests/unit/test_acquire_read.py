"""The size of an acquisition pass's log read: within the request's allowance, enough for the records
wanted once the partition's batch sizes are known, and not the whole allowance when few are wanted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share.acquire_read import FIRST_READ_BYTES, MIN_READ_BYTES, AcquireReadSize
from shoal.protocol.record_batch import LOG_OVERHEAD, BatchHeader


def header(base_offset: int, offsets: int, size: int) -> BatchHeader:
    return BatchHeader(base_offset, size - LOG_OVERHEAD, 0, 2, 0, 0, offsets - 1, 0, 0, -1, -1, -1, offsets)


def test_the_first_read_is_a_partition_fetch_and_never_over_the_allowance() -> None:
    sizer = AcquireReadSize()
    assert sizer.bytes_for(500, 16 << 20) == FIRST_READ_BYTES
    assert sizer.bytes_for(500, 1000) == 1000
    assert sizer.bytes_for(500, 0) == 1  # a zero allowance still reads one batch, as a fetch does


def test_few_records_wanted_read_far_less_than_the_allowance() -> None:
    sizer = AcquireReadSize()
    sizer.observe([header(0, 150, 16_384), header(150, 150, 16_384)])  # ~110 bytes per record
    assert MIN_READ_BYTES <= sizer.bytes_for(500, 16 << 20) < 1 << 20
    assert sizer.bytes_for(1_000_000, 16 << 20) == 16 << 20


@given(
    batches=st.lists(st.tuples(st.integers(1, 10_000), st.integers(LOG_OVERHEAD + 8, 2 << 20)), min_size=1, max_size=20),
    max_records=st.integers(1, 2_000_000),
    max_bytes=st.integers(0, 64 << 20),
)
def test_a_read_covers_the_wanted_offsets_at_the_observed_density(
    batches: list[tuple[int, int]], max_records: int, max_bytes: int
) -> None:
    sizer = AcquireReadSize()
    headers, base = [], 0
    for offsets, size in batches:
        headers.append(header(base, offsets, size))
        base += offsets
    sizer.observe(headers)
    read = sizer.bytes_for(max_records, max_bytes)
    assert 1 <= read <= max(1, max_bytes)
    if max_bytes >= 1:
        density = sum(size for _, size in batches) / base  # bytes per offset
        assert read >= min(max_bytes, MIN_READ_BYTES)
        assert read >= min(max_bytes, int(max_records * density))


def test_an_empty_read_teaches_nothing() -> None:
    sizer = AcquireReadSize()
    sizer.observe([])
    assert sizer.bytes_per_offset is None
