"""The consumer-group assignors: every subscribed partition assigned exactly once to a subscriber, balance,
stickiness (uniform) and contiguous ranges (range)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.consumer_assignors import RangeAssignor, UniformAssignor, parse_assignors

TOPICS = [bytes([i]) * 16 for i in range(4)]


@st.composite
def groups(draw: st.DrawFn, homogeneous: bool = False) -> tuple[dict[str, frozenset[bytes]], dict[bytes, int]]:
    partitions = {tid: draw(st.integers(0, 12)) for tid in draw(st.sets(st.sampled_from(TOPICS), min_size=1))}
    members = draw(st.sets(st.text("abcdef", min_size=1, max_size=3), min_size=1, max_size=6))
    everything = frozenset(partitions) | {TOPICS[3]}  # a subscribed topic may not exist
    if homogeneous:
        return {m: everything for m in members}, partitions
    return {m: frozenset(draw(st.sets(st.sampled_from(sorted(everything))))) for m in members}, partitions


def check_complete(subs: dict[str, frozenset[bytes]], partitions: dict[bytes, int],
                   result: dict[str, dict[bytes, frozenset[int]]]) -> dict[str, int]:
    owners: dict[tuple[bytes, int], str] = {}
    for member, assignment in result.items():
        for tid, ps in assignment.items():
            assert tid in subs[member] and tid in partitions
            for p in ps:
                assert 0 <= p < partitions[tid]
                assert (tid, p) not in owners, "a partition is assigned twice"
                owners[(tid, p)] = member
    for tid, n in partitions.items():
        if any(tid in s for s in subs.values()):
            assert {p for (t, p) in owners if t == tid} == set(range(n)), "a partition is not assigned"
    return {m: sum(len(ps) for ps in result.get(m, {}).values()) for m in subs}


@settings(max_examples=150, deadline=None)
@given(groups(), st.data())
def test_uniform_assigns_each_partition_once_and_is_locally_balanced(
        group: tuple[dict[str, frozenset[bytes]], dict[bytes, int]], data: st.DataObject) -> None:
    subs, partitions = group
    # Any earlier assignment (even an invalid one) as the sticky starting point.
    current = {m: {tid: frozenset(data.draw(st.sets(st.integers(0, 14), max_size=5)))
                   for tid in data.draw(st.sets(st.sampled_from(TOPICS), max_size=2))} for m in subs}
    result = UniformAssignor().assign(subs, partitions, current)
    counts = check_complete(subs, partitions, result)
    # No partition could move to an eligible member with two or more fewer partitions.
    for member, assignment in result.items():
        for tid in assignment:
            for other in subs:
                if tid in subs[other]:
                    assert counts[member] - counts[other] < 2


@settings(max_examples=100, deadline=None)
@given(groups(homogeneous=True))
def test_uniform_homogeneous_is_balanced_and_sticky(group: tuple[dict[str, frozenset[bytes]], dict[bytes, int]]) -> None:
    subs, partitions = group
    first = UniformAssignor().assign(subs, partitions, {})
    counts = check_complete(subs, partitions, first)
    assert max(counts.values()) - min(counts.values()) <= 1
    # A member joins: the others keep everything they can (nothing moves between existing members).
    joined = dict(subs) | {"zzzz": next(iter(subs.values()))}
    second = UniformAssignor().assign(joined, partitions, first)
    check_complete(joined, partitions, second)
    for member in subs:
        for tid, ps in second[member].items():
            assert ps <= first[member].get(tid, frozenset())


@settings(max_examples=100, deadline=None)
@given(groups())
def test_range_gives_contiguous_balanced_ranges_per_topic(group: tuple[dict[str, frozenset[bytes]], dict[bytes, int]]) -> None:
    subs, partitions = group
    result = RangeAssignor().assign(subs, partitions, {})
    check_complete(subs, partitions, result)
    for tid in partitions:
        members = sorted(m for m in subs if tid in subs[m])
        sizes = [len(result[m].get(tid, ())) for m in members]
        if members:
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        for m in members:
            ps = sorted(result[m].get(tid, ()))
            assert ps == list(range(ps[0], ps[0] + len(ps))) if ps else True


def test_range_co_partitions_topics() -> None:
    subs = {"a": frozenset(TOPICS[:2]), "b": frozenset(TOPICS[:2])}
    result = RangeAssignor().assign(subs, {TOPICS[0]: 4, TOPICS[1]: 4}, {})
    assert result["a"] == {TOPICS[0]: frozenset({0, 1}), TOPICS[1]: frozenset({0, 1})}
    assert result["b"] == {TOPICS[0]: frozenset({2, 3}), TOPICS[1]: frozenset({2, 3})}


def test_parse_assignors_accepts_names_and_kafka_class_names() -> None:
    names = [a.name for a in parse_assignors(
        "org.apache.kafka.coordinator.group.assignor.RangeAssignor, uniform")]
    assert names == ["range", "uniform"]
    with pytest.raises(ValueError, match="sticky"):
        parse_assignors("sticky")
