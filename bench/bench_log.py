"""Append throughput of PartitionLog: page-cache only, fsync per append, and group commit.

Usage: python bench/bench_log.py [--records 10] [--value-bytes 100] [--seconds 2]
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import crc32c

from shoal.broker.storage.partition_log import LogConfig, PartitionLog
from shoal.protocol.record_batch import iter_batches


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def build_batch(records: int, value_bytes: int) -> bytearray:
    """An uncompressed v2 batch of `records` keyless records (same shape a producer sends)."""
    body = bytearray()
    value = os.urandom(value_bytes)
    for i in range(records):
        rec = b"\x00" + _varint(i) + _varint(i) + _varint(-1) + _varint(len(value)) + value + _varint(0)
        body += _varint(len(rec)) + rec
    now = int(time.time() * 1000)
    tail = struct.pack(">hiqqqhii", 0, records - 1, now, now + records - 1, -1, -1, -1, records) + body
    return bytearray(struct.pack(">qiibI", 0, 9 + len(tail), -1, 2, crc32c.crc32c(tail)) + tail)


def report(label: str, batches: int, nbytes: int, elapsed: float, plog: PartitionLog) -> None:
    print(
        f"{label:<28} {batches / elapsed:>12,.0f} batches/s {nbytes / elapsed / 1e6:>9.1f} MB/s"
        f"   ({batches} batches, {plog.fsync_count} flush rounds, {len(plog.segments)} segments)"
    )


def bench_no_flush(directory: Path, batch: bytearray, seconds: float) -> None:
    plog = PartitionLog.open(directory, LogConfig(segment_bytes=64 << 20))
    headers = list(iter_batches(batch))
    start = time.perf_counter()
    n = 0
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(200):
            plog.append(batch, headers)  # offsets are re-patched in place on every append
        n += 200
    report("append, no flush", n, n * len(batch), elapsed, plog)
    plog.close()


async def bench_flush_each(directory: Path, batch: bytearray, seconds: float) -> None:
    plog = PartitionLog.open(directory, LogConfig(segment_bytes=64 << 20))
    headers = list(iter_batches(batch))
    start = time.perf_counter()
    n = 0
    while (elapsed := time.perf_counter() - start) < seconds:
        plog.append(batch, headers)
        await plog.flush()
        n += 1
    report("append + flush each", n, n * len(batch), elapsed, plog)
    plog.close()


async def bench_group_commit(directory: Path, batch: bytearray, seconds: float, producers: int) -> None:
    """`producers` concurrent produce requests, each waiting for its own fsync (acks=all style)."""
    plog = PartitionLog.open(directory, LogConfig(segment_bytes=64 << 20))
    headers = list(iter_batches(batch))
    deadline = time.perf_counter() + seconds
    count = 0

    async def producer() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            plog.append(batch, headers)
            await plog.flush()
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - start
    report(f"group commit x{producers}", count, count * len(batch), elapsed, plog)
    plog.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10, help="records per batch")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0, help="per scenario")
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    batch = build_batch(args.records, args.value_bytes)
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=args.dir))
    print(f"batch: {args.records} records x {args.value_bytes} B = {len(batch)} B; dir {root}")
    try:
        bench_no_flush(root / "no-flush", batch, args.seconds)
        asyncio.run(bench_flush_each(root / "flush-each", batch, args.seconds))
        asyncio.run(bench_group_commit(root / "group", batch, args.seconds, args.producers))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
