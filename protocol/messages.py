"""The registry of Kafka messages built from the JSON specs at import time, and request/response framing.

`REQUESTS[api_key]` / `RESPONSES[api_key]` give a `MessageCodec`; `messages.ProduceRequest` etc. are the
typed classes generated from the specs (`message_classes.py`), so handlers build responses as
`ProduceResponse(responses=[...])`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from . import message_classes
from .api_keys import ApiKey
from .codec import Buffer, DecodeError, MessageBase, MessageCodec, SplicedBuffer
from .message_classes import *  # noqa: F403 - the generated classes are this module's message names
from .schema import load_all

SPECS = load_all()


def _generated_class(name: str) -> type[MessageBase]:
    cls = getattr(message_classes, name, None)
    if not (isinstance(cls, type) and issubclass(cls, MessageBase)):
        raise RuntimeError(f"message_classes.py has no class for the spec {name}: run `make generate`")
    return cls


CODECS: dict[str, MessageCodec] = {name: MessageCodec(spec, _generated_class(name)) for name, spec in SPECS.items()}

REQUESTS: dict[int, MessageCodec] = {}
RESPONSES: dict[int, MessageCodec] = {}
for _codec in CODECS.values():
    if _codec.spec.type == "request" and _codec.spec.api_key is not None:
        REQUESTS[_codec.spec.api_key] = _codec
    elif _codec.spec.type == "response" and _codec.spec.api_key is not None:
        RESPONSES[_codec.spec.api_key] = _codec

API_NAMES: dict[int, str] = {k: c.spec.name.removesuffix("Request") for k, c in REQUESTS.items()}

_REQUEST_HEADER = CODECS["RequestHeader"]
_RESPONSE_HEADER = CODECS["ResponseHeader"]


def request_header_version(api_key: int, api_version: int) -> int:
    return 2 if REQUESTS[api_key].is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    # ApiVersions always answers with header v0 so a client can read it whatever version it tried (KIP-511).
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if RESPONSES[api_key].is_flexible(api_version) else 0


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class UnknownApi(DecodeError):
    """A request for an API key this build has no spec for."""


_HEADER_START = struct.Struct(">hhi")  # api key, api version, correlation id
_CLIENT_ID_LENGTH = struct.Struct(">h")
# Client ids seen, by their bytes: a connection sends the same one with every request.
_CLIENT_IDS: dict[bytes, str] = {}
_CLIENT_IDS_MAX = 4096
_CLIENT_ID_CACHED_LENGTH = 255
# Whether each (api key, version) has a flexible (v2) header.
_FLEXIBLE: dict[tuple[int, int], bool] = {}


def decode_request_header(buf: Buffer) -> tuple[RequestHeader, int]:
    """Parse the header far enough to route the request; returns the header and the body's position.

    The usual header (an ASCII client id, and for v2 no tagged fields) is read here directly; anything
    else goes through the header's codec, which gives the same result and the same errors."""
    if len(buf) < 8:
        raise DecodeError("request shorter than its header")
    api_key, api_version, correlation_id = _HEADER_START.unpack_from(buf, 0)
    flexible = _FLEXIBLE.get((api_key, api_version))
    if flexible is None:
        codec = REQUESTS.get(api_key)
        if codec is None:
            raise UnknownApi(f"unknown api key {api_key}")
        flexible = codec.is_flexible(api_version)
        if api_version in codec.spec.valid:
            _FLEXIBLE[(api_key, api_version)] = flexible  # versions that exist only: the map stays small
    if len(buf) >= 10:
        end = 10 + _CLIENT_ID_LENGTH.unpack_from(buf, 8)[0]
        # The client id and, in v2, the tagged-field count after it must be there (a null id goes the long way).
        if 10 <= end and (end < len(buf) if flexible else end <= len(buf)):
            raw = bytes(buf[10:end])
            client_id = _CLIENT_IDS.get(raw)
            if client_id is None and raw.isascii():
                client_id = raw.decode("ascii")
                if len(raw) <= _CLIENT_ID_CACHED_LENGTH and len(_CLIENT_IDS) < _CLIENT_IDS_MAX:
                    _CLIENT_IDS[raw] = client_id
            if client_id is not None:
                if not flexible:
                    return RequestHeader(api_key, api_version, correlation_id, client_id), end
                if buf[end] == 0:  # no tagged fields
                    return RequestHeader(api_key, api_version, correlation_id, client_id), end + 1
    hdr, pos = _REQUEST_HEADER.decode(buf, 2 if flexible else 1)
    return RequestHeader(api_key, api_version, correlation_id, hdr.client_id), pos


def decode_request(buf: Buffer) -> tuple[RequestHeader, Any]:
    header, pos = decode_request_header(buf)
    body, end = REQUESTS[header.api_key].decode(buf, header.api_version, pos)
    return header, body


def encode_request(body: MessageBase, api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytearray:
    hv = request_header_version(api_key, api_version)
    hdr = _REQUEST_HEADER.cls(
        request_api_key=api_key, request_api_version=api_version, correlation_id=correlation_id, client_id=client_id
    )
    out = _REQUEST_HEADER.encode(hdr, hv)
    return REQUESTS[api_key].encode(body, api_version, out)


def encode_response_parts(body: MessageBase, api_key: int, api_version: int, correlation_id: int) -> list[Buffer]:
    """The framed response as buffers to write in order: large record sets are not copied into it."""
    out = SplicedBuffer(b"\x00\x00\x00\x00")
    out += correlation_id.to_bytes(4, "big", signed=True)
    if response_header_version(api_key, api_version) >= 1:
        out.append(0)  # empty tagged-field buffer
    RESPONSES[api_key].encode(body, api_version, out)
    out[0:4] = (len(out) - 4 + out.spliced_bytes).to_bytes(4, "big")
    return out.parts()


class _SizingBuffer(SplicedBuffer):
    """Every record set is spliced: measuring a response copies none of its records."""

    SPLICE_MIN = 0


def response_size(body: MessageBase, api_key: int, api_version: int) -> int:
    """The size of the response as `encode_response_parts` frames it (size prefix and header included),
    its record sets counted but not copied. What a fetch quota records (Kafka's FetchResponse.sizeOf)."""
    out = _SizingBuffer(b"\x00" * 8)
    if response_header_version(api_key, api_version) >= 1:
        out.append(0)
    RESPONSES[api_key].encode(body, api_version, out)
    return len(out) + out.spliced_bytes


def encode_response(body: MessageBase, api_key: int, api_version: int, correlation_id: int, *, framed: bool = True) -> bytearray:
    """Response header + body, with the 4-byte size prefix when `framed`."""
    out = bytearray(b"\x00\x00\x00\x00") if framed else bytearray()
    out += correlation_id.to_bytes(4, "big", signed=True)
    if response_header_version(api_key, api_version) >= 1:
        out.append(0)  # empty tagged-field buffer
    RESPONSES[api_key].encode(body, api_version, out)
    if framed:
        out[0:4] = (len(out) - 4).to_bytes(4, "big")
    return out


def decode_response(buf: Buffer, api_key: int, api_version: int) -> tuple[int, Any]:
    correlation_id = int.from_bytes(buf[0:4], "big", signed=True)
    pos = 4
    if response_header_version(api_key, api_version) >= 1:
        _, pos = _RESPONSE_HEADER.decode(buf, 1)
    body, _ = RESPONSES[api_key].decode(buf, api_version, pos)
    return correlation_id, body
