"""Responses encoded as parts (large record sets spliced in, not copied) carry exactly the bytes of the
one-buffer encoding, for every response that holds records, at every version."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase, SplicedBuffer
from shoal.protocol.records import RecordInput, encode_batch
from tests.unit.strategies import message_strategy


def _has_records(spec: messages.MessageCodec) -> bool:
    return any(f.type == "records" for s in [spec.spec.root, *spec.spec.structs.values()] for f in s.fields)


WITH_RECORDS = [
    (name, v) for name, codec in sorted(messages.CODECS.items())
    if codec.spec.type == "response" and _has_records(codec) for v in codec.spec.versions
]


@pytest.fixture
def splice_everything() -> Iterator[None]:
    """Splice record sets of any size, so generated messages (small records) take the spliced path."""
    saved = SplicedBuffer.SPLICE_MIN
    SplicedBuffer.SPLICE_MIN = 1
    try:
        yield
    finally:
        SplicedBuffer.SPLICE_MIN = saved


def test_fetch_and_share_fetch_hold_records() -> None:
    assert {name for name, _v in WITH_RECORDS} >= {"FetchResponse", "ShareFetchResponse"}


@pytest.mark.parametrize(("name", "version"), WITH_RECORDS, ids=[f"{n}-v{v}" for n, v in WITH_RECORDS])
def test_parts_join_to_the_single_buffer_encoding(name: str, version: int, splice_everything: None) -> None:
    codec = messages.CODECS[name]
    api_key = codec.spec.api_key
    assert api_key is not None

    @settings(max_examples=15, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(message_strategy(codec, version))
    def check(obj: MessageBase) -> None:
        parts = messages.encode_response_parts(obj, api_key, version, 77)
        assert b"".join(parts) == messages.encode_response(obj, api_key, version, 77)

    check()


def test_a_large_fetch_response_is_written_without_copying_its_records() -> None:
    batch = encode_batch([RecordInput(None, bytes(1000), (), 1) for _ in range(200)])  # about 200 KB
    small = encode_batch([RecordInput(b"k", b"v", (), 1)])
    response = messages.FetchResponse(error_code=0, session_id=0, responses=[
        messages.FetchResponse.FetchableTopicResponse(topic="t", topic_id=bytes(16), partitions=[
            messages.FetchResponse.PartitionData(partition_index=i, high_watermark=9, last_stable_offset=9,
                                                 log_start_offset=0, preferred_read_replica=-1, records=records)
            for i, records in enumerate([batch, small, batch])
        ])
    ])
    parts = messages.encode_response_parts(response, ApiKey.FETCH, 16, 5)
    assert b"".join(parts) == messages.encode_response(response, ApiKey.FETCH, 16, 5)
    # The two large record sets are the very objects handed in; the small one was copied into the buffer.
    assert sum(part is batch for part in parts) == 2
    assert not any(part is small for part in parts)
    assert int.from_bytes(b"".join(parts)[:4], "big") == sum(len(p) for p in parts) - 4
