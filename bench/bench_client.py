"""Throughput of Shoal's bundled client against a Shoal broker process on loopback.

Produce: N records (100-byte values by default) with AsyncProducer (acks=all, idempotent, linger 5 ms) and
wait for every ack. Share-consume: one AsyncShareConsumer in implicit mode reads them all (acks ride on the
next ShareFetch). Prints records/s for each, plus the consumer's KIP-932 metrics that explain the figure.

Usage: python bench/bench_client.py [--records 200000] [--value-bytes 100] [--partitions 3]
                                    [--compression none] [--bootstrap host:port (use a running broker)]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid

from peers import start_shoal

from shoal.client import RESOURCE_GROUP, AsyncAdmin, AsyncProducer, AsyncShareConsumer, NewTopic


async def produce(bootstrap: str, topic: str, records: int, value: bytes, compression: str) -> float:
    async with AsyncProducer(bootstrap, compression=compression, linger_ms=5, batch_size=65536) as producer:
        start = time.perf_counter()
        futures = [await producer.send(topic, value) for _ in range(records)]
        await asyncio.gather(*futures)
        return time.perf_counter() - start


async def share_consume(bootstrap: str, topic: str, group: str, records: int) -> tuple[float, dict[str, float]]:
    consumer = AsyncShareConsumer(bootstrap, group, max_poll_records=2000)
    await consumer.subscribe([topic])
    got = 0
    start: float | None = None
    deadline = time.monotonic() + 300
    while got < records and time.monotonic() < deadline:
        batch = await consumer.poll(1.0)
        if batch and start is None:
            start = time.perf_counter()  # from the first delivery: joining the group is not throughput
        got += len(batch)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    await consumer.commit_sync()
    metrics = consumer.metrics()
    await consumer.close()
    if got < records:
        raise RuntimeError(f"consumed only {got} of {records}")
    return elapsed, metrics


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()

    proc = None
    if args.bootstrap is None:
        fast_heartbeat = ["group.share.min.heartbeat.interval.ms=500", "group.share.heartbeat.interval.ms=500"]
        proc, bootstrap = start_shoal(tempfile.mkdtemp(prefix="shoal-bench-client-"), fast_heartbeat)
    else:
        bootstrap = args.bootstrap
    try:
        topic = f"bench-client-{uuid.uuid4().hex[:8]}"
        group = f"{topic}-g"
        async with AsyncAdmin(bootstrap) as admin:
            await admin.create_topics([NewTopic(topic, args.partitions)])
            await admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"})
        value = b"x" * args.value_bytes
        seconds = await produce(bootstrap, topic, args.records, value, args.compression)
        print(f"produce       {args.records} records x {args.value_bytes} B, {args.partitions} partitions, "
              f"{args.compression}: {args.records / seconds:,.0f} records/s "
              f"({args.records * args.value_bytes / seconds / 1e6:.1f} MB/s)")
        seconds, metrics = await share_consume(bootstrap, topic, group, args.records)
        print(f"share-consume {args.records} records (implicit acks): {args.records / seconds:,.0f} records/s")
        keys = ("fetch-total", "fetch-latency-avg", "records-per-request-avg", "acknowledgements-send-total")
        print("  " + ", ".join(f"{k}={metrics[k]:,.1f}" for k in keys))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
