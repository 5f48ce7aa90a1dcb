"""`kafka-share-groups`: list, describe, reset offsets of, delete offsets of, and delete share groups.

Options and printed columns follow Apache Kafka's `kafka-share-groups.sh`, so scripts written for it work
against Shoal. It talks to the broker through the bundled admin client (`AsyncAdmin`). Unlike Kafka's tool,
every failure ends with a non-zero exit code and error text goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Sequence

from shoal.client.admin import (
    RESOURCE_GROUP,
    AsyncAdmin,
    ShareGroupDescription,
    SharePartitionOffset,
    TopicPartition,
)
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
from shoal.protocol.errors import ErrorCode

PROG = "kafka-share-groups"
DEFAULT_TIMEOUT_MS = 30_000
SHARE_GROUP_STATES = ("Empty", "Stable", "Dead")
MISSING = "-"  # what Kafka's tool prints for an unknown value
ACTIONS = ("list", "describe", "delete", "reset_offsets", "delete_offsets")
RESET_SCENARIOS = ("to_earliest", "to_latest", "to_current", "to_datetime", "by_duration", "to_offset", "shift_by",
                   "from_file")
DLQ_TOPIC_CONFIG = "errors.deadletterqueue.topic.name"


class ToolError(Exception):
    """A failure to report as `Error: <message>` with exit code 1."""


def _opt(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def build_parser() -> ToolParser:
    p = ToolParser(prog=PROG, description="This tool helps to list, describe, reset and delete share groups.")
    p.add_argument("--bootstrap-server", metavar="<server to connect to>", help="REQUIRED: The server(s) to connect to.")
    p.add_argument("--command-config", metavar="<command config property file>",
                   help="Property file with client settings (security.protocol, sasl.*, ssl.*) for the admin client.")
    p.add_argument("--group", action="append", metavar="<share group>", help="The share group to act on.")
    p.add_argument("--all-groups", action="store_true", help="Apply to all share groups.")
    p.add_argument("--topic", action="append", metavar="<topic>",
                   help="A topic whose offsets are deleted or reset. For --reset-offsets, 'topic:0,1,2' limits the "
                        "reset to those partitions.")
    p.add_argument("--all-topics", action="store_true",
                   help="Reset every topic the share group has offsets for (the default for --reset-offsets).")
    p.add_argument("--list", action="store_true", help="List all share groups.")
    p.add_argument("--describe", action="store_true", help="Describe share groups: offsets, members or state.")
    p.add_argument("--delete", action="store_true", help="Delete share groups (they must have no members).")
    p.add_argument("--reset-offsets", action="store_true",
                   help="Reset the start offsets of one share group, which must have no active members. Needs "
                        "--dry-run or --execute and one of --to-earliest, --to-latest, --to-current, "
                        "--to-datetime, --by-duration, --to-offset, --shift-by, --from-file.")
    p.add_argument("--delete-offsets", action="store_true",
                   help="Delete the offsets of one share group for the topics given with --topic.")
    p.add_argument("--offsets", action="store_true",
                   help="With --describe: each partition's start offset and lag (the default).")
    p.add_argument("--members", action="store_true", help="With --describe: the group's members.")
    p.add_argument("--state", nargs="?", const="", metavar="<states>",
                   help="With --describe: the group's state. With --list: show states, optionally only groups "
                        "in the comma-separated states given (Empty, Stable, Dead).")
    p.add_argument("--verbose", action="store_true", help="With --describe: add epochs.")
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
    # Kafka 4.4 (KAFKA-20524): the consumer-groups tool's remaining scenarios and its CSV plan.
    p.add_argument("--to-current", action="store_true", help="Reset to the current start offset.")
    p.add_argument("--shift-by", type=int, metavar="<number-of-offsets>",
                   help="Move the start offset by this many offsets (negative moves back), kept within the "
                        "partition's earliest and latest offsets.")
    p.add_argument("--from-file", metavar="<path to CSV file>",
                   help="Reset to the offsets in a CSV file of topic,partition,offset lines (as --export writes).")
    p.add_argument("--export", action="store_true",
                   help="With --reset-offsets: print the plan as CSV (topic,partition,offset) instead of a table.")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_MS, metavar="<timeout (ms)>",
                   help=f"How long to wait for the cluster, in ms (default {DEFAULT_TIMEOUT_MS}).")
    add_version(p)
    return p


def check_args(ns: argparse.Namespace) -> None:
    """Option combinations Kafka's tool refuses, refused here with the same meaning."""
    if not ns.bootstrap_server:
        raise UsageError('Missing required argument "[bootstrap-server]"')
    if sum(bool(getattr(ns, a)) for a in ACTIONS) != 1:
        raise UsageError("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                         "--delete-offsets.")
    if ns.timeout <= 0:
        raise UsageError("--timeout must be a positive number of milliseconds")
    scenarios = [_opt(s) for s in RESET_SCENARIOS if getattr(ns, s) not in (None, False)]
    if ns.group and ns.all_groups:
        raise UsageError("Option --group cannot be used with --all-groups.")
    if ns.group and ns.list:
        raise UsageError("Option --group cannot be used with --list.")
    if ns.topic and (ns.list or ns.describe or ns.delete):
        raise UsageError("Option --topic can only be used with --reset-offsets or --delete-offsets.")
    for flag in ("offsets", "members", "verbose"):
        if getattr(ns, flag) and not ns.describe:
            raise UsageError(f"Option {_opt(flag)} can only be used with --describe.")
    if ns.state is not None and not (ns.describe or ns.list):
        raise UsageError("Option --state can only be used with --describe or --list.")
    if not ns.reset_offsets:
        for flag in ("dry_run", "execute", "all_topics", "export", *RESET_SCENARIOS):
            if getattr(ns, flag) not in (None, False):
                raise UsageError(f"Option {_opt(flag)} can only be used with --reset-offsets.")
    if ns.all_groups and (ns.reset_offsets or ns.delete_offsets):
        raise UsageError("Option --all-groups cannot be used with --reset-offsets or --delete-offsets.")

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
        if not ns.group or not ns.topic:
            raise UsageError("Option --delete-offsets takes the following options: --group, --topic")
        if len(set(ns.group)) > 1:
            raise UsageError("Option --delete-offsets supports one share group at a time.")
    if ns.reset_offsets:
        if ns.dry_run and ns.execute:
            raise UsageError("Option --reset-offsets only accepts one of --execute and --dry-run")
        if not ns.dry_run and not ns.execute:
            raise UsageError("Option --reset-offsets takes the option: --execute or --dry-run")
        if not ns.group:
            raise UsageError("Option --reset-offsets takes the option: --group")
        if len(set(ns.group)) > 1:
            raise UsageError("Option --reset-offsets supports one share group at a time.")
        if len(scenarios) != 1:
            raise UsageError("Option --reset-offsets takes exactly one of these options: --to-earliest, "
                             "--to-latest, --to-current, --to-datetime, --by-duration, --to-offset, --shift-by, "
                             "--from-file")
        if ns.from_file is not None and (ns.topic or ns.all_topics):
            raise UsageError("Option --from-file cannot be used with --topic or --all-topics.")
        if ns.topic and ns.all_topics:
            raise UsageError("Option --reset-offsets takes either --topic or --all-topics, not both.")
        # Check the time formats now, before anything is sent.
        if ns.to_datetime is not None:
            parse_datetime_ms(ns.to_datetime)
        if ns.by_duration is not None:
            parse_duration_ms(ns.by_duration)


def parse_states(text: str) -> list[str]:
    """Comma-separated share-group states, any case, as the broker spells them."""
    by_lower = {s.lower(): s for s in SHARE_GROUP_STATES}
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s.lower() not in by_lower]
    if unknown:
        raise UsageError(f"Invalid state list '{text}'. Valid states are: {', '.join(SHARE_GROUP_STATES)}")
    return [by_lower[s.lower()] for s in names]


