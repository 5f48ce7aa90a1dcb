"""`kafka-share-consumer-perf-test`: how fast share consumers of one group read a topic.

Options and output follow Apache Kafka's `kafka-share-consumer-perf-test.sh`, so numbers from both sit side
by side: one summary line `start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec,
data.consumed.in.nMsg, fetch.time.ms`. The `--threads` share consumers run on one event loop (Python's GIL
makes threads no faster here); records are acknowledged implicitly and committed at the end, as Kafka's tool
does.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shoal.client.consumer.share_consumer import AsyncShareConsumer
from shoal.client.errors import KafkaError
from shoal.client.tools.cli import ToolParser, UsageError, add_version, format_java_date, usage_failure
from shoal.client.tools.config import (
    ToolConfigError,
    load_properties,
    parse_key_values,
    split_settings,
    warn_ignored,
)

PROG = "kafka-share-consumer-perf-test"
HEADER = "start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg, fetch.time.ms"
DEFAULT_GROUP = "perf-share-consumer"
DEFAULT_CLIENT_ID = "perf-share-consumer-client"
MB = 1024 * 1024
POLL_S = 0.1  # Kafka's tool polls with a 100 ms timeout


def build_parser() -> ToolParser:
    p = ToolParser(prog=PROG, description="This tool is used to verify the share consumer performance.")
    p.add_argument("--bootstrap-server", metavar="<server to connect to>", help="REQUIRED. The server(s) to connect to.")
    p.add_argument("--topic", metavar="<topic>", help="REQUIRED: The topic to consume from.")
    p.add_argument("--group", default=DEFAULT_GROUP, metavar="<gid>",
                   help=f"The share group id to consume on (default {DEFAULT_GROUP}).")
    p.add_argument("--num-records", type=int, metavar="<count>", help="REQUIRED: The number of records to consume.")
    p.add_argument("--messages", type=int, metavar="<count>",
                   help="(DEPRECATED) The number of records to consume. Use --num-records instead.")
    p.add_argument("--threads", type=int, default=1, metavar="<count>",
                   help="The number of share consumers sharing the load (default 1).")
    p.add_argument("--fetch-size", type=int, default=MB, metavar="<size>",
                   help="The amount of data to fetch in a single request (fetch.max.bytes; default 1 MiB).")
    p.add_argument("--timeout", type=int, default=10_000, metavar="<milliseconds>",
                   help="The maximum allowed time in milliseconds between returned records (default 10000).")
    p.add_argument("--reporting-interval", type=int, default=5_000, metavar="<interval_ms>",
                   help="Interval in milliseconds at which to print progress info (default 5000).")
    p.add_argument("--show-detailed-stats", action="store_true",
                   help="Report stats for each reporting interval as configured by --reporting-interval.")
    p.add_argument("--show-consumer-stats", action="store_true", help="Report stats for each share consumer.")
    p.add_argument("--hide-header", action="store_true", help="Skip printing the header for the stats.")
    p.add_argument("--print-metrics", action="store_true", help="Print out the client metrics.")
    p.add_argument("--date-format", default="yyyy-MM-dd HH:mm:ss:SSS", metavar="<date format>",
                   help="java.text.SimpleDateFormat pattern for the time fields (default yyyy-MM-dd HH:mm:ss:SSS).")
    p.add_argument("--command-config", metavar="<config file>", help="Share consumer config properties file.")
    p.add_argument("--consumer.config", dest="consumer_config", metavar="<config file>",
                   help="(DEPRECATED) Share consumer config properties file. Use --command-config instead.")
    p.add_argument("--command-property", action="append", default=[], metavar="<prop1=val1>",
                   help="A share consumer setting such as client.id; takes precedence over the config file.")
    add_version(p)
    return p


@dataclass(slots=True)
class Options:
    bootstrap: str
    topic: str
    group: str
    num_records: int
    threads: int
    timeout_ms: int
    reporting_interval_ms: int
    detailed: bool
    consumer_stats: bool
    hide_header: bool
    print_metrics: bool
    date_format: str
    client_id: str
    consumer_kwargs: dict[str, object]
    connection: dict[str, str]


def options_from_args(ns: argparse.Namespace) -> Options:
    if not ns.bootstrap_server or not ns.topic:
        missing = [n for n, v in (("bootstrap-server", ns.bootstrap_server), ("topic", ns.topic)) if not v]
        raise UsageError(f'Missing required argument "[{", ".join(missing)}]"')
    if (ns.num_records is None) == (ns.messages is None):
        raise UsageError("Exactly one of --num-records and --messages (deprecated) must be given.")
    if ns.consumer_config and ns.command_config:
        raise UsageError("Option --consumer.config cannot be used with --command-config.")
    if ns.messages is not None:
        print("Warning: --messages is deprecated. Use --num-records instead.")
    if ns.consumer_config:
        print("Warning: --consumer.config is deprecated. Use --command-config instead.")
    num_records = ns.num_records if ns.num_records is not None else ns.messages
    for name, value in (("num-records", num_records), ("threads", ns.threads), ("fetch-size", ns.fetch_size),
                        ("timeout", ns.timeout)):
        if value <= 0:
            raise UsageError(f"--{name} must be greater than 0.")
    if ns.reporting_interval <= 0:
        raise UsageError("Reporting interval must be greater than 0.")
    config_file = ns.consumer_config or ns.command_config
    props = load_properties(config_file) if config_file else {}
    props.update(parse_key_values(ns.command_property, "--command-property"))
    settings = split_settings(props, for_consumer=True)
    warn_ignored(settings)
    kwargs = dict(settings.consumer)
    if kwargs.get("acknowledgement_mode", "implicit") != "implicit":
        raise UsageError("share.acknowledgement.mode must stay implicit for this tool")
    kwargs["acknowledgement_mode"] = "implicit"
    kwargs["fetch_max_bytes"] = ns.fetch_size
    return Options(
        bootstrap=ns.bootstrap_server,
        topic=ns.topic,
        group=ns.group,  # --group decides, as in Kafka's tool (it overrides group.id from the files)
        num_records=num_records,
        threads=ns.threads,
        timeout_ms=ns.timeout,
        reporting_interval_ms=ns.reporting_interval,
        detailed=ns.show_detailed_stats,
        consumer_stats=ns.show_consumer_stats,
        hide_header=ns.hide_header,
        print_metrics=ns.print_metrics,
        date_format=ns.date_format,
        client_id=settings.client_id or DEFAULT_CLIENT_ID,
        consumer_kwargs=kwargs,
        connection=settings.connection,
    )


@dataclass(slots=True)
class Totals:
    records: int = 0
    bytes: int = 0
    per_consumer: list[tuple[int, int]] = field(default_factory=list)  # (records, bytes) of each consumer


def stats_line(opts: Options, start_ms: int, end_ms: int, n_bytes: int, n_records: int) -> str:
    elapsed_s = (end_ms - start_ms) / 1000
    mb = n_bytes / MB
    # An instant run would divide by zero; Kafka's tool prints Infinity/NaN then, so do we.
    mb_sec = mb / elapsed_s if elapsed_s > 0 else float("inf") if mb else float("nan")
    rec_sec = n_records / elapsed_s if elapsed_s > 0 else float("inf") if n_records else float("nan")
    start = format_java_date(opts.date_format, start_ms)
    end = format_java_date(opts.date_format, end_ms)
    return f"{start}, {end}, {mb:.4f}, {mb_sec:.4f}, {rec_sec:.4f}, {n_records}, {end_ms - start_ms}"


async def _consume_one(consumer: AsyncShareConsumer, opts: Options, totals: Totals, index: int) -> None:
    """One share consumer's loop: poll until the group has read --num-records or this consumer has seen
    nothing for --timeout ms."""
    records = n_bytes = 0
    last_records = last_bytes = 0
    now = _now_ms()
    last_consumed = last_report = now
    while totals.records < opts.num_records and now - last_consumed <= opts.timeout_ms:
        batch = await consumer.poll(POLL_S)
        now = _now_ms()
        if batch:
            last_consumed = now
        for record in batch:
            size = len(record.key or b"") + len(record.value or b"")
            records += 1
            n_bytes += size
            totals.records += 1
            totals.bytes += size
            if now - last_report >= opts.reporting_interval_ms:
                if opts.detailed:
                    interval_s = (now - last_report) / 1000
                    print(f"{format_java_date(opts.date_format, last_report)}, "
                          f"{format_java_date(opts.date_format, now)}, {n_bytes / MB:.4f}, "
                          f"{(n_bytes - last_bytes) / MB / interval_s:.4f}, "
                          f"{(records - last_records) / interval_s:.4f}, {records}, {now - last_report} "
                          f"for share consumer {index + 1}")
                last_report, last_records, last_bytes = now, records, n_bytes
        totals.per_consumer[index] = (records, n_bytes)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run(opts: Options) -> int:
    if not opts.hide_header:
        print(HEADER)
    consumers = [
        AsyncShareConsumer(
            opts.bootstrap,
            opts.group,
            client_id=opts.client_id if opts.threads == 1 else f"{opts.client_id}-{i + 1}",
            config=opts.connection,
            **opts.consumer_kwargs,  # type: ignore[arg-type]  # split_settings gave each value its parameter's type (CONSUMER_KEYS)
        )
        for i in range(opts.threads)
    ]
    totals = Totals(per_consumer=[(0, 0)] * opts.threads)
    try:
        start_ms = _now_ms()
        for consumer in consumers:
            await consumer.subscribe([opts.topic])
        await asyncio.gather(*(_consume_one(c, opts, totals, i) for i, c in enumerate(consumers)))
        end_ms = _now_ms()
        if opts.consumer_stats:
            for i, (records, n_bytes) in enumerate(totals.per_consumer):
                print(f"Share consumer {i + 1} consumption metrics- "
                      f"{stats_line(opts, start_ms, end_ms, n_bytes, records)}")
        if totals.records < opts.num_records:
            print(f"WARNING: Exiting before consuming the expected number of records: timeout ({opts.timeout_ms} ms) "
                  "exceeded. You can use the --timeout option to increase the timeout.")
        metrics = [c.metrics() for c in consumers] if opts.print_metrics else []
        # Accept what the last polls handed out, as the Java tool's commitSync() does.
        await asyncio.gather(*(c.commit_sync(c.config.request_timeout_ms / 1000) for c in consumers))
        print(stats_line(opts, start_ms, end_ms, totals.bytes, totals.records))
        for i, values in enumerate(metrics):
            _print_metrics(values, opts.client_id if opts.threads == 1 else f"{opts.client_id}-{i + 1}")
    finally:
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
    return 0


def _print_metrics(values: dict[str, float], client_id: str) -> None:
    names = {f"{name}:{{client-id={client_id}}}": value for name, value in values.items()}
    width = max(len(n) for n in names) if names else 11
    print(f"\n{'Metric Name':<{width}}   Value")
    for name in sorted(names):
        print(f"{name:<{width}} : {names[name]:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        opts = options_from_args(parser.parse_args(argv))
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    except ToolConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(run(opts))
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"Error: invalid consumer configuration: {exc}", file=sys.stderr)
    except KafkaError as exc:
        print(f"Error: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
