"""What `kafka-share-groups` and `kafka-consumer-groups` share: how they run their actions, Kafka's table
layout, the partitions a reset names (`--topic t` or `t:0,1`), and the offsets each reset scenario
resolves to."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from shoal.client.admin import AsyncAdmin, TopicPartition
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import (
    ToolParser,
    UsageError,
    add_version,
    parse_datetime_ms,
    parse_duration_ms,
    usage_failure,
)
from shoal.client.tools.config import ToolConfigError, load_properties, split_settings, warn_ignored


class ToolError(Exception):
    """A failure to report as `Error: <message>` with exit code 1."""


def option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def group_parser(prog: str, description: str, kind: str, default_timeout_ms: int) -> ToolParser:
    """The options `kafka-share-groups` and `kafka-consumer-groups` have in common, as Kafka names them."""
    p = ToolParser(prog=prog, description=description)
    p.add_argument("--bootstrap-server", metavar="<server to connect to>", help="REQUIRED: The server(s) to connect to.")
    p.add_argument("--command-config", metavar="<command config property file>",
                   help="Property file with client settings (security.protocol, sasl.*, ssl.*) for the admin client.")
    p.add_argument("--group", action="append", metavar=f"<{kind} group>", help=f"The {kind} group to act on.")
    p.add_argument("--all-groups", action="store_true", help=f"Apply to all {kind} groups.")
    p.add_argument("--topic", action="append", metavar="<topic>",
                   help="A topic whose offsets are deleted or reset. For --reset-offsets, 'topic:0,1,2' limits the "
                        "reset to those partitions.")
    p.add_argument("--all-topics", action="store_true",
                   help=f"With --reset-offsets: every topic the {kind} group has offsets for.")
    p.add_argument("--list", action="store_true", help=f"List all {kind} groups.")
    p.add_argument("--describe", action="store_true", help=f"Describe {kind} groups: offsets, members or state.")
    p.add_argument("--delete", action="store_true", help=f"Delete {kind} groups (they must have no members).")
    p.add_argument("--reset-offsets", action="store_true",
                   help=f"Reset the offsets of a {kind} group, which must have no active members. Needs --dry-run "
                        "or --execute and one reset scenario.")
    p.add_argument("--delete-offsets", action="store_true",
                   help=f"Delete the offsets of one {kind} group for the topics given with --topic.")
    p.add_argument("--offsets", action="store_true", help="With --describe: each partition's offset and lag (the default).")
    p.add_argument("--members", action="store_true", help="With --describe: the group's members.")
    p.add_argument("--state", nargs="?", const="", metavar="<states>",
                   help="With --describe: the group's state. With --list: show states, optionally only groups "
                        "in the comma-separated states given.")
    p.add_argument("--verbose", action="store_true", help="With --describe: more columns.")
    p.add_argument("--dry-run", action="store_true", help="Only show the offsets --reset-offsets would set.")
    p.add_argument("--execute", action="store_true", help="Reset the offsets.")
    p.add_argument("--to-earliest", action="store_true", help="Reset to the earliest offset.")
    p.add_argument("--to-latest", action="store_true", help="Reset to the latest offset.")
    p.add_argument("--to-datetime", metavar="<datetime>",
                   help="Reset to the first offset at or after a time: 'YYYY-MM-DDTHH:mm:SS.sss', local time "
                        "unless a 'Z' or '+hh:mm' zone follows.")
    p.add_argument("--by-duration", metavar="<duration>",
                   help="Reset to the first offset at or after now minus a duration: 'PnDTnHnMnS'.")
    p.add_argument("--to-offset", type=int, metavar="<offset>",
                   help="Reset to this offset (kept within the partition's earliest and latest offsets).")
    p.add_argument("--timeout", type=int, default=default_timeout_ms, metavar="<timeout (ms)>",
                   help=f"How long to wait for the cluster, in ms (default {default_timeout_ms}).")
    add_version(p)
    return p


def check_group_args(ns: argparse.Namespace, scenarios: Sequence[str], reset_only: Sequence[str], what: str) -> None:
    """The option combinations both tools refuse, as Kafka's tools refuse them."""
    if not ns.bootstrap_server:
        raise UsageError('Missing required argument "[bootstrap-server]"')
    if sum(bool(getattr(ns, a)) for a in ("list", "describe", "delete", "reset_offsets", "delete_offsets")) != 1:
        raise UsageError("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                         "--delete-offsets.")
    if ns.timeout <= 0:
        raise UsageError("--timeout must be a positive number of milliseconds")
    if ns.group and ns.all_groups:
        raise UsageError("Option --group cannot be used with --all-groups.")
    if ns.group and ns.list:
        raise UsageError("Option --group cannot be used with --list.")
    if ns.topic and (ns.list or ns.describe or ns.delete):
        raise UsageError("Option --topic can only be used with --reset-offsets or --delete-offsets.")
    for flag in ("offsets", "members", "verbose"):
        if getattr(ns, flag) and not ns.describe:
            raise UsageError(f"Option {option(flag)} can only be used with --describe.")
    if ns.state is not None and not (ns.describe or ns.list):
        raise UsageError("Option --state can only be used with --describe or --list.")
    if not ns.reset_offsets:
        for flag in ("dry_run", "execute", "all_topics", *reset_only, *scenarios):
            if getattr(ns, flag) not in (None, False):
                raise UsageError(f"Option {option(flag)} can only be used with --reset-offsets.")
    if ns.describe:
        if not ns.group and not ns.all_groups:
            raise UsageError("Option --describe takes one of these options: --group, --all-groups")
        if sum((ns.members, ns.offsets, ns.state is not None)) > 1:
            raise UsageError("Option --describe takes at most one of these options: --members, --offsets, --state")
        if ns.state:
            raise UsageError("Option --describe does not take a value for --state")
    if ns.delete and not ns.group and not ns.all_groups:
        raise UsageError("Option --delete takes the options --group or --all-groups")
    if ns.delete_offsets:
        if not ns.group or not ns.topic or ns.all_groups:
            raise UsageError("Option --delete-offsets takes the following options: --group, --topic")
        if len(set(ns.group)) > 1:
            raise UsageError(f"Option --delete-offsets supports one {what} at a time.")
    if ns.reset_offsets:
        if ns.dry_run and ns.execute:
            raise UsageError("Option --reset-offsets only accepts one of --execute and --dry-run")
        if sum(getattr(ns, s) not in (None, False) for s in scenarios) != 1:
            raise UsageError("Option --reset-offsets takes exactly one of these options: "
                             + ", ".join(option(s) for s in scenarios))
        if ns.topic and ns.all_topics:
            raise UsageError("Option --reset-offsets takes either --topic or --all-topics, not both.")
        # Check the time formats now, before anything is sent.
        if ns.to_datetime is not None:
            parse_datetime_ms(ns.to_datetime)
        if ns.by_duration is not None:
            parse_duration_ms(ns.by_duration)


def parse_states(text: str, known: Sequence[str]) -> list[str]:
    """Comma-separated group states, any case, as the broker spells them."""
    by_lower = {s.lower(): s for s in known}
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s.lower() not in by_lower]
    if unknown:
        raise UsageError(f"Invalid state list '{text}'. Valid states are: {', '.join(known)}")
    return [by_lower[s.lower()] for s in names]


