"""Offset ranges for the `kafka-share` Spark source: what a micro-batch acquired, how it is written into
Spark's offset log, and how it is cut into tasks. Pure logic, no I/O.

A batch is described per topic-partition by ranges (first offset, last offset, delivery count, bytes): the
offsets acquired for it, each range with one delivery count, and an estimate of their size in the log.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    first: int
    last: int
    delivery_count: int
    size: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


BatchRanges = dict[TopicPartition, list[OffsetRange]]


def ranges_to_json(ranges: Mapping[TopicPartition, Iterable[OffsetRange]]) -> dict[str, dict[str, list[list[int]]]]:
    out: dict[str, dict[str, list[list[int]]]] = {}
    for (topic, partition), rs in sorted(ranges.items()):
        listed = [[r.first, r.last, r.delivery_count, r.size] for r in sorted(rs, key=lambda r: r.first)]
        if listed:
            out.setdefault(topic, {})[str(partition)] = listed
    return out


def ranges_from_json(obj: Mapping[str, Any] | None) -> BatchRanges:
    out: BatchRanges = {}
    for topic, parts in (obj or {}).items():
        for partition, rs in parts.items():
            out[(topic, int(partition))] = [OffsetRange(int(a), int(b), int(c), int(d)) for a, b, c, d in rs]
    return out


def record_count(ranges: Mapping[TopicPartition, Iterable[OffsetRange]]) -> int:
    return sum(r.count for rs in ranges.values() for r in rs)


@dataclass
class OffsetSet:
    """Sets of offsets per topic-partition, kept as sorted, disjoint, non-adjacent [lo, hi] intervals."""

    intervals: dict[TopicPartition, list[tuple[int, int]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.intervals.values())

    def add(self, tp: TopicPartition, lo: int, hi: int) -> None:
        spans = self.intervals.setdefault(tp, [])
        merged: list[tuple[int, int]] = []
        placed = False
        for a, b in spans:
            if b < lo - 1:
                merged.append((a, b))
            elif a > hi + 1:
                if not placed:
                    merged.append((lo, hi))
                    placed = True
                merged.append((a, b))
            else:
                lo, hi = min(lo, a), max(hi, b)
        if not placed:
            merged.append((lo, hi))
        self.intervals[tp] = merged

    def add_ranges(self, ranges: Mapping[TopicPartition, Iterable[OffsetRange]]) -> None:
        for tp, rs in ranges.items():
            for r in rs:
                self.add(tp, r.first, r.last)

    def remove(self, tp: TopicPartition, lo: int, hi: int) -> None:
        spans = self.intervals.get(tp)
        if not spans:
            return
        kept: list[tuple[int, int]] = []
        for a, b in spans:
            if b < lo or a > hi:
                kept.append((a, b))
                continue
            if a < lo:
                kept.append((a, lo - 1))
            if b > hi:
                kept.append((hi + 1, b))
        if kept:
            self.intervals[tp] = kept
        else:
            del self.intervals[tp]

    def remove_below(self, tp: TopicPartition, offset: int) -> None:
        self.remove(tp, -1, offset - 1)

    def split(self, tp: TopicPartition, lo: int, hi: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """lo..hi cut into (pieces inside the set, pieces outside it), each in offset order."""
        spans = self.intervals.get(tp, [])
        inside: list[tuple[int, int]] = []
        outside: list[tuple[int, int]] = []
        cursor = lo
        start = max(0, bisect.bisect_left(spans, (lo, lo)) - 1)
        for a, b in spans[start:]:
            if a > hi:
                break
            if b < cursor:
                continue
            if a > cursor:
                outside.append((cursor, a - 1))
            inside.append((max(a, cursor), min(b, hi)))
            cursor = min(b, hi) + 1
            if cursor > hi:
                break
        if cursor <= hi:
            outside.append((cursor, hi))
        return inside, outside

    def to_json(self) -> dict[str, dict[str, list[list[int]]]]:
        out: dict[str, dict[str, list[list[int]]]] = {}
        for (topic, partition), spans in sorted(self.intervals.items()):
            if spans:
                out.setdefault(topic, {})[str(partition)] = [[a, b] for a, b in spans]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> OffsetSet:
        s = cls()
        for topic, parts in (obj or {}).items():
            for partition, spans in parts.items():
                for a, b in spans:
                    s.add((topic, int(partition)), int(a), int(b))
        return s


def piece(r: OffsetRange, lo: int, hi: int) -> OffsetRange:
    """The part lo..hi of `r`, its size pro rata."""
    return OffsetRange(lo, hi, r.delivery_count, r.size * (hi - lo + 1) // r.count)


@dataclass(frozen=True, slots=True)
class TaskRanges:
    """What one Spark task reads: ranges of one topic-partition, in offset order."""

    topic: str
    partition: int
    ranges: tuple[OffsetRange, ...]

    @property
    def size(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)


def _halve(task: TaskRanges) -> tuple[TaskRanges, TaskRanges] | None:
    """Cut a task into two with about the same number of offsets; None if it holds a single offset."""
    total = task.count
    if total < 2:
        return None
    want = total // 2
    left: list[OffsetRange] = []
    right: list[OffsetRange] = []
    seen = 0
    for r in task.ranges:
        if seen >= want:
            right.append(r)
        elif seen + r.count <= want:
            left.append(r)
        else:
            cut = r.first + (want - seen) - 1
            left.append(piece(r, r.first, cut))
            right.append(piece(r, cut + 1, r.last))
        seen += r.count
    return (TaskRanges(task.topic, task.partition, tuple(left)), TaskRanges(task.topic, task.partition, tuple(right)))


def _by_bytes(topic: str, partition: int, ranges: list[OffsetRange], max_bytes: int) -> Iterator[TaskRanges]:
    current: list[OffsetRange] = []
    size = 0
    for r in sorted(ranges, key=lambda r: r.first):
        while r is not None:
            if size > max_bytes:  # one offset larger than the cap: it stays alone
                yield TaskRanges(topic, partition, tuple(current))
                current, size = [], 0
            room = max_bytes - size
            if r.size <= room or (not current and r.count == 1):
                current.append(r)
                size += r.size
                break
            # The most offsets whose pro-rata size (see piece()) still fits the room left.
            fits = min(r.count - 1, ((room + 1) * r.count - 1) // r.size) if r.size else r.count - 1
            if not current:
                fits = max(fits, 1)  # an empty task always takes something
            if fits > 0:
                current.append(piece(r, r.first, r.first + fits - 1))
                r = piece(r, r.first + fits, r.last)
            if current:
                yield TaskRanges(topic, partition, tuple(current))
            current, size = [], 0
    if current:
        yield TaskRanges(topic, partition, tuple(current))


def _even_cap(ranges: list[OffsetRange], max_bytes: int) -> int:
    """The byte cap that cuts a partition's ranges into as few tasks as `max_bytes` allows, of about equal
    size: a batch of 1.2 x max_bytes becomes two tasks of 0.6, not one full task and a small one, since a
    micro-batch lasts as long as its largest task. One average offset of slack keeps a rounding sliver from
    becoming a task of its own."""
    total = sum(r.size for r in ranges)
    if total <= max_bytes:
        return max_bytes
    tasks = -(-total // max_bytes)
    count = sum(r.count for r in ranges)
    return min(max_bytes, -(-total // tasks) + -(-total // count))


def plan_tasks(ranges: Mapping[TopicPartition, Iterable[OffsetRange]], max_bytes: int, min_partitions: int = 1) -> list[TaskRanges]:
    """Cut a batch into tasks: each holds ranges of one topic-partition, in offset order, of at most
    `max_bytes` (unless one offset alone is larger), a partition's tasks of about equal size; then, while there are fewer than `min_partitions`
    tasks, the one with the most offsets is halved."""
    tasks: list[TaskRanges] = []
    for (topic, partition), rs in sorted(ranges.items()):
        rs = list(rs)
        if rs:
            tasks.extend(_by_bytes(topic, partition, rs, _even_cap(rs, max_bytes)))
    while len(tasks) < min_partitions and tasks:
        biggest = max(range(len(tasks)), key=lambda i: tasks[i].count)
        halves = _halve(tasks[biggest])
        if halves is None:
            break
        tasks[biggest : biggest + 1] = list(halves)
    return tasks
