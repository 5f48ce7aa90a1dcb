"""`kafka-console-share-consumer`: read a topic through a share group and print each record on stdout.

Options follow Apache Kafka's `kafka-console-share-consumer.sh` (including its --property formatter switches
and `Delivery:<count>`), using the bundled share consumer. Every record is acknowledged explicitly after
it is printed: ACCEPT by default, or RELEASE / REJECT with --release, --reject or --acknowledge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from shoal.client.consumer.share_consumer import AcknowledgeType, AsyncShareConsumer, ShareRecord
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import ToolParser, UsageError, add_version, usage_failure
from shoal.client.tools.config import (
    ToolConfigError,
    load_properties,
    parse_key_values,
    split_settings,
    warn_ignored,
)

PROG = "kafka-console-share-consumer"
DEFAULT_GROUP = "console-share-consumer"
DEFAULT_CLIENT_ID = "console-share-consumer"
_TRUE = "true"
_TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


@dataclass(slots=True)
class RecordFormat:
    """Kafka's DefaultMessageFormatter switches (--property name=value)."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_delivery: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> RecordFormat:
        out = cls()
        flags = {
            "print.timestamp": "print_timestamp",
            "print.partition": "print_partition",
            "print.offset": "print_offset",
            "print.delivery": "print_delivery",
            "print.delivery.count": "print_delivery",  # accepted as a spelled-out alias
            "print.headers": "print_headers",
            "print.key": "print_key",
            "print.value": "print_value",
        }
        separators = {
            "key.separator": "key_separator",
            "line.separator": "line_separator",
            "headers.separator": "headers_separator",
            "null.literal": "null_literal",
        }
        for name, value in props.items():
            if name in flags:
                setattr(out, flags[name], value.strip().lower() == _TRUE)
            elif name in separators:
                setattr(out, separators[name], value.encode())
            else:
                raise UsageError(f"--property {name} is not a formatter property this tool knows")
        return out

    def render(self, r: ShareRecord) -> bytes:
        fields: list[bytes] = []
        if self.print_timestamp:
            kind = _TIMESTAMP_TYPES.get(r.timestamp_type)
            fields.append(f"{kind}:{r.timestamp}".encode() if kind and r.timestamp >= 0 else b"NO_TIMESTAMP")
        if self.print_partition:
            fields.append(f"Partition:{r.partition}".encode())
        if self.print_offset:
            fields.append(f"Offset:{r.offset}".encode())
        if self.print_delivery:
            fields.append(f"Delivery:{r.delivery_count}".encode())
        if self.print_headers:
            if r.headers:
                fields.append(self.headers_separator.join(
                    k.encode() + b":" + (v if v is not None else self.null_literal) for k, v in r.headers
                ))
            else:
                fields.append(b"NO_HEADERS")
        if self.print_key:
            fields.append(r.key if r.key is not None else self.null_literal)
        if self.print_value:
            fields.append(r.value if r.value is not None else self.null_literal)
        if not fields:
            return b""
        return self.key_separator.join(fields) + self.line_separator


def build_parser() -> ToolParser:
    p = ToolParser(prog=PROG, description="This tool helps to read data from Kafka topics using share groups and "
                                          "outputs it to standard output.")
    p.add_argument("--bootstrap-server", metavar="<server to connect to>", help="REQUIRED: The server(s) to connect to.")
    p.add_argument("--topic", metavar="<topic>", help="REQUIRED: The topic to consume from.")
    p.add_argument("--group", metavar="<share group id>",
                   help=f"The share group id of the consumer (default {DEFAULT_GROUP}).")
    # KIP-1147 (Kafka 4.2+) names first; the older names stay as deprecated aliases, as in Kafka.
    p.add_argument("--command-property", "--consumer-property", dest="consumer_property", action="append",
                   default=[], metavar="<consumer_prop>",
                   help="A consumer setting as key=value; takes precedence over the config file.")
    p.add_argument("--consumer-config", "--consumer.config", "--command-config", dest="consumer_config",
                   metavar="<config file>", help="Consumer config properties file.")
    p.add_argument("--formatter-property", "--property", dest="property", action="append", default=[],
                   metavar="<prop>",
                   help="Formatter properties: print.timestamp, print.key, print.offset, print.delivery, "
                        "print.partition, print.headers, print.value (true|false); key.separator, "
                        "line.separator, headers.separator, null.literal.")
    p.add_argument("--max-messages", type=int, metavar="<num_messages>",
                   help="Exit after this many messages. If not set, consumption is continual.")
    p.add_argument("--timeout-ms", type=int, metavar="<timeout_ms>",
                   help="Exit if no message arrives for this many milliseconds.")
    p.add_argument("--reject", action="store_true", help="Reject messages as they are consumed.")
    p.add_argument("--release", action="store_true", help="Release messages as they are consumed.")
    p.add_argument("--acknowledge", choices=("accept", "release", "reject"), type=str.lower,
                   help="How each consumed message is acknowledged (default accept).")
    add_version(p)
    return p


