"""The sidecar group's assignment of units of work (upstream topic-partitions, state-topic partitions)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.upstream.assignment import Unit, assign

_topics = st.dictionaries(st.sampled_from(["a", "b", "__consumer_offsets", "__share_group_state"]),
                          st.integers(min_value=0, max_value=12), max_size=4)
_members = st.lists(st.sampled_from([f"m{i}" for i in range(6)]), min_size=1, max_size=6, unique=True)


def _units(topics: dict[str, int]) -> list[Unit]:
    return [(t, p) for t, n in topics.items() for p in range(n)]


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[Unit], list[str], dict[str, set[Unit]]]:
    """Units, members, and what each member claims to own now: any units, overlapping or gone."""
    units = _units(draw(_topics))
    members = draw(_members)
    pool = units + [("gone", 0), ("a", 99)]
    owned = {m: set(draw(st.lists(st.sampled_from(pool), max_size=8))) for m in members}
    return units, members, owned


@settings(max_examples=300, deadline=None)
@given(_case())
def test_every_unit_has_exactly_one_owner_and_each_topic_is_balanced_within_one(
        case: tuple[list[Unit], list[str], dict[str, set[Unit]]]) -> None:
    units, members, owned = case
    result = assign(units, members, owned)
    assert set(result) == set(members)
    counted = Counter(u for got in result.values() for u in got)
    assert set(counted) == set(units)
    assert all(n == 1 for n in counted.values())
    for topic in {t for t, _ in units}:
        sizes = [sum(1 for u in got if u[0] == topic) for got in result.values()]
        assert max(sizes) - min(sizes) <= 1, (topic, sizes)


@settings(max_examples=300, deadline=None)
@given(_case())
def test_a_member_keeps_its_units_up_to_its_share(case: tuple[list[Unit], list[str], dict[str, set[Unit]]]) -> None:
    units, members, owned = case
    result = assign(units, members, owned)
    claimed: set[Unit] = set()
    for m in sorted(members):
        for topic in {t for t, _ in units}:
            of_topic = [u for u in units if u[0] == topic]
            floor_share = len(of_topic) // len(members)
            # What this member owned of the topic that no earlier member (in member order) also claimed.
            still = {u for u in owned[m] if u[0] == topic and u in of_topic and u not in claimed}
            kept = {u for u in result[m] if u[0] == topic and u in owned[m]}
            assert len(kept) >= min(len(still), floor_share)
        claimed |= owned[m]


@settings(max_examples=200, deadline=None)
@given(_topics, _members)
def test_a_balanced_assignment_is_kept_as_it_is(topics: dict[str, int], members: list[str]) -> None:
    units = _units(topics)
    first = assign(units, members)
    assert assign(units, members, first) == first
    # Listed in another order, the members get the same answer.
    assert assign(units, list(reversed(members)), first) == first


def test_a_member_that_leaves_gives_only_its_own_units_away() -> None:
    units = [("t", p) for p in range(6)] + [("__share_group_state", p) for p in range(4)]
    before = assign(units, ["x", "y", "z"])
    after = assign(units, ["x", "y"], before)
    for m in ("x", "y"):
        assert before[m] <= after[m]
    assert after["x"] | after["y"] == set(units)


def test_a_member_that_joins_takes_units_from_the_others_only_to_balance() -> None:
    units = [("t", p) for p in range(4)]
    before = assign(units, ["x"])
    after = assign(units, ["x", "y"], before)
    assert len(after["x"]) == len(after["y"]) == 2
    assert after["x"] <= before["x"]


def test_no_members_no_owners() -> None:
    assert assign([("t", 0)], []) == {}
