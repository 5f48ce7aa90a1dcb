"""`kafka-share-groups`: list, describe, reset offsets of, delete offsets of, and delete share groups.

Options and printed columns follow Apache Kafka's `kafka-share-groups.sh`, so scripts written for it work
against Shoal; `--describe --state` adds one last column, DLQ-TOPIC (the group's KIP-1191 dead-letter topic). It talks to the broker through the bundled admin client (`AsyncAdmin`). Unlike Kafka's tool,
every failure ends with a non-zero exit code and error text goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence

from shoal.client.admin import (
    RESOURCE_GROUP,
    ShareGroupDescription,
    SharePartitionOffset,
    TopicPartition,
)
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import (
    ToolParser,
    UsageError,
    parse_datetime_ms,
    parse_duration_ms,
)
from shoal.client.tools.group_offsets import (
    GroupServiceBase,
    ToolError,
    assignment_string,
    check_group_args,
    clamp_to_log,
    group_parser,
    listed_offsets,
    named_partitions,
    parse_states,
    table,
    tool_main,
    width,
)
from shoal.protocol.errors import ErrorCode

PROG = "kafka-share-groups"
DEFAULT_TIMEOUT_MS = 30_000
SHARE_GROUP_STATES = ("Empty", "Stable", "Dead")
MISSING = "-"  # what Kafka's tool prints for an unknown value
DLQ_TOPIC_CONFIG = "errors.deadletterqueue.topic.name"
RESET_SCENARIOS = ("to_earliest", "to_latest", "to_current", "to_datetime", "by_duration", "to_offset", "shift_by",
                   "from_file")


def build_parser() -> ToolParser:
    p = group_parser(PROG, "This tool helps to list, describe, reset and delete share groups.", "share",
                     DEFAULT_TIMEOUT_MS)
    # Kafka 4.4 (KAFKA-20524): the consumer-groups tool's remaining scenarios and its CSV plan.
    p.add_argument("--to-current", action="store_true", help="Reset to the current start offset.")
    p.add_argument("--shift-by", type=int, metavar="<number-of-offsets>",
                   help="Move the start offset by this many offsets (negative moves back), kept within the "
                        "partition's earliest and latest offsets.")
    p.add_argument("--from-file", metavar="<path to CSV file>",
                   help="Reset to the offsets in a CSV file of topic,partition,offset lines (as --export writes).")
    p.add_argument("--export", action="store_true",
                   help="With --reset-offsets: print the plan as CSV (topic,partition,offset) instead of a table.")
    return p


def check_args(ns: argparse.Namespace) -> None:
    """Option combinations Kafka's tool refuses, refused here with the same meaning."""
    check_group_args(ns, RESET_SCENARIOS, ("export",), "share group")
    if ns.all_groups and (ns.reset_offsets or ns.delete_offsets):
        raise UsageError("Option --all-groups cannot be used with --reset-offsets or --delete-offsets.")
    if ns.reset_offsets:
        if not ns.dry_run and not ns.execute:
            raise UsageError("Option --reset-offsets takes the option: --execute or --dry-run")
        if not ns.group:
            raise UsageError("Option --reset-offsets takes the option: --group")
        if len(set(ns.group)) > 1:
            raise UsageError("Option --reset-offsets supports one share group at a time.")
        if ns.from_file is not None and (ns.topic or ns.all_topics):
            raise UsageError("Option --from-file cannot be used with --topic or --all-topics.")


