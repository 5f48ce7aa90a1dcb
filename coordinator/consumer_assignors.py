"""Server-side assignors of KIP-848 consumer groups: `uniform` (Kafka's default) and `range`.

Both are pure functions of the members' subscriptions, the subscribed topics' partition counts and
the current target assignment. `uniform` is sticky: it keeps what a member already has as far as
balance allows, then spreads the rest so that no member could take a partition from a member that
has two or more partitions more than it. `range` gives each member contiguous ranges per topic, as
Kafka's RangeAssignor does, so co-partitioned topics land on the same member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

# member id -> topic id -> partitions
Assignment = dict[bytes, frozenset[int]]
GroupAssignment = dict[str, Assignment]

UNIFORM = "uniform"
RANGE = "range"


class ConsumerAssignor(Protocol):
    name: str

    def assign(self, subscriptions: Mapping[str, frozenset[bytes]], partitions: Mapping[bytes, int],
               current: Mapping[str, Assignment]) -> GroupAssignment: ...


def _freeze(owned: dict[str, dict[bytes, set[int]]]) -> GroupAssignment:
    return {mid: {tid: frozenset(ps) for tid, ps in sorted(t.items()) if ps} for mid, t in owned.items()}


class UniformAssignor:
    name = UNIFORM

    def assign(self, subscriptions: Mapping[str, frozenset[bytes]], partitions: Mapping[bytes, int],
               current: Mapping[str, Assignment]) -> GroupAssignment:
        members = sorted(subscriptions)
        owned: dict[str, dict[bytes, set[int]]] = {m: {} for m in members}
        count = dict.fromkeys(members, 0)
        owner: dict[tuple[bytes, int], str] = {}
        # What each member keeps: partitions still subscribed and existing, each kept by one member.
        for m in members:
            for tid, ps in sorted(current.get(m, {}).items()):
                if tid not in subscriptions[m] or tid not in partitions:
                    continue
                for p in sorted(ps):
                    if p < partitions[tid] and (tid, p) not in owner:
                        owner[(tid, p)] = m
                        owned[m].setdefault(tid, set()).add(p)
                        count[m] += 1
        eligible: dict[bytes, list[str]] = {}
        for tid in sorted(partitions):
            eligible[tid] = [m for m in members if tid in subscriptions[m]]
        # Unowned partitions go to the least loaded eligible member, hardest to place first.
        free = [(tid, p) for tid in sorted(partitions) if eligible[tid]
                for p in range(partitions[tid]) if (tid, p) not in owner]
        free.sort(key=lambda tp: (len(eligible[tp[0]]), tp))
        for tid, p in free:
            m = min(eligible[tid], key=lambda x: (count[x], x))
            owner[(tid, p)] = m
            owned[m].setdefault(tid, set()).add(p)
            count[m] += 1
        # Balance: the most loaded member that can give a partition to an eligible member with two or more
        # fewer gives one, until none can. Taking from the most loaded first keeps members that were
        # balanced among themselves from trading partitions (only newcomers receive).
        while True:
            for m in sorted(members, key=lambda x: (-count[x], x)):
                moves = [(count[r], r, tid) for tid, ps in owned[m].items() if ps
                         for r in eligible[tid] if count[m] - count[r] >= 2]
                if moves:
                    _, target, tid = min(moves)
                    p = max(owned[m][tid])
                    owned[m][tid].discard(p)
                    owned[target].setdefault(tid, set()).add(p)
                    count[m] -= 1
                    count[target] += 1
                    break
            else:
                break
        return _freeze(owned)


class RangeAssignor:
    name = RANGE

    def assign(self, subscriptions: Mapping[str, frozenset[bytes]], partitions: Mapping[bytes, int],
               current: Mapping[str, Assignment]) -> GroupAssignment:
        owned: dict[str, dict[bytes, set[int]]] = {m: {} for m in sorted(subscriptions)}
        for tid in sorted(partitions):
            members = sorted(m for m, topics in subscriptions.items() if tid in topics)
            if not members:
                continue
            per, extra = divmod(partitions[tid], len(members))
            start = 0
            for i, m in enumerate(members):
                size = per + (1 if i < extra else 0)
                if size:
                    owned[m][tid] = set(range(start, start + size))
                start += size
        return _freeze(owned)


ASSIGNORS: dict[str, type[UniformAssignor] | type[RangeAssignor]] = {UNIFORM: UniformAssignor, RANGE: RangeAssignor}


def parse_assignors(value: str) -> list[ConsumerAssignor]:
    """`group.consumer.assignors`: names (or Kafka's class names) in order; the first is the default."""
    out: list[ConsumerAssignor] = []
    for raw in value.split(","):
        name = raw.strip().rsplit(".", 1)[-1].lower().removesuffix("assignor")
        if not name:
            continue
        if name not in ASSIGNORS:
            raise ValueError(f"unknown consumer group assignor {raw.strip()!r} (known: uniform, range)")
        out.append(ASSIGNORS[name]())
    if not out:
        raise ValueError("group.consumer.assignors names no assignor")
    return out
