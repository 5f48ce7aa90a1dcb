"""The ownership view a sidecar keeps of its group's assignment: what it serves, in which order it lets go
of units and takes new ones, and that a lapsed or stale membership serves nothing."""

from __future__ import annotations

import asyncio

from shoal.broker.upstream.assignment import Unit
from shoal.broker.upstream.membership import Endpoint, GroupAssignment, MemberInfo
from shoal.broker.upstream.ownership import NO_OWNER, Ownership

_ME, _OTHER = 1, 2


def _info(node: int) -> MemberInfo:
    return MemberInfo(node, (Endpoint("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9000 + node),))


def _assignment(generation: int, owners: dict[Unit, int], leader: int = _ME) -> GroupAssignment:
    return GroupAssignment(generation, leader, {n: _info(n) for n in {leader, *owners.values()}}, owners)


class _Recorder:
    """Hooks that note, in order, what was served when each ran."""

    def __init__(self, ownership: Ownership, probe: list[Unit]):
        self.events: list[tuple[str, object]] = []
        self.ownership = ownership
        self.probe = probe
        ownership.release_hooks.append(self.release)
        ownership.take_hooks.append(self.take)

    def release(self, serves: object) -> None:
        self.events.append(("release", {u for u in self.probe if self.ownership.serves(u)}))

    async def take(self, gained: set[Unit]) -> None:
        self.events.append(("take", (set(gained), {u for u in self.probe if self.ownership.serves(u)})))
        # Being taken, a gained unit is this instance's already (a lost write may take it again).
        assert all(self.ownership.assigned_here(u) for u in gained)


def test_nothing_is_served_before_the_first_assignment_and_alone_everything_is() -> None:
    ownership = Ownership(_ME, lambda: (_info(_ME).endpoints))
    assert ownership.owner(("t", 0)) == NO_OWNER and not ownership.serves(("t", 0))
    asyncio.run(ownership.go_alone())
    assert ownership.serves(("t", 0)) and ownership.owner(("anything", 9)) == _ME
    assert set(ownership.members()) == {_ME}


def test_lost_units_stop_before_gained_ones_are_taken_and_gained_ones_are_served_only_after() -> None:
    a, b, c = ("t", 0), ("t", 1), ("__share_group_state", 0)
    ownership = Ownership(_ME, lambda: _info(_ME).endpoints)
    recorder = _Recorder(ownership, [a, b, c])
    asyncio.run(ownership.apply(_assignment(1, {a: _ME, b: _OTHER, c: _ME})))
    assert ownership.serves(a) and ownership.serves(c) and not ownership.serves(b)
    recorder.events.clear()

    asyncio.run(ownership.apply(_assignment(2, {a: _OTHER, b: _ME, c: _ME})))
    # Released first: `a` is no longer served and `b` is not served yet; then `b` is taken, still unserved.
    assert recorder.events == [("release", {c}), ("take", ({b}, {c}))]
    assert ownership.serves(b) and ownership.serves(c) and not ownership.serves(a)
    assert ownership.owner(a) == _OTHER
    assert ownership.endpoint(_OTHER, "PLAINTEXT") == _info(_OTHER).endpoints[0]
    assert ownership.endpoint(_OTHER, "SSL") is None
    assert ownership.endpoint(_OTHER, "SSL", any_listener=True) == _info(_OTHER).endpoints[0]


def test_a_unit_the_leader_has_not_assigned_yet_is_the_leaders() -> None:
    ownership = Ownership(_ME, lambda: _info(_ME).endpoints)
    asyncio.run(ownership.apply(_assignment(1, {("t", 0): _ME}, leader=_OTHER)))
    assert ownership.owner(("new-topic", 0)) == _OTHER and not ownership.serves(("new-topic", 0))


def test_the_leader_keeps_serving_a_new_unit_the_next_assignment_gives_it() -> None:
    """A topic created on the upstream is the leader's until the group rebalances; an assignment that then
    names it for the leader is no change of owner: it is not taken again, nor released in between."""
    state, old, new, elsewhere = ("__share_group_state", 0), ("t", 0), ("u", 0), ("u", 1)
    ownership = Ownership(_ME, lambda: _info(_ME).endpoints)
    asyncio.run(ownership.apply(_assignment(1, {state: _ME, old: _ME})))
    recorder = _Recorder(ownership, [state, old, new, elsewhere])
    assert ownership.serves(new) and ownership.serves(elsewhere)
    asyncio.run(ownership.apply(_assignment(2, {state: _ME, old: _ME, new: _ME, elsewhere: _OTHER})))
    assert recorder.events == [("release", {state, old, new}), ("take", (set(), {state, old, new}))]
    # A follower that is handed a unit its leader held meanwhile takes it.
    follower = Ownership(_OTHER, lambda: _info(_OTHER).endpoints)
    asyncio.run(follower.apply(_assignment(1, {state: _ME, old: _ME})))
    taken = _Recorder(follower, [elsewhere])
    asyncio.run(follower.apply(_assignment(2, {state: _ME, old: _ME, new: _ME, elsewhere: _OTHER})))
    assert taken.events == [("release", set()), ("take", ({elsewhere}, set()))]


def test_a_lapsed_membership_serves_nothing_and_the_next_assignment_takes_everything_again() -> None:
    a = ("t", 0)
    ownership = Ownership(_ME, lambda: _info(_ME).endpoints)
    recorder = _Recorder(ownership, [a])
    asyncio.run(ownership.apply(_assignment(1, {a: _ME})))
    ownership.lapse()
    assert not ownership.serves(a) and ownership.owner(a) == NO_OWNER
    assert recorder.events[-1] == ("release", set())
    asyncio.run(ownership.apply(_assignment(2, {a: _ME})))
    assert recorder.events[-1] == ("take", ({a}, set())) and ownership.serves(a)


def test_a_stale_membership_serves_nothing_even_before_it_lapses() -> None:
    fresh = [True]
    a = ("t", 0)
    ownership = Ownership(_ME, lambda: _info(_ME).endpoints, lambda: fresh[0])
    asyncio.run(ownership.apply(_assignment(1, {a: _ME})))
    assert ownership.serves(a)
    fresh[0] = False  # paused or cut off past the session timeout
    assert not ownership.serves(a) and not ownership.assigned_here(a) and ownership.owner(a) == _ME
