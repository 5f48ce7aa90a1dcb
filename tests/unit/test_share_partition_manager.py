"""The share-partition manager's pure parts: the checks acknowledgement batches pass before they touch a
share partition, and the per-type counts the acknowledgement meter gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share.share_partition import AckBatch
from shoal.broker.share.share_partition_manager import (
    AckRules,
    count_ack_types,
    join_batches,
    validate_ack_batches,
)
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.record_batch import HEADER_SIZE, set_base_offset

from .test_partition_log import make_batch

GAP, ACCEPT, RELEASE, REJECT, RENEW = (AcknowledgeType.GAP, AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                       AcknowledgeType.REJECT, AcknowledgeType.RENEW)
V1 = AckRules(max_type=REJECT, is_renew=False)
V2 = AckRules(max_type=RENEW, is_renew=False)
V2_RENEW = AckRules(max_type=RENEW, is_renew=True)


@pytest.mark.parametrize(("batches", "rules", "ok"), [
    ([], V1, True),
    ([AckBatch(0, 4, [ACCEPT])], V1, True),
    ([AckBatch(0, 2, [ACCEPT, GAP, REJECT])], V1, True),
    ([AckBatch(5, 4, [ACCEPT])], V1, False),  # first after last
    ([AckBatch(0, 4, [ACCEPT]), AckBatch(3, 6, [ACCEPT])], V1, False),  # overlaps the previous batch
    ([AckBatch(0, 4, [ACCEPT]), AckBatch(4, 6, [ACCEPT])], V1, True),  # starts where the previous one ended
    ([AckBatch(0, 4, [])], V1, False),  # no type
    ([AckBatch(0, 4, [ACCEPT, ACCEPT])], V1, False),  # neither one type nor one per offset
    ([AckBatch(0, 0, [-1])], V1, False),
    ([AckBatch(0, 0, [RENEW])], V1, False),  # RENEW is not a type before version 2
    ([AckBatch(0, 0, [RENEW])], V2, False),  # only a renew-only request may RENEW
    ([AckBatch(0, 0, [RENEW])], V2_RENEW, True),
    ([AckBatch(0, 0, [5])], V2_RENEW, False),
])
def test_acknowledgement_batch_checks(batches: list[AckBatch], rules: AckRules, ok: bool) -> None:
    assert validate_ack_batches(batches, rules) is ok


types = st.sampled_from([GAP, ACCEPT, RELEASE, REJECT])


@st.composite
def ack_batches(draw: st.DrawFn) -> list[AckBatch]:
    out: list[AckBatch] = []
    offset = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(0, 6))):
        first = offset + draw(st.integers(0, 5))
        last = first + draw(st.integers(0, 8))
        per_offset = draw(st.booleans())
        ack_types = draw(st.lists(types, min_size=last - first + 1, max_size=last - first + 1)) if per_offset \
            else [draw(types)]
        out.append(AckBatch(first, last, ack_types))
        offset = last + 1
    return out


@given(ack_batches())
def test_counts_cover_every_acknowledged_offset_once(batches: list[AckBatch]) -> None:
    assert validate_ack_batches(batches, V1)
    counted = count_ack_types(batches)
    assert sum(counted.values()) == sum(b.last_offset - b.first_offset + 1 for b in batches)
    assert all(n > 0 for n in counted.values())
    for t in (GAP, ACCEPT, RELEASE, REJECT):
        expected = sum((b.last_offset - b.first_offset + 1) if len(b.ack_types) == 1 and b.ack_types[0] == t
                       else (b.ack_types.count(t) if len(b.ack_types) > 1 else 0) for b in batches)
        assert counted.get(t, 0) == expected


def stored_batches(sizes: list[int]) -> list[bytes]:
    """Batches of `sizes` records each, at consecutive offsets from 0, as a log stores them."""
    out, offset = [], 0
    for n in sizes:
        batch = bytearray(make_batch([b"v%d" % i for i in range(n)]))
        set_base_offset(batch, 0, offset)
        out.append(bytes(batch))
        offset += n
    return out


@given(st.lists(st.integers(1, 5), min_size=1, max_size=8).flatmap(
    lambda sizes: st.tuples(st.just(sizes), st.integers(0, len(sizes)), st.integers(0, len(sizes)),
                            st.booleans())))
def test_join_batches_hands_each_batch_out_once(case: tuple[list[int], int, int, bool]) -> None:
    # A first pass took batches [0, j); the next pass starts at batch i <= j: batch i..j-1 are held by both
    # when the first stopped inside one (at the in-flight limit).
    sizes, i, j, headers_only = case
    i = min(i, j)
    batches = stored_batches(sizes)
    if headers_only:
        batches = [b[:HEADER_SIZE] for b in batches]
    assert join_batches(b"".join(batches[:j]), b"".join(batches[i:]), headers_only=headers_only) == b"".join(batches)
