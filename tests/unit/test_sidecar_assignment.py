"""The sidecar group's assignment of units of work (upstream topic-partitions, state-topic partitions), the
group protocol's bytes, and the keys that name an owner."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.apis.sidecar_group_apis import parse_share_key
from shoal.broker.upstream.assignment import Unit, assign
from shoal.broker.upstream.membership import (
    Endpoint,
    GroupAssignment,
    MemberInfo,
    MembershipSettings,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    encode_metadata,
    leader_assignment,
    parse_membership,
)
from shoal.broker.upstream.settings import UpstreamConfigError
from shoal.protocol.uuids import uuid_to_str

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


# ---- the group protocol's bytes and the leader's answer ------------------------------------------------

def _member(node_id: int, port: int, owned: set[Unit] | None = None) -> bytes:
    return encode_metadata(MemberInfo(node_id, (Endpoint("PLAINTEXT", "PLAINTEXT", "127.0.0.1", port),)), owned or set())


def test_member_metadata_and_assignment_survive_their_encoding() -> None:
    info = MemberInfo(7, (Endpoint("PLAINTEXT", "PLAINTEXT", "h", 1), Endpoint("SSL", "SSL", "h", 2)))
    assert decode_metadata(encode_metadata(info, {("t", 1)})) == (info, {("t", 1)})
    assignment = GroupAssignment(3, 7, {7: info}, {("t", 0): 7, ("__share_group_state", 2): 7})
    assert decode_assignment(encode_assignment(assignment)) == assignment


def test_the_leader_gives_a_second_member_with_a_taken_node_id_nothing() -> None:
    units = {("t", p) for p in range(4)}
    result, refused = leader_assignment(5, "m-a", [("m-a", _member(1, 9001)), ("m-b", _member(1, 9002)),
                                                   ("m-c", _member(2, 9003))], units)
    assert refused == ["m-b"]
    assert set(result.members) == {1, 2} and result.leader == 1
    assert set(result.owners) == units and sorted(result.owners.values()).count(1) == 2


def test_the_leader_keeps_each_member_on_what_it_owns() -> None:
    units = {("t", p) for p in range(4)}
    result, _ = leader_assignment(2, "m-a", [("m-a", _member(1, 1, {("t", 2), ("t", 3)})),
                                             ("m-b", _member(2, 2, {("t", 0), ("t", 1)}))], units)
    assert result.units_of(1) == {("t", 2), ("t", 3)} and result.units_of(2) == {("t", 0), ("t", 1)}


def test_unreadable_metadata_gets_no_work() -> None:
    result, refused = leader_assignment(1, "m-a", [("m-a", _member(1, 1)), ("m-x", b"not json")], {("t", 0)})
    assert refused == ["m-x"] and result.owners == {("t", 0): 1}


def test_membership_settings_are_checked() -> None:
    assert parse_membership({}) == MembershipSettings()
    assert parse_membership({"group.id": "g", "session.timeout.ms": "6000"}).session_timeout_ms == 6000
    for bad in ({"group.id": ""}, {"session.timeout.ms": "x"}, {"nope": "1"}, {"rebalance.timeout.ms": "0"},
                {"session.timeout.ms": "1000", "heartbeat.interval.ms": "1000"}):
        with pytest.raises(UpstreamConfigError):
            parse_membership(bad)


def test_share_coordinator_keys_are_read_as_kafka_writes_them() -> None:
    topic_id = bytes(range(16))
    assert parse_share_key(f"my:group:{uuid_to_str(topic_id)}:3") == ("my:group", topic_id, 3)
    for bad in ("", "g:x:1", f"g:{uuid_to_str(topic_id)}:-1", f":{uuid_to_str(topic_id)}:1", "g:1"):
        assert parse_share_key(bad) is None
