"""Record-batch compression codecs, by the id stored in the low 3 bits of a v2 batch's attributes.

Compressed batches wrap the concatenated records (everything after the 61-byte header) in one
codec stream. Writers stay close to what the Java producer emits so every client can read us;
readers are lenient about the framing variants that real producers write.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES: dict[int, str] = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_CODEC_IDS: dict[str, int] = {name: codec for codec, name in CODEC_NAMES.items()}

# Levels the Java producer uses by default (KIP-390): gzip = Deflater default, zstd = 3.
GZIP_LEVEL = 6
ZSTD_LEVEL = 3

# xerial snappy-java stream framing, which the Java producer and librdkafka write:
# 8-byte magic, int32 version, int32 min-compatible version, then [int32 length][raw block] chunks.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_HEADER_SIZE = 16
# snappy-java's default block size; each chunk is compressed independently.
_XERIAL_BLOCK_SIZE = 32 * 1024
_INT32 = struct.Struct(">i")


class CompressionError(ValueError):
    """Compressed data that the codec cannot decode (garbled or truncated)."""


class UnsupportedCompression(CompressionError):
    """A codec id outside 0-4."""


def codec_name(codec: int) -> str:
    try:
        return CODEC_NAMES[codec]
    except KeyError:
        raise UnsupportedCompression(f"unknown compression codec id {codec}") from None


def codec_from_name(name: str) -> int:
    """Map a `compression.type` value ("gzip", "zstd", ...) to its codec id."""
    try:
        return _CODEC_IDS[name.lower()]
    except KeyError:
        raise UnsupportedCompression(f"unknown compression type {name!r}") from None


# lz4's frame format takes high-compression levels up to 16; Kafka allows 17 (the same as 16 in lz4-java).
_LZ4_MAX_LEVEL = 16


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """`data` in one codec stream; `level` (a topic's compression.<codec>.level) or the producer default."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        # wbits=31 writes a gzip member with mtime 0, which is what GZIPInputStream expects.
        return zlib.compress(data, GZIP_LEVEL if level is None else level, wbits=31)
    if codec == SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == LZ4:
        # Kafka's LZ4 reader (KIP-57) needs independent blocks; no content size keeps pre-0.10 readers happy too.
        compressed: bytes = lz4.frame.compress(  # lz4 ships no type information
            data,
            compression_level=0 if level is None else min(level, _LZ4_MAX_LEVEL),
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
        return compressed
    if codec == ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL if level is None else level).compress(data)
    raise UnsupportedCompression(f"unknown compression codec id {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Inverse of `compress`; raise CompressionError on garbage and UnsupportedCompression on unknown ids."""
    if codec == NONE:
        return bytes(data)
    try:
        if codec == GZIP:
            # gzip.decompress also reads multi-member streams, which GZIPInputStream accepts.
            return gzip.decompress(data)
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            return _lz4_decompress(data)
        if codec == ZSTD:
            return _zstd_decompress(data)
    except CompressionError:
        raise
    except (
        OSError,
        EOFError,
        zlib.error,
        RuntimeError,
        ValueError,
        zstandard.ZstdError,
        cramjam.DecompressionError,
    ) as exc:
        raise CompressionError(f"cannot decompress {CODEC_NAMES[codec]} data: {exc}") from exc
    raise UnsupportedCompression(f"unknown compression codec id {codec}")


def _snappy_xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    pack = _INT32.pack
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    # Only the 8-byte magic is checked: some producers write version/compat little-endian.
    if len(view) < _XERIAL_HEADER_SIZE or view[:8] != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    parts: list[bytes] = []
    pos = _XERIAL_HEADER_SIZE
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CompressionError("truncated xerial snappy chunk length")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CompressionError(f"xerial snappy chunk of {length} bytes overruns the stream")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + length])))
        pos += length
    return b"".join(parts)


def _lz4_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    out, used = lz4.frame.decompress(view, return_bytes_read=True)
    if used == len(view):
        return bytes(out)
    # Concatenated frames: keep reading until the input is consumed.
    parts = [out]
    pos = used
    while pos < len(view):
        chunk, used = lz4.frame.decompress(view[pos:], return_bytes_read=True)
        if used == 0:
            raise CompressionError("lz4 frame made no progress")
        parts.append(chunk)
        pos += used
    return b"".join(parts)


def _zstd_decompress(data: bytes | bytearray | memoryview) -> bytes:
    # The Java producer streams zstd, so frames usually lack a content size: decode with a streaming
    # object per frame (one-shot decompress() refuses such frames).
    dctx = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    remaining: bytes | memoryview = memoryview(data)
    while len(remaining):
        dobj = dctx.decompressobj()
        parts.append(dobj.decompress(remaining))
        if not dobj.eof:
            raise CompressionError("truncated zstd frame")
        remaining = dobj.unused_data
    return b"".join(parts)
