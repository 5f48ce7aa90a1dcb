"""What `kafka-share-groups` and `kafka-consumer-groups` share: Kafka's table layout, the partitions a
reset names (`--topic t` or `t:0,1`), and the offsets each reset scenario resolves to."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping, Sequence

from shoal.client.admin import AsyncAdmin, TopicPartition
from shoal.client.tools.cli import UsageError, parse_datetime_ms, parse_duration_ms


class ToolError(Exception):
    """A failure to report as `Error: <message>` with exit code 1."""


def table(rows: Sequence[Sequence[object]], widths: Sequence[int]) -> list[str]:
    """Left-aligned columns as Kafka's tools print them: each column padded to its width, the last unpadded."""
    out = []
    for row in rows:
        cells = [f"{str(cell):<{width}}" for cell, width in zip(row[:-1], widths, strict=False)]
        out.append(" ".join([*cells, str(row[-1])]))
    return out


def width(minimum: int, values: Iterable[object]) -> int:
    return max([minimum, *(len(str(v)) for v in values)])


def assignment_string(assignment: Iterable[TopicPartition]) -> str:
    """`topic:0,1,2;other:0` with topics and partitions sorted, as Kafka's tools show an assignment."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    return ";".join(f"{t}:{','.join(str(p) for p in sorted(ps))}" for t, ps in sorted(by_topic.items()))


async def named_partitions(admin: AsyncAdmin, specs: Iterable[str]) -> list[TopicPartition]:
    """The partitions of `--topic` values: a whole topic, or `topic:0,1,2`; unknown ones are an error."""
    counts = await admin.list_topics()
    wanted: list[TopicPartition] = []
    missing: list[str] = []
    for spec in dict.fromkeys(specs):
        topic, sep, listed = spec.partition(":")
        if topic not in counts:
            missing.append(topic)
            continue
        if not sep:
            wanted += [(topic, p) for p in range(counts[topic])]
            continue
        try:
            chosen = [int(p) for p in listed.split(",") if p.strip()]
        except ValueError:
            raise UsageError(f"--topic {spec!r}: partitions must be numbers, as in 'topic:0,1,2'") from None
        missing += [f"{topic}-{p}" for p in chosen if not 0 <= p < counts[topic]]
        wanted += [(topic, p) for p in chosen if 0 <= p < counts[topic]]
    if missing:
        raise ToolError(f"The partitions or topics do not exist: {', '.join(missing)}")
    return sorted(set(wanted))


async def listed_offsets(admin: AsyncAdmin, partitions: Iterable[TopicPartition], spec: str | int) -> dict[TopicPartition, int]:
    partitions = list(partitions)
    listed = await admin.list_offsets({tp: spec for tp in partitions})
    out = {}
    for tp in partitions:
        entry = listed.get(tp)
        if entry is None or entry.error is not None:
            reason = entry.error if entry is not None else "no answer"
            raise ToolError(f"Listing offsets of {tp[0]}-{tp[1]} failed: {reason}")
        out[tp] = entry.offset
    return out


async def target_offsets(
    admin: AsyncAdmin, ns: argparse.Namespace, partitions: list[TopicPartition],
    current: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The offsets a reset scenario names; explicit ones are kept within each partition's earliest/latest."""
    if ns.to_earliest or ns.to_latest:
        return await listed_offsets(admin, partitions, "earliest" if ns.to_earliest else "latest")
    if ns.to_datetime is not None or ns.by_duration is not None:
        if ns.to_datetime is not None:
            timestamp = parse_datetime_ms(ns.to_datetime)
        else:
            timestamp = int(time.time() * 1000) - parse_duration_ms(ns.by_duration)
        found = await listed_offsets(admin, partitions, timestamp)
        # No record at or after the time: the partition's end, as Kafka's tools reset then.
        beyond = [tp for tp, o in found.items() if o < 0]
        if beyond:
            found.update(await listed_offsets(admin, beyond, "latest"))
        return found
    wanted: dict[TopicPartition, int] = {}
    committed = current or {}
    for tp in partitions:
        if getattr(ns, "to_current", False):
            wanted[tp] = committed.get(tp, -1)
        elif getattr(ns, "shift_by", None) is not None:
            wanted[tp] = committed.get(tp, -1) + ns.shift_by
        elif getattr(ns, "from_file", None) is not None:
            wanted[tp] = ns.file_offsets[tp]
        else:
            wanted[tp] = ns.to_offset
    earliest = await listed_offsets(admin, partitions, "earliest")
    latest = await listed_offsets(admin, partitions, "latest")
    for tp, target in wanted.items():
        if target < 0 and getattr(ns, "to_current", False):
            wanted[tp] = latest[tp]  # nothing committed: the consumer would start from the end
        elif target > latest[tp]:
            print(f"New offset ({target}) is higher than latest offset for topic partition {tp[0]}-{tp[1]}. "
                  f"Value will be set to {latest[tp]}", file=sys.stderr)
            wanted[tp] = latest[tp]
        elif target < earliest[tp]:
            print(f"New offset ({target}) is lower than earliest offset for topic partition {tp[0]}-{tp[1]}. "
                  f"Value will be set to {earliest[tp]}", file=sys.stderr)
            wanted[tp] = earliest[tp]
    return wanted
