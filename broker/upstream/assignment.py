"""Who of the sidecar group's members owns which unit of work (pure; computed by the group's leader).

A unit is a topic-partition: an upstream topic-partition (its share-partition leadership) or a partition
of a state topic (a coordinator shard). Units are balanced per topic, so every topic's partitions are
spread within one across the members, and the assignment is sticky: a member keeps the units it owns
as long as its share allows, so a rebalance moves only what it must (as Kafka Connect's incremental
assignor aims to). The members' current units come from their join metadata, as in KIP-415.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

Unit = tuple[str, int]  # (topic, partition)


def assign(units: Iterable[Unit], members: Sequence[str],
           owned: Mapping[str, Iterable[Unit]] | None = None) -> dict[str, set[Unit]]:
    """Every unit to exactly one member; per topic, every member gets floor(k/n) or ceil(k/n) of its k
    partitions. `owned` is what each member holds now (a unit claimed by two members stays with the first
    in member order; units no longer present are forgotten)."""
    names = sorted(set(members))
    result: dict[str, set[Unit]] = {m: set() for m in names}
    if not names:
        return result
    by_topic: dict[str, set[Unit]] = defaultdict(set)
    for unit in units:
        by_topic[unit[0]].add(unit)
    previous: dict[str, set[Unit]] = {m: set((owned or {}).get(m, ())) for m in names}
    totals = dict.fromkeys(names, 0)
    for topic in sorted(by_topic):
        for member, got in _assign_topic(sorted(by_topic[topic]), names, previous, totals).items():
            result[member] |= got
            totals[member] += len(got)
    return result


def _assign_topic(units: list[Unit], names: list[str], previous: Mapping[str, set[Unit]],
                  totals: Mapping[str, int]) -> dict[str, set[Unit]]:
    base, extra = divmod(len(units), len(names))
    present = set(units)
    kept: dict[str, list[Unit]] = {}
    taken: set[Unit] = set()
    for m in names:
        mine = sorted(u for u in previous[m] if u in present and u not in taken)[:base + (1 if extra else 0)]
        kept[m] = mine
        taken.update(mine)
    # At most `extra` members may hold base+1; the others above base give their last unit back. Those with
    # the fewest units overall keep their extra, so the totals across topics stay even too.
    over = sorted((m for m in names if len(kept[m]) > base), key=lambda m: (totals[m], m))
    for m in over[extra:]:
        taken.discard(kept[m].pop())
    extras_left = extra - min(len(over), extra)
    # Who of the others gets base+1: the fewest units overall first, then member order.
    takers = sorted((m for m in names if len(kept[m]) <= base), key=lambda m: (totals[m], m))
    target = {m: len(kept[m]) for m in names if len(kept[m]) > base}
    for i, m in enumerate(takers):
        target[m] = base + (1 if i < extras_left else 0)
    free = [u for u in units if u not in taken]
    out: dict[str, set[Unit]] = {}
    for m in names:
        need = target[m] - len(kept[m])
        out[m] = set(kept[m]) | set(free[:need])
        del free[:need]
    assert not free, "every unit has an owner"
    return out
