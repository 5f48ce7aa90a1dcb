"""Encode/decode throughput of v2 record batches per codec, for 100-byte values.

Run: python bench/bench_records.py [records_per_batch] [batches]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from shoal.protocol import compression
from shoal.protocol.records import RecordInput, decode_batch, encode_batch


def _measure(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return time.perf_counter() - start


def main() -> None:
    per_batch = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    # Half random, half repeated bytes: compressible, but not trivially so.
    values = [os.urandom(50) + b"v" * 50 for _ in range(per_batch)]
    records = [RecordInput(b"key-%d" % i, values[i], (), 1_700_000_000_000 + i) for i in range(per_batch)]
    payload_bytes = sum(len(r.key or b"") + len(r.value or b"") for r in records) * batches
    total = per_batch * batches
    print(f"{per_batch} records/batch x {batches} batches, 100-byte values")
    print(f"{'codec':8} {'batch B':>9} {'enc rec/s':>12} {'enc MB/s':>9} {'dec rec/s':>12} {'dec MB/s':>9}")
    for codec in (compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD):
        encoded = encode_batch(records, compression=codec)
        enc = _measure(lambda: encode_batch(records, compression=codec), batches)  # noqa: B023
        dec = _measure(lambda: decode_batch(encoded), batches)  # noqa: B023
        print(
            f"{compression.codec_name(codec):8} {len(encoded):>9} {total / enc:>12,.0f} "
            f"{payload_bytes / enc / 1e6:>9.1f} {total / dec:>12,.0f} {payload_bytes / dec / 1e6:>9.1f}"
        )


if __name__ == "__main__":
    main()