def report_deletions(kind: str, group_ids: Sequence[str], failures: Mapping[str, str]) -> bool:
    """Print what DeleteGroups did, as Kafka's tools word it; False when some group was not deleted."""
    deleted = [g for g in group_ids if g not in failures]
    quoted = ", ".join(f"'{g}'" for g in deleted)
    if not failures:
        print(f"Deletion of requested {kind} groups ({quoted}) was successful.")
        return True
    print(f"Error: Deletion of some {kind} groups failed:", file=sys.stderr)
    for group_id, reason in failures.items():
        print(f"* Group '{group_id}' could not be deleted due to: {reason}", file=sys.stderr)
    if deleted:
        print(f"\nThese {kind} groups were deleted successfully: {quoted}")
    return False


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
        else:
            wanted[tp] = clamp_to_log(tp, target, earliest[tp], latest[tp])
    return wanted


def clamp_to_log(tp: TopicPartition, target: int, earliest: int, latest: int) -> int:
    """A reset target moved into the partition's log, saying so on stderr as Kafka's tools do."""
    if target > latest:
        print(f"New offset ({target}) is higher than latest offset for topic partition {tp[0]}-{tp[1]}. "
              f"Value will be set to {latest}", file=sys.stderr)
        return latest
    if target < earliest:
        print(f"New offset ({target}) is lower than earliest offset for topic partition {tp[0]}-{tp[1]}. "
              f"Value will be set to {earliest}", file=sys.stderr)
        return earliest
    return target


class GroupService(Protocol):
    """One action per method, as the tools' options name them; `failed` turns into exit code 1."""

    failed: bool

    async def list_groups(self) -> None: ...

    async def describe(self) -> None: ...

    async def delete_groups(self) -> None: ...

    async def reset_offsets(self) -> None: ...

    async def delete_offsets(self) -> None: ...


class GroupServiceBase:
    """The state and helpers both tools' services share; `GROUP_TYPES` picks the groups `--all-groups` and
    `--list` see."""

    GROUP_TYPES: Sequence[str] = ()

    def __init__(self, admin: AsyncAdmin, ns: argparse.Namespace):
        self.admin = admin
        self.ns = ns
        self.failed = False

    def error(self, message: str) -> None:
        self.failed = True
        print(f"Error: {message}", file=sys.stderr)

    async def group_ids(self) -> list[str]:
        return sorted(g.group_id for g in await self.admin.list_groups(types=list(self.GROUP_TYPES)))


async def run_service(ns: argparse.Namespace, prog: str,
                      make_service: Callable[[AsyncAdmin, argparse.Namespace], GroupService]) -> int:
    props = load_properties(ns.command_config) if ns.command_config else {}
    settings = split_settings(props)
    warn_ignored(settings)
    admin = AsyncAdmin(ns.bootstrap_server, client_id=settings.client_id or prog, request_timeout_ms=ns.timeout,
                       config=settings.connection)
    service = make_service(admin, ns)
    try:
        await admin.start()
        if ns.list:
            await service.list_groups()
        elif ns.describe:
            await service.describe()
        elif ns.delete:
            await service.delete_groups()
        elif ns.reset_offsets:
            await service.reset_offsets()
        else:
            await service.delete_offsets()
    finally:
        await admin.close()
    return 1 if service.failed else 0


def tool_main(argv: Sequence[str] | None, parser: ToolParser, check_args: Callable[[argparse.Namespace], None],
              prog: str, make_service: Callable[[AsyncAdmin, argparse.Namespace], GroupService], what: str) -> int:
    """Parse, check, run; usage errors exit 2, failures print `Error: ...` and exit 1, as Kafka's tools."""
    try:
        ns = parser.parse_args(argv)
        check_args(ns)
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    try:
        return asyncio.run(run_service(ns, prog, make_service))
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    except (ToolError, ToolConfigError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
    except ValueError as exc:  # client settings the bundled client refuses
        print(f"Error: invalid client configuration: {exc}", file=sys.stderr)
    except KafkaError as exc:
        print(f"Error: Executing {what} command failed due to {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1