class ShareGroupService(GroupServiceBase):
    GROUP_TYPES = ("share",)

    # ---- --list ---------------------------------------------------------------------------------------

    async def list_groups(self) -> None:
        if self.ns.state is None:
            for group_id in await self.group_ids():
                print(group_id)
            return
        states = parse_states(self.ns.state, SHARE_GROUP_STATES)
        listings = sorted(await self.admin.list_groups(types=["share"], states=states), key=lambda g: g.group_id)
        col_width = width(15, (g.group_id for g in listings))
        rows = [("GROUP", "STATE"), *((g.group_id, g.state or "Unknown") for g in listings)]
        print("\n".join(table(rows, [col_width])))

    # ---- --describe -----------------------------------------------------------------------------------

    async def describe(self) -> None:
        group_ids = await self.group_ids() if self.ns.all_groups else sorted(set(self.ns.group))
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
        widths = [width(15, [d.group_id]), width(15, (o.topic for o in infos)), 10, *([13] if verbose else []), 13]
        print()
        print("\n".join(table(rows, widths)))

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
            width(15, [d.group_id]),
            width(15, (m.member_id for m in members)),
            width(15, (m.client_host for m in members)),
            width(15, (m.client_id for m in members)),
            12,
            *([13] if verbose else []),
        ]
        print()
        print("\n".join(table(rows, widths)))

    async def _print_state(self, d: ShareGroupDescription) -> None:
        self._has_members_to_show(d, 1)
        if d.state == "Dead":
            return
        node = await self.admin.cluster.find_coordinator(d.group_id)
        host, port = self.admin.cluster.brokers.get(node, ("unknown", -1))
        # Two spaces before the id, as Kafka's tool prints the coordinator.
        coordinator = f"{host}:{port}  ({node})"
        # DLQ-TOPIC (KIP-1191's group config) is a Shoal addition: Kafka 4.4's tool has no such column.
        dlq = await self._dead_letter_topic(d.group_id)
        if self.ns.verbose:
            rows: list[Sequence[object]] = [
                ("GROUP", "COORDINATOR (ID)", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "#MEMBERS", "DLQ-TOPIC"),
                (d.group_id, coordinator, d.state, d.group_epoch, d.assignment_epoch, len(d.members), dlq),
            ]
            widths = [width(15, [d.group_id]), width(25, [coordinator]), 15, 12, 17, 10]
        else:
            rows = [("GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS", "DLQ-TOPIC"),
                    (d.group_id, coordinator, d.state, len(d.members), dlq)]
            widths = [width(15, [d.group_id]), width(25, [coordinator]), 15, 10]
        print()
        print("\n".join(table(rows, widths)))

    async def _dead_letter_topic(self, group_id: str) -> str:
        """The group's `errors.deadletterqueue.topic.name` (DescribeConfigs on GROUP), `-` when unset or unknown."""
        try:
            described = await self.admin.describe_configs(RESOURCE_GROUP, group_id, [DLQ_TOPIC_CONFIG])
        except KafkaError as exc:
            return self._unknown_dead_letter_topic(group_id, exc)
        if described.error is not None:
            return self._unknown_dead_letter_topic(group_id, described.error)
        entry = described.entries.get(DLQ_TOPIC_CONFIG)
        return entry.value if entry is not None and entry.value else MISSING

    @staticmethod
    def _unknown_dead_letter_topic(group_id: str, error: KafkaError) -> str:
        # Only this extra column is unknown (e.g. no DESCRIBE_CONFIGS right): a warning, not a failure.
        print(f"Warning: the dead-letter topic of share group '{group_id}' is unknown: {error}", file=sys.stderr)
        return MISSING

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
        col_width = width(15, topics)
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
        print("\n".join(table(rows, [col_width])))

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
        width_group = width(30, [group_id])
        width_topic = width(30, (t for t, _ in offsets))
        rows: list[Sequence[object]] = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
        rows += [(group_id, t, p, o) for (t, p), o in sorted(offsets.items())]
        print()
        print("\n".join(table(rows, [width_group, width_topic, 10])))

    async def _partitions_to_reset(self, group_id: str) -> list[TopicPartition]:
        if not self.ns.topic:
            try:
                current = await self.admin.list_share_group_offsets(group_id)
            except KafkaError as exc:
                if exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
                    return []
                raise
            return sorted(current)
        return await named_partitions(self.admin, self.ns.topic)

    async def _target_offsets(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        ns = self.ns
        if ns.to_current or ns.shift_by is not None:
            current = await self._current_offsets(group_id, partitions)
            if ns.to_current:
                return current
            return await self._clamped(partitions, {tp: o + ns.shift_by for tp, o in current.items()})
        if ns.to_earliest or ns.to_latest:
            return await listed_offsets(self.admin, partitions, "earliest" if ns.to_earliest else "latest")
        if ns.to_datetime is not None or ns.by_duration is not None:
            if ns.to_datetime is not None:
                timestamp = parse_datetime_ms(ns.to_datetime)
            else:
                timestamp = int(time.time() * 1000) - parse_duration_ms(ns.by_duration)
            found = await listed_offsets(self.admin, partitions, timestamp)
            # No record at or after the time: the partition's end, as Kafka's tool resets then.
            beyond = [tp for tp, o in found.items() if o < 0]
            if beyond:
                found.update(await listed_offsets(self.admin, beyond, "latest"))
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
            out.update(await listed_offsets(self.admin, missing, "earliest"))
        return out

    async def _clamped(self, partitions: list[TopicPartition], wanted: dict[TopicPartition, int]
                       ) -> dict[TopicPartition, int]:
        earliest = await listed_offsets(self.admin, partitions, "earliest")
        latest = await listed_offsets(self.admin, partitions, "latest")
        return {tp: clamp_to_log(tp, wanted[tp], earliest[tp], latest[tp]) for tp in partitions}


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


def _group_error(group_id: str, exc: KafkaError) -> str:
    if exc.code == ErrorCode.NON_EMPTY_GROUP:
        return f"Share group '{group_id}' is not empty."
    if exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
        return f"Share group '{group_id}' does not exist."
    return f"{exc.message or exc.name} ({exc.name})"


def main(argv: Sequence[str] | None = None) -> int:
    return tool_main(argv, build_parser(), check_args, PROG, ShareGroupService, "share group")


if __name__ == "__main__":
    sys.exit(main())
