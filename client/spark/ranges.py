"""Offset ranges for the `kafka-share` Spark source: what a micro-batch acquired, how it is written into
Spark's offset log, and how it is cut into tasks. Pure logic, no I/O.

A batch is described per topic-partition by ranges (first offset, last offset, delivery count, bytes): the
offsets acquired for it, each range with one delivery count, and an estimate of their size in the log.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
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
class PartitionRanges:
    """Ranges of one topic-partition, in offset order."""

    topic: str
    partition: int
    ranges: tuple[OffsetRange, ...]


@dataclass(frozen=True, slots=True)
class TaskRanges:
    """What one Spark task reads: ranges of one or more topic-partitions, each partition's in offset order."""

    parts: tuple[PartitionRanges, ...]

    @property
    def size(self) -> int:
        return sum(r.size for p in self.parts for r in p.ranges)

    @property
    def count(self) -> int:
        return sum(r.count for p in self.parts for r in p.ranges)


class _TaskFiller:
    """Appends ranges to the open task and closes it into `tasks`; a partition's run of ranges stays together."""

    def __init__(self) -> None:
        self.tasks: list[TaskRanges] = []
        self.parts: list[PartitionRanges] = []
        self.run: list[OffsetRange] = []
        self.tp: TopicPartition = ("", 0)
        self.size = 0
        self.count = 0

    def start_partition(self, tp: TopicPartition) -> None:
        self._close_run()
        self.tp = tp

    def add(self, r: OffsetRange) -> None:
        self.run.append(r)
        self.size += r.size
        self.count += r.count

    def close_task(self) -> None:
        self._close_run()
        if self.parts:
            self.tasks.append(TaskRanges(tuple(self.parts)))
        self.parts, self.size, self.count = [], 0, 0

    def _close_run(self) -> None:
        if self.run:
            self.parts.append(PartitionRanges(self.tp[0], self.tp[1], tuple(self.run)))
            self.run = []


def _fill(parts: list[tuple[TopicPartition, list[OffsetRange]]], cap: int) -> list[TaskRanges]:
    """Ranges in (topic-partition, offset) order into tasks of at most `cap` bytes: a task closes when the
    next offset no longer fits, and a range is cut where it stops fitting. An offset larger than `cap`
    alone is a task of its own."""
    fill = _TaskFiller()
    for tp, ranges in parts:
        fill.start_partition(tp)
        for r in ranges:
            rest: OffsetRange | None = r
            while rest is not None:
                if fill.count and fill.size >= cap:
                    fill.close_task()
                room = cap - fill.size
                if rest.size <= room or (not fill.count and rest.count == 1):
                    fill.add(rest)
                    rest = None
                    continue
                # The most offsets whose pro-rata size (see piece()) still fits the room left.
                fits = min(rest.count - 1, ((room + 1) * rest.count - 1) // rest.size)
                if not fill.count:
                    fits = max(fits, 1)  # an empty task always takes something
                if fits > 0:
                    fill.add(piece(rest, rest.first, rest.first + fits - 1))
                    rest = piece(rest, rest.first + fits, rest.last)
                fill.close_task()
    fill.close_task()
    return fill.tasks


def _halve(task: TaskRanges) -> tuple[TaskRanges, TaskRanges] | None:
    """Cut a task into two with about the same number of offsets; None if it holds a single offset."""
    total = task.count
    if total < 2:
        return None
    want = total // 2
    halves = (_TaskFiller(), _TaskFiller())
    for part in task.parts:
        for half in halves:
            half.start_partition((part.topic, part.partition))
        for r in part.ranges:
            left = halves[0]
            if left.count >= want:
                halves[1].add(r)
            elif left.count + r.count <= want:
                left.add(r)
            else:
                cut = r.first + (want - left.count) - 1
                left.add(piece(r, r.first, cut))
                halves[1].add(piece(r, cut + 1, r.last))
    for half in halves:
        half.close_task()
    return halves[0].tasks[0], halves[1].tasks[0]


def plan_tasks(ranges: Mapping[TopicPartition, Iterable[OffsetRange]], max_bytes: int, min_partitions: int = 1) -> list[TaskRanges]:
    """Cut a batch into tasks by bytes, not by topic-partition: as few as `max_bytes` allows (an offset
    larger than that alone is a task), of about equal size, since a micro-batch lasts as long as its
    largest task and every Spark task has a fixed cost (for a Python source, tens of milliseconds before
    the first row); a task may hold ranges of several topic-partitions, each partition's in offset order.
    `min_partitions` raises the number of even shares; if byte sizes still give fewer tasks (offsets of
    no size), the task with the most offsets is halved until there are enough."""
    parts = [(tp, sorted(rs, key=lambda r: r.first)) for tp, rs in sorted(ranges.items()) if rs]
    total = sum(r.size for _, rs in parts for r in rs)
    count = sum(r.count for _, rs in parts for r in rs)
    if not count:
        return []
    tasks_wanted = max(1, min_partitions, -(-total // max_bytes))
    # An even share, plus one average offset of slack so that a rounding sliver does not become a task.
    cap = max(1, min(max_bytes, -(-total // tasks_wanted) + -(-total // count)))
    tasks = _fill(parts, cap)
    while len(tasks) < min_partitions:
        biggest = max(range(len(tasks)), key=lambda i: tasks[i].count)
        halves = _halve(tasks[biggest])
        if halves is None:
            break
        tasks[biggest : biggest + 1] = list(halves)
    return tasks