def _table(rows: Sequence[Sequence[object]], widths: Sequence[int]) -> list[str]:
    """Left-aligned columns as Kafka's tools print them: each column padded to its width, the last unpadded."""
    out = []
    for row in rows:
        cells = [f"{str(cell):<{width}}" for cell, width in zip(row[:-1], widths, strict=False)]
        out.append(" ".join([*cells, str(row[-1])]))
    return out


def _width(minimum: int, values: Iterable[object]) -> int:
    return max([minimum, *(len(str(v)) for v in values)])


class ShareGroupService:
    def __init__(self, admin: AsyncAdmin, ns: argparse.Namespace):
        self.admin = admin
        self.ns = ns
        self.failed = False

    def error(self, message: str) -> None:
        self.failed = True
        print(f"Error: {message}", file=sys.stderr)

    async def share_group_ids(self) -> list[str]:
        return sorted(g.group_id for g in await self.admin.list_groups(types=["share"]))

    # ---- --list ---------------------------------------------------------------------------------------

    async def list_groups(self) -> None:
        if self.ns.state is None:
            for group_id in await self.share_group_ids():
                print(group_id)
            return
        states = parse_states(self.ns.state)
        listings = sorted(await self.admin.list_groups(types=["share"], states=states), key=lambda g: g.group_id)
        width = _width(15, (g.group_id for g in listings))
        rows = [("GROUP", "STATE"), *((g.group_id, g.state or "Unknown") for g in listings)]
        print("\n".join(_table(rows, [width])))

    # ---- --describe -----------------------------------------------------------------------------------

    async def describe(self) -> None:
        group_ids = await self.share_group_ids() if self.ns.all_groups else sorted(set(self.ns.group))
        descriptions = await self.admin.describe_share_groups(group_ids) if group_ids else {}
        for group_id in group_ids:
            description = descriptions.get(group_id)
            if description is None or description.error is not None:
                self._describe_failed(group_id, description)
            elif self.ns.members:
                self._print_members(description)
            elif self.ns.state is not None:
                await self._print_state(description)
            else:
                await self._print_offsets(description)

    def _describe_failed(self, group_id: str, description: ShareGroupDescription | None) -> None:
        error = description.error if description is not None else None
        if error is None or error.code == ErrorCode.GROUP_ID_NOT_FOUND:
            self.error(f"Share group '{group_id}' does not exist.")
        else:
            self.error(f"Describing share group '{group_id}' failed: {error}")

    def _has_members_to_show(self, d: ShareGroupDescription, rows: int) -> bool:
        if d.state == "Dead":
            self.error(f"Share group '{d.group_id}' does not exist.")
        elif d.state == "Empty":
            print(f"\nShare group '{d.group_id}' has no active members.", file=sys.stderr)
        return d.state != "Dead" and rows > 0

    async def _print_offsets(self, d: ShareGroupDescription) -> None:
        try:
            offsets = await self.admin.list_share_group_offsets(d.group_id)
        except KafkaError as exc:
            self.error(f"Listing the offsets of share group '{d.group_id}' failed: {exc}")
            return
        infos: list[SharePartitionOffset] = sorted(offsets.values(), key=lambda o: (o.topic, o.partition))
        if not infos:
            print(f"\nShare group '{d.group_id}' has no offset information.")
            return

        def known(value: int) -> object:
            return MISSING if value < 0 else value

        verbose = self.ns.verbose
        header = ["GROUP", "TOPIC", "PARTITION", *(["LEADER-EPOCH"] if verbose else []), "START-OFFSET", "LAG"]
        rows: list[Sequence[object]] = [header]
        for o in infos:
            epoch = [known(o.leader_epoch)] if verbose else []
            rows.append([d.group_id, o.topic, o.partition, *epoch, known(o.start_offset), known(o.lag)])
        widths = [_width(15, [d.group_id]), _width(15, (o.topic for o in infos)), 10, *([13] if verbose else []), 13]
        print()
        print("\n".join(_table(rows, widths)))

    def _print_members(self, d: ShareGroupDescription) -> None:
        members = sorted(d.members, key=lambda m: m.member_id)
        if not self._has_members_to_show(d, len(members)):
            return
        verbose = self.ns.verbose
        header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", *(["MEMBER-EPOCH"] if verbose else []),
                  "ASSIGNMENT"]
        rows: list[Sequence[object]] = [header]
        for m in members:
            epoch = [m.member_epoch] if verbose else []
            rows.append([d.group_id, m.member_id, m.client_host, m.client_id, len(m.assignment), *epoch,
                         assignment_string(m.assignment)])
        widths = [
            _width(15, [d.group_id]),
            _width(15, (m.member_id for m in members)),
            _width(15, (m.client_host for m in members)),
            _width(15, (m.client_id for m in members)),
            12,
            *([13] if verbose else []),
        ]
        print()
        print("\n".join(_table(rows, widths)))

    async def _print_state(self, d: ShareGroupDescription) -> None:
        self._has_members_to_show(d, 1)
        if d.state == "Dead":
            return
        node = await self.admin.cluster.find_coordinator(d.group_id)
        host, port = self.admin.cluster.brokers.get(node, ("unknown", -1))
        # Two spaces before the id, as Kafka's tool prints the coordinator.
        coordinator = f"{host}:{port}  ({node})"
        if self.ns.verbose:
            rows: list[Sequence[object]] = [
                ("GROUP", "COORDINATOR (ID)", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "#MEMBERS"),
                (d.group_id, coordinator, d.state, d.group_epoch, d.assignment_epoch, len(d.members)),
            ]
            widths = [_width(15, [d.group_id]), _width(25, [coordinator]), 15, 12, 17]
        else:
            rows = [("GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"), (d.group_id, coordinator, d.state, len(d.members))]
            widths = [_width(15, [d.group_id]), _width(25, [coordinator]), 15]
        dlq = await self._dead_letter_topic(d.group_id)
        if dlq:
            # KIP-1191: the group's dead-letter topic, shown only when one is configured.
            widths.append(_width(len(str(rows[0][-1])), [rows[1][-1]]))  # the column before is padded now
            rows = [(*rows[0], "DLQ-TOPIC"), (*rows[1], dlq)]
        print()
        print("\n".join(_table(rows, widths)))

    async def _dead_letter_topic(self, group_id: str) -> str:
        try:
            described = await self.admin.describe_configs(RESOURCE_GROUP, group_id, [DLQ_TOPIC_CONFIG])
        except KafkaError:
            return ""
        entry = described.entries.get(DLQ_TOPIC_CONFIG)
        return entry.value or "" if entry is not None and described.error is None else ""

    # ---- --delete -------------------------------------------------------------------------------------

    async def delete_groups(self) -> None:
        listings = {g.group_id: g for g in await self.admin.list_groups(types=["share"])}
        group_ids = sorted(listings) if self.ns.all_groups else list(dict.fromkeys(self.ns.group))
        failures: dict[str, str] = {}
        for group_id in group_ids:
            listing = listings.get(group_id)
            if listing is None:
                failures[group_id] = f"Group '{group_id}' is not a share group."
            elif listing.state == "Dead":
                failures[group_id] = f"Share group '{group_id}' group state is DEAD."
            elif listing.state != "Empty":
                failures[group_id] = f"Share group '{group_id}' is not EMPTY."
        to_delete = [g for g in group_ids if g not in failures]
        results = await self.admin.delete_groups(to_delete) if to_delete else {}
        deleted = [g for g in to_delete if results.get(g) is None and g in results]
        for group_id in to_delete:
            if group_id not in results:
                failures[group_id] = "the broker did not answer for this group"
            elif results[group_id] is not None:
                failures[group_id] = str(results[group_id])

        def quoted(groups: Iterable[str]) -> str:
            return ", ".join(f"'{g}'" for g in groups)

        if not failures:
            print(f"Deletion of requested share groups ({quoted(deleted)}) was successful.")
            return
        self.error("Deletion of some share groups failed:")
        for group_id, reason in failures.items():
            print(f"* Group '{group_id}' could not be deleted due to: {reason}", file=sys.stderr)
        if deleted:
            print(f"\nThese share groups were deleted successfully: {quoted(deleted)}")

    # ---- --delete-offsets -----------------------------------------------------------------------------

    async def delete_offsets(self) -> None:
        group_id = self.ns.group[0]
        topics = list(dict.fromkeys(self.ns.topic))
        try:
            results = await self.admin.delete_share_group_offsets(group_id, topics)
        except KafkaError as exc:
            self.error(_group_error(group_id, exc))
            return
        width = _width(15, topics)
        rows: list[Sequence[object]] = [("TOPIC", "STATUS")]
        for topic in sorted(topics):
            error = results.get(topic)
            if topic not in results:
                self.failed = True
                rows.append((topic, "Error: the broker did not answer for this topic"))
            elif error is not None:
                self.failed = True
                rows.append((topic, f"Error: {error.message or error.name}"))
            else:
                rows.append((topic, "Successful"))
        print()
        print("\n".join(_table(rows, [width])))

    # ---- --reset-offsets ------------------------------------------------------------------------------

    async def reset_offsets(self) -> None:
        group_id = self.ns.group[0]
        description = (await self.admin.describe_share_groups([group_id])).get(group_id)
        error = description.error if description is not None else None
        if error is not None and error.code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise ToolError(f"Describing share group '{group_id}' failed: {error}")
        if description is not None and error is None and description.state not in ("Empty", "Dead"):
            # Offsets may only move while no consumer holds records of the group.
            raise ToolError(f"Share group '{group_id}' is not empty.")
        plan = read_reset_plan(self.ns.from_file) if self.ns.from_file is not None else None
        partitions = sorted(plan) if plan is not None else await self._partitions_to_reset(group_id)
        if not partitions:
            print(f"\nShare group '{group_id}' has no offset information to reset; name topics with --topic.",
                  file=sys.stderr)
            return
        offsets = plan if plan is not None else await self._target_offsets(group_id, partitions)
        if self.ns.execute:
            try:
                results = await self.admin.alter_share_group_offsets(group_id, offsets)
            except KafkaError as exc:
                raise ToolError(_group_error(group_id, exc)) from None
            for (topic, partition), err in sorted(results.items()):
                if err is not None:
                    self.error(f"Resetting {topic}-{partition} failed: {err}")
                    offsets.pop((topic, partition), None)
        if self.ns.export:
            print("\n".join(f"{t},{p},{o}" for (t, p), o in sorted(offsets.items())))
            return
        width_group = _width(30, [group_id])
        width_topic = _width(30, (t for t, _ in offsets))
        rows: list[Sequence[object]] = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
        rows += [(group_id, t, p, o) for (t, p), o in sorted(offsets.items())]
        print()
        print("\n".join(_table(rows, [width_group, width_topic, 10])))

    async def _partitions_to_reset(self, group_id: str) -> list[TopicPartition]:
        if not self.ns.topic:
            try:
                current = await self.admin.list_share_group_offsets(group_id)
            except KafkaError as exc:
                if exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
                    return []
                raise
            return sorted(current)
        counts = await self.admin.list_topics()
        wanted: list[TopicPartition] = []
        missing: list[str] = []
        for spec in dict.fromkeys(self.ns.topic):
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

    async def _target_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        ns = self.ns
        if ns.to_current or ns.shift_by is not None:
            current = await self._current_offsets(group_id, partitions)
            if ns.to_current:
                return current
            return await self._clamped(partitions, {tp: o + ns.shift_by for tp, o in current.items()})
        if ns.to_earliest or ns.to_latest:
            return await self._list_offsets(partitions, "earliest" if ns.to_earliest else "latest")
        if ns.to_datetime is not None or ns.by_duration is not None:
            if ns.to_datetime is not None:
                timestamp = parse_datetime_ms(ns.to_datetime)
            else:
                timestamp = int(time.time() * 1000) - parse_duration_ms(ns.by_duration)
            found = await self._list_offsets(partitions, timestamp)
            # No record at or after the time: the partition's end, as Kafka's tool resets then.
            beyond = [tp for tp, o in found.items() if o < 0]
            if beyond:
                found.update(await self._list_offsets(beyond, "latest"))
            return found
        return await self._clamped(partitions, dict.fromkeys(partitions, ns.to_offset))

    async def _current_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's start offsets; a partition without one starts where the log starts, as Kafka's tool."""
        try:
            listed = await self.admin.list_share_group_offsets(group_id)
        except KafkaError as exc:
            if exc.code != ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            listed = {}
        out = {tp: listed[tp].start_offset for tp in partitions if tp in listed and listed[tp].start_offset >= 0}
        missing = [tp for tp in partitions if tp not in out]
        if missing:
            out.update(await self._list_offsets(missing, "earliest"))
        return out

    async def _clamped(self, partitions: list[TopicPartition], wanted: dict[TopicPartition, int]
                       ) -> dict[TopicPartition, int]:
        earliest = await self._list_offsets(partitions, "earliest")
        latest = await self._list_offsets(partitions, "latest")
        out = {}
        for tp in partitions:
            target = wanted[tp]
            if target > latest[tp]:
                print(f"New offset ({target}) is higher than latest offset for topic partition {tp[0]}-{tp[1]}. "
                      f"Value will be set to {latest[tp]}", file=sys.stderr)
                target = latest[tp]
            elif target < earliest[tp]:
                print(f"New offset ({target}) is lower than earliest offset for topic partition {tp[0]}-{tp[1]}. "
                      f"Value will be set to {earliest[tp]}", file=sys.stderr)
                target = earliest[tp]
            out[tp] = target
        return out

    async def _list_offsets(self, partitions: list[TopicPartition], spec: str | int) -> dict[TopicPartition, int]:
        listed = await self.admin.list_offsets({tp: spec for tp in partitions})
        out = {}
        for tp in partitions:
            entry = listed.get(tp)
            if entry is None or entry.error is not None:
                reason = entry.error if entry is not None else "no answer"
                raise ToolError(f"Listing offsets of {tp[0]}-{tp[1]} failed: {reason}")
            out[tp] = entry.offset
        return out


def read_reset_plan(path: str) -> dict[TopicPartition, int]:
    """A --from-file plan: one topic,partition,offset line per partition (Kafka's --export format)."""
    plan: dict[TopicPartition, int] = {}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise ToolError(f"Cannot read {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            raise ToolError(f"{path}:{number}: expected topic,partition,offset but got {line!r}")
        try:
            plan[(fields[0], int(fields[1]))] = int(fields[2])
        except ValueError:
            raise ToolError(f"{path}:{number}: partition and offset must be numbers: {line!r}") from None
    return plan


def assignment_string(assignment: Iterable[TopicPartition]) -> str:
    """`topic:0,1,2;other:0` with topics and partitions sorted, as Kafka's tool shows an assignment."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    return ";".join(f"{t}:{','.join(str(p) for p in sorted(ps))}" for t, ps in sorted(by_topic.items()))


def _group_error(group_id: str, exc: KafkaError) -> str:
    if exc.code == ErrorCode.NON_EMPTY_GROUP:
        return f"Share group '{group_id}' is not empty."
    if exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
        return f"Share group '{group_id}' does not exist."
    return f"{exc.message or exc.name} ({exc.name})"


async def run(ns: argparse.Namespace) -> int:
    props = load_properties(ns.command_config) if ns.command_config else {}
    settings = split_settings(props)
    warn_ignored(settings)
    admin = AsyncAdmin(
        ns.bootstrap_server,
        client_id=settings.client_id or PROG,
        request_timeout_ms=ns.timeout,
        config=settings.connection,
    )
    service = ShareGroupService(admin, ns)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        check_args(ns)
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    try:
        return asyncio.run(run(ns))
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    except (ToolError, ToolConfigError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
    except ValueError as exc:  # client settings the bundled client refuses
        print(f"Error: invalid client configuration: {exc}", file=sys.stderr)
    except KafkaError as exc:
        print(f"Error: Executing share group command failed due to {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
