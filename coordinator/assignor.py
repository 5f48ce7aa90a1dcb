"""The share-group "simple" assignor (KIP-932): balance first, then stickiness; partitions are shared when
there are more members than partitions.

Same principles as Kafka's SimpleAssignor:
- homogeneous subscriptions: all assignable partitions are one pool; every partition should be held by
  `desired_sharing = ceil(M / P)` members and member quotas differ by at most one;
- heterogeneous subscriptions: the same is done per topic, among that topic's subscribers.
Existing assignments are kept up to quota, over-quota members and over-shared partitions give some up,
and free slots go to under-quota members that do not hold the partition yet.

The implementation is deterministic (members and partitions are visited in sorted order) so the same
input always yields the same output, and an output fed back as `current` is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MemberId = str
TopicId = bytes
TopicPartition = tuple[TopicId, int]
Assignment = dict[MemberId, dict[TopicId, set[int]]]

ASSIGNOR_NAME = "simple"


class SimpleAssignor:
    name = ASSIGNOR_NAME

    def assign(
        self,
        members: Mapping[MemberId, Iterable[TopicId]],
        partitions: Mapping[TopicId, Iterable[int]],
        current: Mapping[MemberId, Mapping[TopicId, Iterable[int]]],
    ) -> Assignment:
        """Target assignment for `members` (id -> subscribed topic ids).

        `partitions` lists only assignable (initialised) partitions per topic; a subscribed topic missing
        from it simply has nothing to assign. `current` is the previous target assignment.
        """
        subs = {m: frozenset(t) for m, t in members.items()}
        result: Assignment = {m: {} for m in subs}
        if not subs:
            return result
        assignable = {t: sorted(set(p)) for t, p in partitions.items()}
        held = {
            m: {(t, p) for t, ps in current.get(m, {}).items() for p in ps}
            for m in subs
        }
        distinct = set(subs.values())
        if len(distinct) == 1:
            # Homogeneous: one pool over every subscribed topic.
            topics = next(iter(distinct))
            pool = [(t, p) for t in sorted(topics) for p in assignable.get(t, [])]
            _merge(result, _assign_pool(sorted(subs), pool, held))
        else:
            for topic in sorted(set().union(*distinct)):
                subscribers = sorted(m for m, s in subs.items() if topic in s)
                pool = [(topic, p) for p in assignable.get(topic, [])]
                topic_held = {m: {tp for tp in held[m] if tp[0] == topic} for m in subscribers}
                _merge(result, _assign_pool(subscribers, pool, topic_held))
        return result


def _merge(result: Assignment, part: dict[MemberId, set[TopicPartition]]) -> None:
    for member, tps in part.items():
        for topic, partition in tps:
            result[member].setdefault(topic, set()).add(partition)


def _assign_pool(
    member_ids: list[MemberId], pool: list[TopicPartition], held: Mapping[MemberId, set[TopicPartition]]
) -> dict[MemberId, set[TopicPartition]]:
    """Assign one pool of partitions to `member_ids` (sorted), keeping what `held` allows."""
    out: dict[MemberId, set[TopicPartition]] = {m: set() for m in member_ids}
    num_members, num_partitions = len(member_ids), len(pool)
    if num_members == 0 or num_partitions == 0:
        return out
    targets = set(pool)
    # Only partitions still in the pool can be kept (unsubscribed or uninitialised ones are revoked).
    for m in member_ids:
        out[m] = held.get(m, set()) & targets

    desired_sharing = -(-num_members // num_partitions)
    slots = desired_sharing * num_partitions
    base, extra = divmod(slots, num_members)
    # The members that already hold the most get the "+1" quotas: fewer moves than handing them out by index.
    by_holding = sorted(member_ids, key=lambda m: (-len(out[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}

    sharers: dict[TopicPartition, set[MemberId]] = {tp: set() for tp in pool}
    for m in member_ids:
        for tp in out[m]:
            sharers[tp].add(m)

    # Over-quota members give up their most-shared partitions first.
    for m in member_ids:
        excess = len(out[m]) - quota[m]
        if excess > 0:
            for tp in sorted(out[m], key=lambda x: (-len(sharers[x]), x))[:excess]:
                out[m].discard(tp)
                sharers[tp].discard(m)

    # Over-shared partitions drop their busiest holders.
    for tp in pool:
        excess = len(sharers[tp]) - desired_sharing
        if excess > 0:
            for m in sorted(sharers[tp], key=lambda x: (-len(out[x]), x))[:excess]:
                out[m].discard(tp)
                sharers[tp].discard(m)

    # Fill the free slots, least-shared partitions first, each to the neediest member not holding it.
    for tp in sorted(pool, key=lambda x: (len(sharers[x]), x)):
        while len(sharers[tp]) < desired_sharing:
            candidates = [m for m in member_ids if len(out[m]) < quota[m] and m not in sharers[tp]]
            if candidates:
                m = min(candidates, key=lambda x: (len(out[x]) - quota[x], x))
                out[m].add(tp)
                sharers[tp].add(m)
                continue
            if not _swap_in(tp, member_ids, quota, out, sharers):
                break  # cannot happen for the quotas above; tolerate a short partition rather than loop
    return out


def _swap_in(
    tp: TopicPartition,
    member_ids: list[MemberId],
    quota: Mapping[MemberId, int],
    out: dict[MemberId, set[TopicPartition]],
    sharers: dict[TopicPartition, set[MemberId]],
) -> bool:
    """Every under-quota member already holds `tp`: a full member hands one partition to an under-quota
    member and takes `tp` instead, so both quotas and the other partition's sharing stay intact."""
    needy = [m for m in member_ids if len(out[m]) < quota[m]]
    for u in needy:
        for v in member_ids:
            if v in sharers[tp] or len(out[v]) < quota[v]:
                continue
            for other in sorted(out[v] - out[u]):
                out[v].discard(other)
                sharers[other].discard(v)
                out[u].add(other)
                sharers[other].add(u)
                out[v].add(tp)
                sharers[tp].add(v)
                return True
    return False
