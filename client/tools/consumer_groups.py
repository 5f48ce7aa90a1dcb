"""`kafka-consumer-groups`: list, describe, reset offsets of, delete offsets of, and delete consumer groups.

Options and printed columns follow Apache Kafka's `kafka-consumer-groups.sh`, so scripts written for it
work against Shoal. It talks to the broker through the bundled admin client (`AsyncAdmin`). Every
failure ends with a non-zero exit code and error text goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from shoal.client.admin import ConsumerGroupDescription, TopicPartition
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import (
    ToolParser,
    UsageError,
)
from shoal.client.tools.group_offsets import (
    GroupServiceBase,
    ToolError,
    assignment_string,
    check_group_args,
    group_parser,
    listed_offsets,
    named_partitions,
    parse_states,
    report_deletions,
    table,
    target_offsets,
    tool_main,
    width,
)
from shoal.protocol.errors import ErrorCode

PROG = "kafka-consumer-groups"
DEFAULT_TIMEOUT_MS = 5000
GROUP_STATES = ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty")
MISSING = "-"
RESET_SCENARIOS = ("to_earliest", "to_latest", "to_current", "to_datetime", "by_duration", "to_offset", "shift_by",
                   "from_file")
INACTIVE = ("Empty", "Dead")


def build_parser() -> ToolParser:
    p = group_parser(PROG, "This tool helps to list, describe, reset and delete consumer groups.", "consumer",
                     DEFAULT_TIMEOUT_MS)
    p.add_argument("--export", action="store_true", help="With --reset-offsets: print the result as CSV.")
    p.add_argument("--to-current", action="store_true", help="Reset to the current committed offset.")
    p.add_argument("--shift-by", type=int, metavar="<number-of-offsets>",
                   help="Move the committed offsets by this many (negative moves back).")
    p.add_argument("--from-file", metavar="<path to CSV file>", help="Reset to the offsets in a CSV: topic,partition,offset.")
    return p


def check_args(ns: argparse.Namespace) -> None:
    """Option combinations Kafka's tool refuses, refused here with the same meaning."""
    check_group_args(ns, RESET_SCENARIOS, ("export",), "consumer group")
    if ns.reset_offsets:
        if not ns.group and not ns.all_groups:
            raise UsageError("Option --reset-offsets takes one of these options: --group, --all-groups")
        if not ns.topic and not ns.all_topics and not ns.from_file:
            raise UsageError("Option --reset-offsets takes one of these options: --topic, --all-topics")


def read_offsets_file(path: str) -> dict[TopicPartition, int]:
    """`topic,partition,offset` per line, as `--reset-offsets --export` writes it."""
    out: dict[TopicPartition, int] = {}
    try:
        with Path(path).open(newline="") as f:
            for row in csv.reader(f):
                if not row or not "".join(row).strip():
                    continue
                if len(row) != 3:
                    raise UsageError(f"--from-file {path}: each line must be topic,partition,offset, got {row!r}")
                out[(row[0].strip(), int(row[1]))] = int(row[2])
    except OSError as exc:
        raise ToolError(f"Cannot read {path}: {exc}") from None
    except ValueError:
        raise UsageError(f"--from-file {path}: partitions and offsets must be numbers") from None
    return out


