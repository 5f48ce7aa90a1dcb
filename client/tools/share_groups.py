"""`kafka-share-groups`: list, describe, reset offsets of, delete offsets of, and delete share groups.

Options and printed columns follow Apache Kafka's `kafka-share-groups.sh`, so scripts written for it work
against Shoal. It talks to the broker through the bundled admin client (`AsyncAdmin`). Unlike Kafka's tool,
every failure ends with a non-zero exit code and error text goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shoal.client.admin import AsyncAdmin, ShareGroupDescription, SharePartitionOffset, TopicPartition
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import (
    ToolParser,
    UsageError,
)
from shoal.client.tools.group_offsets import (
    ToolError,
    assignment_string,
    check_group_args,
    group_parser,
    named_partitions,
    parse_states,
    report_deletions,
    table,
    target_offsets,
    tool_main,
    width,
)
from shoal.protocol.errors import ErrorCode

PROG = "kafka-share-groups"
DEFAULT_TIMEOUT_MS = 30_000
SHARE_GROUP_STATES = ("Empty", "Stable", "Dead")
MISSING = "-"  # what Kafka's tool prints for an unknown value
RESET_SCENARIOS = ("to_earliest", "to_latest", "to_datetime", "by_duration", "to_offset")


def build_parser() -> ToolParser:
    return group_parser(PROG, "This tool helps to list, describe, reset and delete share groups.", "share",
                        DEFAULT_TIMEOUT_MS)


def check_args(ns: argparse.Namespace) -> None:
    """Option combinations Kafka's tool refuses, refused here with the same meaning."""
    check_group_args(ns, RESET_SCENARIOS, (), "share group")
    if ns.all_groups and (ns.reset_offsets or ns.delete_offsets):
        raise UsageError("Option --all-groups cannot be used with --reset-offsets or --delete-offsets.")
    if ns.reset_offsets:
        if not ns.dry_run and not ns.execute:
            raise UsageError("Option --reset-offsets takes the option: --execute or --dry-run")
        if not ns.group:
            raise UsageError("Option --reset-offsets takes the option: --group")
        if len(set(ns.group)) > 1:
            raise UsageError("Option --reset-offsets supports one share group at a time.")


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
        states = parse_states(self.ns.state, SHARE_GROUP_STATES)
        listings = sorted(await self.admin.list_groups(types=["share"], states=states), key=lambda g: g.group_id)
        group_width = width(15, (g.group_id for g in listings))
        rows = [("GROUP", "STATE"), *((g.group_id, g.state or "Unknown") for g in listings)]
        print("\n".join(table(rows, [group_width])))

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
        if self.ns.verbose:
            rows: list[Sequence[object]] = [
                ("GROUP", "COORDINATOR (ID)", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "#MEMBERS"),
                (d.group_id, coordinator, d.state, d.group_epoch, d.assignment_epoch, len(d.members)),
            ]
            widths = [width(15, [d.group_id]), width(25, [coordinator]), 15, 12, 17]
        else:
            rows = [("GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"), (d.group_id, coordinator, d.state, len(d.members))]
            widths = [width(15, [d.group_id]), width(25, [coordinator]), 15]
        print()
        print("\n".join(table(rows, widths)))

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
        for group_id in to_delete:
            if group_id not in results:
                failures[group_id] = "the broker did not answer for this group"
            elif results[group_id] is not None:
                failures[group_id] = str(results[group_id])
        if not report_deletions("share", group_ids, failures):
            self.failed = True

    # ---- --delete-offsets -----------------------------------------------------------------------------

    async def delete_offsets(self) -> None:
        group_id = self.ns.group[0]
        topics = list(dict.fromkeys(self.ns.topic))
        try:
            results = await self.admin.delete_share_group_offsets(group_id, topics)
        except KafkaError as exc:
            self.error(_group_error(group_id, exc))
            return
        topic_width = width(15, topics)
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
        print("\n".join(table(rows, [topic_width])))

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
        partitions = await self._partitions_to_reset(group_id)
        if not partitions:
            print(f"\nShare group '{group_id}' has no offset information to reset; name topics with --topic.",
                  file=sys.stderr)
            return
        offsets = await target_offsets(self.admin, self.ns, partitions)
        if self.ns.execute:
            try:
                results = await self.admin.alter_share_group_offsets(group_id, offsets)
            except KafkaError as exc:
                raise ToolError(_group_error(group_id, exc)) from None
            for (topic, partition), err in sorted(results.items()):
                if err is not None:
                    self.error(f"Resetting {topic}-{partition} failed: {err}")
                    offsets.pop((topic, partition), None)
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
