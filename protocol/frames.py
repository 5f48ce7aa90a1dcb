"""Size-prefixed Kafka frames cut out of a byte stream, for a receiver that reads into buffers it is given
(asyncio's BufferedProtocol), without I/O.

A frame is a 4-byte big-endian size and that many bytes. Small frames arrive in one scratch buffer and
are copied out once. A frame larger than half the scratch buffer gets a buffer of its own as soon as its
size is known, and the rest of it is received straight into that buffer: a multi-megabyte Fetch response
(the bundled client) or Produce request (the broker) is not copied again on its way to the decoder.
"""

from __future__ import annotations

from typing import Any

DEFAULT_SCRATCH_SIZE = 256 * 1024


class FrameSizeError(Exception):
    """The size prefix is negative or above the limit."""

    def __init__(self, size: int, limit: int, frames: list[bytes | bytearray] | None = None):
        super().__init__(f"frame size {size} outside [0, {limit}]")
        self.size = size
        self.limit = limit
        # Whole frames that came before the bad prefix in the same bytes: a server still answers them.
        self.frames: list[bytes | bytearray] = frames or []


class FrameReader:
    """`get_buffer()` says where the next bytes go; after `n` bytes landed there, `buffer_updated(n)`
    returns the frames they completed (without size prefixes), in order."""

    def __init__(self, max_size: int, *, scratch_size: int = DEFAULT_SCRATCH_SIZE):
        self.max_size = max_size
        self._scratch = bytearray(scratch_size)
        self._view = memoryview(self._scratch)
        self._start = 0  # first byte not yet cut into a frame
        self._end = 0  # end of what was received
        self._large: bytearray | None = None  # a large frame being received into its own buffer
        self._large_view = memoryview(b"")
        self._filled = 0

    def get_buffer(self) -> memoryview:
        if self._large is not None:
            return self._large_view[self._filled :]
        if self._end == len(self._scratch):
            # Only the start of a small frame is left: move it to the front to make room for the rest.
            pending = bytes(self._view[self._start : self._end])
            self._view[: len(pending)] = pending
            self._start, self._end = 0, len(pending)
        return self._view[self._end :]

    def buffer_updated(self, n: int) -> list[bytes | bytearray]:
        """Raises FrameSizeError as soon as a bad size prefix is readable."""
        if self._large is not None:
            self._filled += n
            if self._filled < len(self._large):
                return []
            frame, self._large = self._large, None
            self._large_view.release()
            return [frame]
        self._end += n
        frames: list[bytes | bytearray] = []
        view = self._view
        while self._end - self._start >= 4:
            at = self._start
            size = int.from_bytes(view[at : at + 4], "big", signed=True)
            if size < 0 or size > self.max_size:
                raise FrameSizeError(size, self.max_size, frames)
            have = self._end - at - 4
            if have >= size:
                frames.append(bytes(view[at + 4 : at + 4 + size]))
                self._start = at + 4 + size
                continue
            if size > len(self._scratch) // 2:
                large = bytearray(size)
                large[:have] = view[at + 4 : self._end]
                self._large, self._large_view, self._filled = large, memoryview(large), have
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames

    def feed(self, data: Any) -> list[bytes | bytearray]:
        """Bytes that arrived elsewhere (decrypted TLS records): copied in as if received into
        `get_buffer()`; returns the frames they completed. Raises FrameSizeError as `buffer_updated` does,
        with every frame completed before the bad prefix in its `frames`."""
        frames: list[bytes | bytearray] = []
        with memoryview(data) as view:
            pos = 0
            while pos < len(view):
                target = self.get_buffer()
                n = min(len(target), len(view) - pos)
                target[:n] = view[pos : pos + n]
                pos += n
                try:
                    frames += self.buffer_updated(n)
                except FrameSizeError as exc:
                    raise FrameSizeError(exc.size, exc.limit, frames + exc.frames) from None
        return frames
