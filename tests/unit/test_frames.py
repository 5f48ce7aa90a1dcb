"""FrameReader: whatever sizes the stream arrives in, the frames come out whole, in order, once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.protocol.frames import FrameReader, FrameSizeError


def _stream(frames: list[bytes]) -> bytes:
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)


def _feed(reader: FrameReader, data: bytes, chunks: list[int]) -> list[bytes]:
    """Deliver `data` as a BufferedProtocol would: each time at most what get_buffer offers, sized by
    the next entry of `chunks` (cycled)."""
    out: list[bytes] = []
    pos = i = 0
    while pos < len(data):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), chunks[i % len(chunks)], len(data) - pos)
        i += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        out.extend(bytes(f) for f in reader.buffer_updated(n))
    return out


frame_lists = st.lists(st.binary(max_size=300), max_size=20)


@given(frames=frame_lists, chunks=st.lists(st.integers(1, 400), min_size=1, max_size=8),
       scratch=st.sampled_from([8, 64, 256, 4096]))
def test_frames_come_out_whole_and_in_order(frames: list[bytes], chunks: list[int], scratch: int) -> None:
    # Small scratch buffers make most frames "large" (received into their own buffer); big ones keep
    # several small frames in one receive.
    reader = FrameReader(1 << 20, scratch_size=scratch)
    assert _feed(reader, _stream(frames), chunks) == frames


def test_a_large_frame_is_received_into_its_own_buffer() -> None:
    reader = FrameReader(1 << 20, scratch_size=64)
    payload = bytes(range(256)) * 10
    data = _stream([b"tiny", payload, b"after"])
    buf = reader.get_buffer()
    buf[:40] = data[:40]
    assert reader.buffer_updated(40) == [b"tiny"]
    rest = reader.get_buffer()
    # The rest of the large frame goes straight into the buffer the decoder will get.
    assert len(rest) == len(payload) - (40 - 8 - 4)
    rest[:] = data[40 : 40 + len(rest)]
    (frame,) = reader.buffer_updated(len(rest))
    assert isinstance(frame, bytearray) and frame == payload
    assert _feed(reader, data[40 + len(rest) :], [100]) == [b"after"]


@pytest.mark.parametrize("size", [-1, (1 << 20) + 1])
def test_a_bad_size_prefix_is_an_error(size: int) -> None:
    reader = FrameReader(1 << 20, scratch_size=64)
    buf = reader.get_buffer()
    buf[:4] = size.to_bytes(4, "big", signed=True)
    with pytest.raises(FrameSizeError):
        reader.buffer_updated(4)


@given(frames=frame_lists, chunks=st.lists(st.integers(1, 400), min_size=1, max_size=8),
       scratch=st.sampled_from([8, 64, 4096]))
def test_bytes_fed_from_elsewhere_come_out_as_the_same_frames(frames: list[bytes], chunks: list[int],
                                                              scratch: int) -> None:
    # What a TLS connection does with each decrypted piece: whatever its size, the frames are the same.
    reader = FrameReader(1 << 20, scratch_size=scratch)
    data = _stream(frames)
    out: list[bytes] = []
    pos = i = 0
    while pos < len(data):
        n = chunks[i % len(chunks)]
        i += 1
        out.extend(bytes(f) for f in reader.feed(data[pos : pos + n]))
        pos += n
    assert out == frames


@pytest.mark.parametrize("fed", [False, True], ids=["received", "fed"])
def test_frames_before_a_bad_size_prefix_come_with_the_error(fed: bool) -> None:
    # A server answers the requests that came whole before it closes over the bad one.
    reader = FrameReader(1 << 20, scratch_size=64)
    data = _stream([b"one", b"two"]) + (-1).to_bytes(4, "big", signed=True)
    with pytest.raises(FrameSizeError) as exc:
        if fed:
            reader.feed(data)
        else:
            buf = reader.get_buffer()
            buf[: len(data)] = data
            reader.buffer_updated(len(data))
    assert exc.value.size == -1
    assert [bytes(f) for f in exc.value.frames] == [b"one", b"two"]