@dataclass(slots=True)
class Plan:
    topic: str
    group: str
    ack: AcknowledgeType
    fmt: RecordFormat
    max_messages: int | None
    timeout_ms: int | None
    client_id: str
    consumer_kwargs: dict[str, object]
    connection: dict[str, str]


def plan_from_args(ns: argparse.Namespace) -> Plan:
    if not ns.topic:
        raise UsageError("--topic is a required argument")
    if not ns.bootstrap_server:
        raise UsageError('Missing required argument "[bootstrap-server]"')
    chosen = [name for name, on in (("reject", ns.reject), ("release", ns.release)) if on]
    if ns.acknowledge:
        chosen.append(ns.acknowledge)
    if len(set(chosen)) > 1:
        raise UsageError("At most one of --reject, --release and --acknowledge may be specified.")
    ack = AcknowledgeType[chosen[0].upper()] if chosen else AcknowledgeType.ACCEPT
    if ns.max_messages is not None and ns.max_messages <= 0:
        raise UsageError("--max-messages must be positive")
    if ns.timeout_ms is not None and ns.timeout_ms <= 0:
        raise UsageError("--timeout-ms must be positive")
    props = load_properties(ns.consumer_config) if ns.consumer_config else {}
    props.update(parse_key_values(ns.consumer_property, "--consumer-property"))
    settings = split_settings(props, for_consumer=True)
    warn_ignored(settings)
    groups = {g for g in (ns.group, settings.group_id) if g}
    if len(groups) > 1:
        raise UsageError("The group ids provided in different places (directly using '--group', via "
                         "'--consumer-property', or via '--consumer-config') do not match. Detected group ids: "
                         + ", ".join(f"'{g}'" for g in sorted(groups)))
    kwargs = dict(settings.consumer)
    if kwargs.pop("acknowledgement_mode", "explicit") != "explicit":
        print("Warning: share.acknowledgement.mode is always explicit in this tool.", file=sys.stderr)
    if ns.max_messages is not None and "max_poll_records" not in kwargs:
        # Acquire no more than will be printed; records acquired beyond it would only be released again.
        kwargs["max_poll_records"] = min(500, ns.max_messages)
    return Plan(
        topic=ns.topic,
        group=groups.pop() if groups else DEFAULT_GROUP,
        ack=ack,
        fmt=RecordFormat.from_properties(parse_key_values(ns.property, "--property")),
        max_messages=ns.max_messages,
        timeout_ms=ns.timeout_ms,
        client_id=settings.client_id or DEFAULT_CLIENT_ID,
        consumer_kwargs=kwargs,
        connection=settings.connection,
    )


@dataclass(slots=True)
class Progress:
    printed: int = 0


async def consume(bootstrap: str, plan: Plan, out: BinaryIO, progress: Progress) -> None:
    """Print records until --max-messages or --timeout-ms says stop (or the task is cancelled)."""
    consumer = AsyncShareConsumer(
        bootstrap,
        plan.group,
        acknowledgement_mode="explicit",
        client_id=plan.client_id,
        config=plan.connection,
        **plan.consumer_kwargs,  # type: ignore[arg-type]  # split_settings gave each value its parameter's type (CONSUMER_KEYS)
    )
    try:
        await consumer.subscribe([plan.topic])
        last_record = time.monotonic()
        while plan.max_messages is None or progress.printed < plan.max_messages:
            wait = 1.0
            if plan.timeout_ms is not None:
                left = plan.timeout_ms / 1000 - (time.monotonic() - last_record)
                if left <= 0:
                    break
                wait = min(wait, left)
            records = await consumer.poll(wait)
            if records:
                last_record = time.monotonic()
            for record in records:
                if plan.max_messages is not None and progress.printed >= plan.max_messages:
                    break  # left unacknowledged: closing the session releases it
                out.write(plan.fmt.render(record))
                progress.printed += 1
                consumer.acknowledge(record, plan.ack)
            out.flush()
        # Settle what was printed before leaving (close() releases whatever else was acquired), and say
        # so if the brokers refused an acknowledgement.
        results = await consumer.commit_sync(consumer.config.request_timeout_ms / 1000)
        for (topic, partition), error in sorted(results.items()):
            if error is not None:
                print(f"Warning: acknowledging records of {topic}-{partition} failed: {error}", file=sys.stderr)
    finally:
        await consumer.close()


async def _run(bootstrap: str, plan: Plan, out: BinaryIO, progress: Progress) -> None:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        # SIGTERM ends consumption like Ctrl-C does: acknowledgements are sent and the group is left.
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    await consume(bootstrap, plan, out, progress)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        plan = plan_from_args(ns)
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    except ToolConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    progress = Progress()
    code = 0
    try:
        asyncio.run(_run(ns.bootstrap_server, plan, sys.stdout.buffer, progress))
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    except ValueError as exc:
        print(f"Error: invalid consumer configuration: {exc}", file=sys.stderr)
        code = 1
    except KafkaError as exc:
        print(f"Error processing message, terminating consumer process: {exc}", file=sys.stderr)
        code = 1
    print(f"Processed a total of {progress.printed} messages", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
