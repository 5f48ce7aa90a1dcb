"""`decode_request_header` reads the usual header directly; every header, usual or not, whole or cut short,
decodes to what the RequestHeader codec gives, and fails where it fails."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.protocol import messages
from shoal.protocol.codec import DecodeError

API_KEYS = sorted(messages.REQUESTS)


def by_codec(buf: bytes) -> tuple[messages.RequestHeader, int] | str:
    """The header as the RequestHeader codec decodes it (the reference), or the failure's kind."""
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", buf, 0)
    codec = messages.REQUESTS.get(api_key)
    if codec is None:
        return "unknown api"
    try:
        hdr, pos = messages.CODECS["RequestHeader"].decode(buf, 2 if codec.is_flexible(api_version) else 1)
    except DecodeError:
        return "malformed"
    return messages.RequestHeader(api_key, api_version, correlation_id, hdr.client_id), pos


def decoded(buf: bytes) -> tuple[messages.RequestHeader, int] | str:
    try:
        return messages.decode_request_header(buf)
    except messages.UnknownApi:
        return "unknown api"
    except DecodeError:
        return "malformed"


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    api_key = draw(st.sampled_from(API_KEYS) | st.integers(-(2**15), 2**15 - 1))
    api_version = draw(st.integers(-1, 20))
    buf = struct.pack(">hhi", api_key, api_version, draw(st.integers(-(2**31), 2**31 - 1)))
    client_id = draw(st.none() | st.text(max_size=12))
    if client_id is None:
        buf += struct.pack(">h", draw(st.sampled_from([-1, -2, -(2**15)])))
    else:
        raw = client_id.encode()
        if draw(st.booleans()):
            raw = draw(st.binary(max_size=12))  # maybe not UTF-8
        buf += struct.pack(">h", len(raw)) + raw
    # A v2 header's tagged fields (none, or some), then a body.
    tagged = draw(st.sampled_from([b"\x00", b"\x01\x00\x00", b"\x01\x05\x02ab", b"\x80", b""]))
    buf += tagged + draw(st.binary(max_size=6))
    cut = draw(st.integers(0, len(buf)))
    return buf if draw(st.booleans()) else buf[:cut]


@settings(max_examples=2000, deadline=None)
@given(headers())
def test_a_header_decodes_as_the_codec_decodes_it(buf: bytes) -> None:
    if len(buf) < 8:
        assert decoded(buf) == "malformed"
    else:
        assert decoded(buf) == by_codec(buf)


def test_a_client_id_decodes_the_same_from_its_cache() -> None:
    buf = messages.encode_request(messages.MetadataRequest(topics=None), 3, 12, 9, "cached-client")
    first, second = messages.decode_request_header(buf), messages.decode_request_header(bytes(buf))
    assert first == second == (messages.RequestHeader(3, 12, 9, "cached-client"), len(buf) - len(
        messages.REQUESTS[3].encode(messages.MetadataRequest(topics=None), 12)))