class ConsumerGroupService(GroupServiceBase):
    GROUP_TYPES = ("classic", "consumer")

    # ---- --list ---------------------------------------------------------------------------------------

    async def list_groups(self) -> None:
        if self.ns.state is None:
            for group_id in await self.group_ids():
                print(group_id)
            return
        states = parse_states(self.ns.state, GROUP_STATES) if self.ns.state else []
        listings = sorted(await self.admin.list_groups(types=["classic", "consumer"], states=states),
                          key=lambda g: g.group_id)
        rows = [("GROUP", "STATE"), *((g.group_id, g.state or "Unknown") for g in listings)]
        print("\n".join(table(rows, [width(15, (g.group_id for g in listings))])))

    # ---- --describe -----------------------------------------------------------------------------------

    async def describe(self) -> None:
        group_ids = await self.group_ids() if self.ns.all_groups else list(dict.fromkeys(self.ns.group))
        descriptions = await self.admin.describe_consumer_groups(group_ids) if group_ids else {}
        for group_id in group_ids:
            d = descriptions.get(group_id)
            if d is None or d.error is not None and d.error.code != ErrorCode.GROUP_ID_NOT_FOUND:
                self.error(f"Describing consumer group '{group_id}' failed: {d.error if d else 'no answer'}")
            elif d.state == "Dead" or d.error is not None:
                self.error(f"Consumer group '{group_id}' does not exist.")
            elif self.ns.members:
                self._print_members(d)
            elif self.ns.state is not None:
                await self._print_state(d)
            else:
                await self._print_offsets(d)

    def _no_active_members(self, d: ConsumerGroupDescription) -> None:
        if d.state == "Empty":
            print(f"\nConsumer group '{d.group_id}' has no active members.", file=sys.stderr)
        elif d.state in ("PreparingRebalance", "CompletingRebalance"):
            print(f"\nWarning: Consumer group '{d.group_id}' is rebalancing.", file=sys.stderr)

    async def _print_offsets(self, d: ConsumerGroupDescription) -> None:
        self._no_active_members(d)
        try:
            committed = await self.admin.list_consumer_group_offsets(d.group_id)
        except KafkaError as exc:
            self.error(f"Listing the offsets of consumer group '{d.group_id}' failed: {exc}")
            return
        owner = {tp: m for m in d.members for tp in m.assignment}
        partitions = sorted(set(committed) | set(owner))
        if not partitions:
            print(f"\nConsumer group '{d.group_id}' has no offset information.", file=sys.stderr)
            return
        ends = await listed_offsets(self.admin, partitions, "latest")
        rows: list[Sequence[object]] = [("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                         "CONSUMER-ID", "HOST", "CLIENT-ID")]
        for tp in partitions:
            current = committed.get(tp)
            member = owner.get(tp)
            lag = MISSING if current is None else max(0, ends[tp] - current)
            rows.append((d.group_id, tp[0], tp[1], MISSING if current is None else current, ends[tp], lag,
                         member.member_id if member else MISSING, member.client_host if member else MISSING,
                         member.client_id if member else MISSING))
        widths = [width(15, [d.group_id]), width(15, (t for t, _ in partitions)), 10, 15, 15, 15,
                  width(15, (r[6] for r in rows[1:])), width(15, (r[7] for r in rows[1:]))]
        print()
        print("\n".join(table(rows, widths)))

    def _print_members(self, d: ConsumerGroupDescription) -> None:
        self._no_active_members(d)
        members = sorted(d.members, key=lambda m: m.member_id)
        if not members:
            return
        verbose = self.ns.verbose
        rows: list[Sequence[object]] = [("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                                         *(["ASSIGNMENT"] if verbose else []))]
        for m in members:
            rows.append((d.group_id, m.member_id, m.client_host, m.client_id, len(m.assignment),
                         *([assignment_string(m.assignment) or MISSING] if verbose else [])))
        widths = [width(15, [d.group_id]), width(15, (m.member_id for m in members)),
                  width(15, (m.client_host for m in members)), width(15, (m.client_id for m in members)), 12]
        print()
        print("\n".join(table(rows, widths)))

    async def _print_state(self, d: ConsumerGroupDescription) -> None:
        self._no_active_members(d)
        node = await self.admin.cluster.find_coordinator(d.group_id)
        host, port = self.admin.cluster.brokers.get(node, ("unknown", -1))
        coordinator = f"{host}:{port}  ({node})"
        rows = [("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                (d.group_id, coordinator, d.protocol or "", d.state, len(d.members))]
        print()
        print("\n".join(table(rows, [width(15, [d.group_id]), width(25, [coordinator]), 20, 15])))

    # ---- --delete -------------------------------------------------------------------------------------

    async def delete_groups(self) -> None:
        group_ids = await self.group_ids() if self.ns.all_groups else list(dict.fromkeys(self.ns.group))
        results = await self.admin.delete_groups(group_ids) if group_ids else {}
        failures: dict[str, str] = {}
        for group_id in group_ids:
            error = results.get(group_id)
            if group_id not in results:
                failures[group_id] = "the broker did not answer for this group"
            elif error is not None:
                failures[group_id] = (f"Group '{group_id}' is not empty." if error.code == ErrorCode.NON_EMPTY_GROUP
                                      else f"Group '{group_id}' does not exist."
                                      if error.code == ErrorCode.GROUP_ID_NOT_FOUND else str(error))
        if not report_deletions("consumer", group_ids, failures):
            self.failed = True

    # ---- --delete-offsets -----------------------------------------------------------------------------

    async def delete_offsets(self) -> None:
        group_id = self.ns.group[0]
        partitions = await named_partitions(self.admin, self.ns.topic)
        try:
            results = await self.admin.delete_consumer_group_offsets(group_id, partitions)
        except KafkaError as exc:
            if exc.code == ErrorCode.GROUP_ID_NOT_FOUND:
                raise ToolError(f"Consumer group '{group_id}' does not exist.") from None
            if exc.code == ErrorCode.NON_EMPTY_GROUP:
                raise ToolError(f"Consumer group '{group_id}' is not empty.") from None
            raise
        rows: list[Sequence[object]] = [("TOPIC", "PARTITION", "STATUS")]
        for tp in partitions:
            error = results.get(tp)
            if error is not None:
                self.failed = True
                status = ("Error: The consumer group is subscribed to the topic"
                          if error.code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC else f"Error: {error}")
            else:
                status = "Successful" if tp in results else "Error: the broker did not answer"
            rows.append((tp[0], tp[1], status))
        print()
        print("\n".join(table(rows, [width(15, (t for t, _ in partitions)), 10])))

    # ---- --reset-offsets ------------------------------------------------------------------------------

    async def reset_offsets(self) -> None:
        if not self.ns.execute and not self.ns.dry_run:
            print("Warning: neither --execute nor --dry-run was given; nothing is changed (a dry run).",
                  file=sys.stderr)
        group_ids = await self.group_ids() if self.ns.all_groups else list(dict.fromkeys(self.ns.group))
        self.ns.file_offsets = read_offsets_file(self.ns.from_file) if self.ns.from_file else {}
        descriptions = await self.admin.describe_consumer_groups(group_ids) if group_ids else {}
        results: list[tuple[str, dict[TopicPartition, int]]] = []
        for group_id in group_ids:
            d = descriptions.get(group_id)
            state = "Dead" if d is None or d.error is not None else d.state
            if state not in INACTIVE:
                self.error(f"Assignments can only be reset if the group '{group_id}' is inactive, but the current "
                           f"state is {state}.")
                continue
            committed = await self.admin.list_consumer_group_offsets(group_id) if state != "Dead" else {}
            if self.ns.from_file:
                partitions = sorted(self.ns.file_offsets)
            elif self.ns.all_topics:
                partitions = sorted(committed)
            else:
                partitions = await named_partitions(self.admin, self.ns.topic)
            if not partitions:
                continue
            offsets = await target_offsets(self.admin, self.ns, partitions, committed)
            if self.ns.execute:
                errors = await self.admin.alter_consumer_group_offsets(group_id, offsets)
                for tp, err in sorted(errors.items()):
                    if err is not None:
                        self.error(f"Resetting {tp[0]}-{tp[1]} of group '{group_id}' failed: {err}")
                        offsets.pop(tp, None)
            results.append((group_id, offsets))
        if self.ns.export:
            for _group_id, offsets in results:
                for (topic, partition), offset in sorted(offsets.items()):
                    print(f"{topic},{partition},{offset}")
            return
        for group_id, offsets in results:
            rows: list[Sequence[object]] = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
            rows += [(group_id, t, p, o) for (t, p), o in sorted(offsets.items())]
            print()
            print("\n".join(table(rows, [width(30, [group_id]), width(30, (t for t, _ in offsets)), 10])))


def main(argv: Sequence[str] | None = None) -> int:
    return tool_main(argv, build_parser(), check_args, PROG, ConsumerGroupService, "consumer group")


if __name__ == "__main__":
    sys.exit(main())
