"""Request framing and decoding without a socket (broker/network/framing.py)."""

from __future__ import annotations

from typing import Any

from shoal.broker.network.framing import (
    Decoded,
    Rejected,
    RequestHead,
    decode_body,
    decode_header,
)
from shoal.broker.network.request_channel import Api
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey


def _apis() -> dict[int, Api]:
    def handler(ctx: Any, body: Any) -> None:
        return None

    metadata = Api(ApiKey.METADATA, "Metadata", 0, 12, handler, False)
    api_versions = Api(ApiKey.API_VERSIONS, "ApiVersions", 0, 4, handler, False)
    return {metadata.key: metadata, api_versions.key: api_versions}


def _request(api_key: int, version: int, body: Any) -> bytes:
    return bytes(messages.encode_request(body, api_key, version, 7, "test-client"))


def test_a_request_is_routed_with_its_header_and_decoded_body() -> None:
    frame = _request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None))
    head = decode_header(frame)
    assert isinstance(head, RequestHead)
    assert (head.header.api_key, head.header.api_version, head.header.correlation_id) == (ApiKey.METADATA, 12, 7)
    decoded = decode_body(frame, head, _apis())
    assert isinstance(decoded, Decoded)
    assert decoded.api.name == "Metadata"
    assert decoded.body.topics is None


def test_an_unknown_api_key_and_a_truncated_header_close_the_connection() -> None:
    unknown = (9999).to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") + b"\xff\xff"
    for frame in (unknown, b"\x00\x03"):
        rejected = decode_header(frame)
        assert isinstance(rejected, Rejected)
        assert not rejected.answer_api_versions
        assert rejected.metric_label is None


def test_a_version_this_broker_does_not_serve_is_counted_and_closes() -> None:
    frame = _request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None))
    head = decode_header(frame)
    assert isinstance(head, RequestHead)
    apis = _apis()
    apis[ApiKey.METADATA] = Api(ApiKey.METADATA, "Metadata", 0, 11, apis[ApiKey.METADATA].handler, False)
    rejected = decode_body(frame, head, apis)
    assert isinstance(rejected, Rejected)
    assert rejected.metric_label == str(int(ApiKey.METADATA))
    assert not rejected.answer_api_versions


def test_an_unknown_api_versions_version_is_answered_not_closed() -> None:
    frame = _request(ApiKey.API_VERSIONS, 4, messages.ApiVersionsRequest(
        client_software_name="x", client_software_version="1"))
    head = decode_header(frame)
    assert isinstance(head, RequestHead)
    apis = _apis()
    apis[ApiKey.API_VERSIONS] = Api(ApiKey.API_VERSIONS, "ApiVersions", 0, 3, apis[ApiKey.METADATA].handler, False)
    rejected = decode_body(frame, head, apis)
    assert isinstance(rejected, Rejected) and rejected.answer_api_versions


def test_a_malformed_body_is_counted_under_its_api_and_closes() -> None:
    frame = _request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None))
    head = decode_header(frame)
    assert isinstance(head, RequestHead)
    rejected = decode_body(frame[: head.body_pos], head, _apis())
    assert isinstance(rejected, Rejected)
    assert rejected.metric_label == "Metadata"


def test_a_produce_request_keeps_its_records_as_a_writable_view_into_its_frame() -> None:
    # The partition patches base offsets into the records in place: they must be the frame's own bytes.
    records = bytes(range(200))
    body = messages.ProduceRequest(acks=1, timeout_ms=1000, topic_data=[
        messages.ProduceRequest.TopicProduceData(name="t", partition_data=[
            messages.ProduceRequest.PartitionProduceData(index=0, records=records)])])
    frame = bytearray(_request(ApiKey.PRODUCE, 9, body))
    at = frame.find(records)
    head = decode_header(frame)
    assert isinstance(head, RequestHead)
    produce = Api(ApiKey.PRODUCE, "Produce", 3, 13, lambda ctx, body: None, False)
    decoded = decode_body(frame, head, {produce.key: produce})
    assert isinstance(decoded, Decoded)
    view = decoded.body.topic_data[0].partition_data[0].records
    assert isinstance(view, memoryview) and not view.readonly and view == records
    view[0] = 0xFF
    assert frame[at] == 0xFF
