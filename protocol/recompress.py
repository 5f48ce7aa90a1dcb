"""Rewriting a v2 batch in another codec, as Kafka's log validator does for a topic whose compression.type
is not `producer`: the records stay the producer's bytes, only their wrapping changes."""

from __future__ import annotations

import struct

from .compression import NONE, compress, decompress
from .record_batch import (
    ATTRIBUTES_POS,
    COMPRESSION_MASK,
    CRC_POS,
    HEADER_SIZE,
    LENGTH_POS,
    LOG_OVERHEAD,
    BatchHeader,
    compute_crc,
)


def recompress_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, codec: int,
                     level: int | None = None) -> bytearray:
    """The batch at `pos` with its records in `codec` (NONE: uncompressed), every other header field kept
    (producer id, epoch, sequence, transactional flag, timestamps) and the CRC recomputed."""
    view = memoryview(buf)
    payload = view[pos + HEADER_SIZE : pos + header.size]
    raw = decompress(header.compression, payload) if header.compression != NONE else payload
    packed = compress(codec, raw, level) if codec != NONE else bytes(raw)
    out = bytearray(view[pos : pos + HEADER_SIZE])
    out += packed
    attributes = (header.attributes & ~COMPRESSION_MASK) | codec
    struct.pack_into(">i", out, LENGTH_POS, len(out) - LOG_OVERHEAD)
    struct.pack_into(">h", out, ATTRIBUTES_POS, attributes)
    struct.pack_into(">I", out, CRC_POS, compute_crc(out, 0, len(out)))
    return out
