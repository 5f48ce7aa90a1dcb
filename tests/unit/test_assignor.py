"""SimpleAssignor: balance, sharing, stickiness, subscriptions (homogeneous and heterogeneous)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.assignor import Assignment, SimpleAssignor

T1 = b"\x01" * 16
T2 = b"\x02" * 16
T3 = b"\x03" * 16


def counts(result: Assignment) -> dict[str, int]:
    return {m: sum(len(ps) for ps in topics.values()) for m, topics in result.items()}


def sharing(result: Assignment) -> Counter[tuple[bytes, int]]:
    c: Counter[tuple[bytes, int]] = Counter()
    for topics in result.values():
        for t, ps in topics.items():
            for p in ps:
                c[(t, p)] += 1
    return c


def test_empty_membership_gives_empty_assignment() -> None:
    assert SimpleAssignor().assign({}, {T1: [0, 1]}, {}) == {}


def test_one_member_gets_everything() -> None:
    result = SimpleAssignor().assign({"a": {T1}}, {T1: [0, 1, 2]}, {})
    assert result == {"a": {T1: {0, 1, 2}}}


def test_two_members_split_four_partitions() -> None:
    result = SimpleAssignor().assign({"a": {T1}, "b": {T1}}, {T1: [0, 1, 2, 3]}, {})
    assert counts(result) == {"a": 2, "b": 2}
    assert result["a"][T1].isdisjoint(result["b"][T1])


def test_more_members_than_partitions_share() -> None:
    members = {m: {T1} for m in "abcde"}
    result = SimpleAssignor().assign(members, {T1: [0, 1]}, {})
    # desired sharing = ceil(5/2) = 3 members per partition, everyone gets at least one
    assert all(c >= 1 for c in counts(result).values())
    assert sharing(result) == {(T1, 0): 3, (T1, 1): 3}


def test_no_assignable_partitions() -> None:
    result = SimpleAssignor().assign({"a": {T1}, "b": {T1}}, {}, {"a": {T1: {0}}})
    assert result == {"a": {}, "b": {}}


def test_sticky_when_member_joins() -> None:
    assignor = SimpleAssignor()
    first = assignor.assign({"a": {T1}, "b": {T1}}, {T1: list(range(6))}, {})
    second = assignor.assign({"a": {T1}, "b": {T1}, "c": {T1}}, {T1: list(range(6))}, first)
    assert counts(second) == {"a": 2, "b": 2, "c": 2}
    # the existing members only lose partitions, they never swap for others
    assert second["a"][T1] <= first["a"][T1]
    assert second["b"][T1] <= first["b"][T1]


def test_partitions_of_departed_member_are_redistributed() -> None:
    assignor = SimpleAssignor()
    first = assignor.assign({m: {T1} for m in "abc"}, {T1: list(range(6))}, {})
    second = assignor.assign({"a": {T1}, "b": {T1}}, {T1: list(range(6))}, first)
    assert counts(second) == {"a": 3, "b": 3}
    assert first["a"][T1] <= second["a"][T1]
    assert second["a"][T1] | second["b"][T1] == set(range(6))


def test_unsubscribed_and_uninitialised_partitions_are_revoked() -> None:
    current = {"a": {T1: {0, 1}, T2: {0}}}
    result = SimpleAssignor().assign({"a": {T1}}, {T1: [1, 2]}, current)
    assert result == {"a": {T1: {1, 2}}}


def test_heterogeneous_per_topic() -> None:
    members = {"a": {T1}, "b": {T1, T2}, "c": {T2}}
    result = SimpleAssignor().assign(members, {T1: [0, 1], T2: [0, 1, 2, 3]}, {})
    assert set(result["a"]) == {T1}
    assert set(result["c"]) == {T2}
    assert len(result["a"][T1]) == 1 and len(result["b"][T1]) == 1
    assert len(result["b"][T2]) == 2 and len(result["c"][T2]) == 2


def test_swap_when_needy_members_already_hold_partition() -> None:
    # a and b both hold p0; with 3 members over 2 partitions (sharing 2, quotas 2/2/... ) nobody can just take p1
    members = {m: {T1} for m in "abc"}
    current = {"a": {T1: {0}}, "b": {T1: {0}}, "c": {T1: {0, 1}}}
    result = SimpleAssignor().assign(members, {T1: [0, 1]}, current)
    assert sharing(result) == {(T1, 0): 2, (T1, 1): 2}
    assert sorted(counts(result).values()) == [1, 1, 2]


# ---- properties ------------------------------------------------------------------------------------

TOPICS = [T1, T2, T3]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, set[bytes]], dict[bytes, list[int]], Assignment]:
    num_members = draw(st.integers(1, 9))
    homogeneous = draw(st.booleans())
    shared = draw(st.sets(st.sampled_from(TOPICS), min_size=1))
    members = {
        f"m{i}": set(shared) if homogeneous else draw(st.sets(st.sampled_from(TOPICS), min_size=1))
        for i in range(num_members)
    }
    partitions = {t: sorted(draw(st.sets(st.integers(0, 7), max_size=6))) for t in TOPICS if draw(st.booleans())}
    current: Assignment = {}
    for m in members:
        if draw(st.booleans()):
            current[m] = {t: draw(st.sets(st.integers(0, 8), max_size=4)) for t in draw(st.sets(st.sampled_from(TOPICS)))}
    return members, partitions, current


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_assignment_properties(scenario: tuple[dict[str, set[bytes]], dict[bytes, list[int]], Assignment]) -> None:
    members, partitions, current = scenario
    result = SimpleAssignor().assign(members, partitions, current)
    assert set(result) == set(members)
    held = sharing(result)
    for m, topics in result.items():
        for t, ps in topics.items():
            assert t in members[m], "member got a topic it does not subscribe to"
            assert ps <= set(partitions.get(t, [])), "unassignable partition handed out"
            assert ps, "empty topic entry"
    for t, ps in partitions.items():
        if any(t in s for s in members.values()):
            for p in ps:
                assert held[(t, p)] >= 1, f"partition {p} of a subscribed topic left unassigned"
    homogeneous = len({frozenset(s) for s in members.values()}) == 1
    if homogeneous:
        c = counts(result)
        assert max(c.values()) - min(c.values()) <= 1
        if any(partitions.get(t) for t in next(iter(members.values()))):
            assert min(c.values()) >= 1
    else:
        for t in TOPICS:
            subscribers = [m for m, s in members.items() if t in s]
            per = [len(result[m].get(t, set())) for m in subscribers]
            if per:
                assert max(per) - min(per) <= 1
                if partitions.get(t):
                    assert min(per) >= 1
    # Stickiness: with membership unchanged, the result is stable.
    assert SimpleAssignor().assign(members, partitions, result) == result
