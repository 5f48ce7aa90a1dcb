"""Kafka request framing and decoding, without I/O.

A request is a 4-byte big-endian size and that many bytes, cut out of the stream by the connection's
`protocol.frames.FrameReader` (the bundled client's too: a large request is received straight into a
buffer of its own); `decode_header` and `decode_body` turn a frame into a routed request or say why the connection must be
closed (or, for an ApiVersions version we do not know, answered in v0 form, KIP-511). The connection
puts the SASL gate between the two steps, then dispatches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import DecodeError, MessageBase
from shoal.protocol.frames import FrameReader, FrameSizeError

if TYPE_CHECKING:
    from shoal.broker.network.request_channel import Api

__all__ = ["Decoded", "FrameReader", "FrameSizeError", "Rejected", "RequestHead", "decode_body", "decode_header"]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A frame the connection must not dispatch: log `reason`, count an error under `metric_label` (if
    any), then close, unless `answer_api_versions` asks for the ApiVersions v0 fallback instead."""

    reason: str
    log_fields: dict[str, Any] = field(default_factory=dict)
    metric_label: str | None = None
    answer_api_versions: bool = False


@dataclass(frozen=True, slots=True)
class RequestHead:
    header: messages.RequestHeader
    body_pos: int


@dataclass(frozen=True, slots=True)
class Decoded:
    header: messages.RequestHeader
    api: Api
    body: MessageBase


def decode_header(frame: bytes | bytearray) -> RequestHead | Rejected:
    try:
        header, pos = messages.decode_request_header(frame)
    except messages.UnknownApi as exc:
        return Rejected("unknown api key, closing connection", {"error": str(exc)})
    except DecodeError as exc:
        return Rejected("malformed request header, closing connection", {"error": str(exc)})
    return RequestHead(header, pos)


def decode_body(frame: bytes | bytearray, head: RequestHead, apis: Mapping[int, Api]) -> Decoded | Rejected:
    """Check the API and version against what this broker serves, then decode the body."""
    header = head.header
    api = apis.get(header.api_key)
    if api is None or not (api.min_version <= header.api_version <= api.max_version):
        if header.api_key == ApiKey.API_VERSIONS:
            return Rejected("unsupported ApiVersions version", answer_api_versions=True)
        return Rejected(
            "unsupported api or version, closing connection",
            {"api_key": header.api_key, "api_version": header.api_version},
            metric_label=str(header.api_key),
        )
    try:
        # Record sets (Produce) stay views into the frame: appended without a copy, patched in place.
        body, _ = messages.REQUESTS[header.api_key].decode(frame, header.api_version, head.body_pos,
                                                           view_records=True)
    except DecodeError as exc:
        return Rejected(
            "malformed request body, closing connection",
            {"api": api.name, "api_version": header.api_version, "error": str(exc)},
            metric_label=api.name,
        )
    return Decoded(header, api, body)
