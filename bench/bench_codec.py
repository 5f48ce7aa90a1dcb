"""Encode/decode cost of the generated message codec for a few hot messages at realistic sizes.

Record batches are opaque bytes to the message codec, so their size only costs a copy; what matters is the
number of structs and fields. Prints µs per message; asserts nothing.

Run: python bench/bench_codec.py [rounds]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from shoal.protocol import messages as m


def _measure(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm-up, also compiles the codec for this version
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def produce_request() -> Any:
    # A batching producer: 4 topics x 3 partitions, one 16 KiB batch each.
    P = m.ProduceRequest
    return P(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            P.TopicProduceData(
                name=f"orders-{t}",
                partition_data=[
                    P.PartitionProduceData(index=p, records=os.urandom(16_384)) for p in range(3)
                ],
            )
            for t in range(4)
        ],
    )


def fetch_response() -> Any:
    # A consumer fetching 2 topics x 8 partitions with 64 KiB of records per partition.
    F = m.FetchResponse
    return F(
        session_id=12345,
        responses=[
            F.FetchableTopicResponse(
                topic_id=os.urandom(16),
                partitions=[
                    F.PartitionData(
                        partition_index=p,
                        high_watermark=1_000_000 + p,
                        last_stable_offset=1_000_000 + p,
                        log_start_offset=0,
                        records=os.urandom(65_536),
                    )
                    for p in range(8)
                ],
            )
            for _ in range(2)
        ],
    )


def share_fetch_request() -> Any:
    # A share consumer on 2 topics x 6 partitions, acknowledging 3 batches per partition.
    S = m.ShareFetchRequest
    return S(
        group_id="share-group-1",
        member_id="Xk2p9cVfT0m2m1J8vVQ3nA",
        share_session_epoch=7,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        max_records=500,
        batch_size=500,
        topics=[
            S.FetchTopic(
                topic_id=os.urandom(16),
                partitions=[
                    S.FetchPartition(
                        partition_index=p,
                        acknowledgement_batches=[
                            S.AcknowledgementBatch(
                                first_offset=b * 100, last_offset=b * 100 + 99, acknowledge_types=[1]
                            )
                            for b in range(3)
                        ],
                    )
                    for p in range(6)
                ],
            )
            for _ in range(2)
        ],
    )


def metadata_response() -> Any:
    # A 3-broker cluster answering for 20 topics x 6 partitions, replication factor 3.
    M = m.MetadataResponse
    return M(
        brokers=[
            M.MetadataResponseBroker(node_id=i, host=f"broker-{i}.internal", port=9092, rack=f"az{i}")
            for i in range(3)
        ],
        cluster_id="4L6g3nShT-eMCtK--X86sw",
        controller_id=1,
        topics=[
            M.MetadataResponseTopic(
                name=f"topic-{t}",
                topic_id=os.urandom(16),
                partitions=[
                    M.MetadataResponsePartition(
                        partition_index=p,
                        leader_id=p % 3,
                        leader_epoch=4,
                        replica_nodes=[p % 3, (p + 1) % 3, (p + 2) % 3],
                        isr_nodes=[p % 3, (p + 1) % 3, (p + 2) % 3],
                    )
                    for p in range(6)
                ],
            )
            for t in range(20)
        ],
    )


CASES: list[tuple[str, int, Callable[[], Any]]] = [
    ("ProduceRequest", 9, produce_request),
    ("FetchResponse", 12, fetch_response),
    ("ShareFetchRequest", 1, share_fetch_request),
    ("MetadataResponse", 12, metadata_response),
]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"{'message':<24} {'bytes':>8} {'encode µs':>10} {'decode µs':>10}")
    for name, version, build in CASES:
        codec = m.CODECS[name]
        obj = build()
        data = bytes(codec.encode(obj, version))
        enc = _measure(partial(codec.encode, obj, version), rounds)
        dec = _measure(partial(codec.decode, data, version), rounds)
        print(f"{name + ' v' + str(version):<24} {len(data):>8} {enc:>10.1f} {dec:>10.1f}")


if __name__ == "__main__":
    main()
