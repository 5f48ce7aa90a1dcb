"""`kafka-console-share-consumer` and `kafka-share-consumer-perf-test` in subprocesses against the real broker,
and the group configs a user sets before starting them (share.auto.offset.reset, share.record.lock.duration.ms).
"""

from __future__ import annotations

import re
import subprocess
import time

from shoal.client import RESOURCE_GROUP, Admin, ShareConsumer, ShareRecord

from .broker_process import BrokerProcess
from .share_clients import create_topic, produce, set_group_config
from .test_tools_share_groups import (  # noqa: F401  (tools_broker is a fixture)
    console,
    failed,
    offsets_table,
    ok,
    tool,
    tools_broker,
)

HEADER = "start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg, fetch.time.ms"
DATE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}:\d{3}"
MB = 1024 * 1024


def perf(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return tool("kafka-share-consumer-perf-test", "--bootstrap-server", broker.bootstrap, *args)


def stats(line: str) -> list[str]:
    fields = line.split(", ")
    assert len(fields) == 7, line
    assert re.fullmatch(DATE, fields[0]) and re.fullmatch(DATE, fields[1]), line
    return fields


def test_console_consumer_release_brings_records_back(tools_broker: BrokerProcess) -> None:  # noqa: F811
    topic, group = "tools-release", "tools-release-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(tools_broker.bootstrap, topic, 5)
    # KIP-1147's --formatter-property / --command-property (the older --property is used below).
    props = ["--formatter-property", "print.delivery=true", "--formatter-property", "print.key=true",
             "--formatter-property", "key.separator=|", "--command-property", f"group.id={group}"]

    released = console(tools_broker, topic, group, "--max-messages", "5", "--acknowledge", "release", *props)
    assert ok(released).splitlines() == [f"Delivery:1|{i}|v-{i}" for i in range(5)]
    assert "Processed a total of 5 messages" in released.stderr
    # Released, not done: all five are still the group's lag.
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "0", "5"]]

    accepted = ok(console(tools_broker, topic, group, "--max-messages", "5", *props))
    assert accepted.splitlines() == [f"Delivery:2|{i}|v-{i}" for i in range(5)]
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "5", "0"]]


def test_console_consumer_reject_flag_and_formatter(tools_broker: BrokerProcess) -> None:  # noqa: F811
    topic, group = "tools-reject", "tools-reject-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(tools_broker.bootstrap, topic, 3)
    out = ok(console(tools_broker, topic, group, "--max-messages", "3", "--reject",
                     "--property", "print.partition=true", "--property", "print.offset=true",
                     "--property", "print.timestamp=true"))
    lines = [line.split("\t") for line in out.splitlines()]
    assert [line[1:] for line in lines] == [["Partition:0", f"Offset:{i}", f"v-{i}"] for i in range(3)]
    assert all(re.fullmatch(r"CreateTime:\d+", line[0]) for line in lines)
    # Rejected records are finished with: the start offset moves past them and nothing is left.
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "3", "0"]]

    both = tool("kafka-console-share-consumer", "--bootstrap-server", tools_broker.bootstrap, "--topic", topic,
                "--reject", "--release")
    assert "At most one of --reject, --release and --acknowledge" in failed(both)
    assert "--topic is a required argument" in failed(
        tool("kafka-console-share-consumer", "--bootstrap-server", tools_broker.bootstrap)
    )


def test_auto_offset_reset_set_before_first_consumer(tools_broker: BrokerProcess) -> None:  # noqa: F811
    topic = "tools-autoreset"
    create_topic(tools_broker.bootstrap, topic, 1)
    produce(tools_broker.bootstrap, topic, 4)

    # earliest, set before the group exists: the first consumer reads what was already there.
    set_group_config(tools_broker.bootstrap, "tools-autoreset-early", share_auto_offset_reset="earliest")
    early = ok(console(tools_broker, topic, "tools-autoreset-early", "--max-messages", "4"))
    assert early.splitlines() == [f"v-{i}" for i in range(4)]

    # The default (latest): a new group's consumer starts at the end and sees only what comes after.
    with ShareConsumer(tools_broker.bootstrap, "tools-autoreset-late", acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline
            assert consumer.poll(0.2) == []
        # One fetch with the partition assigned starts the share-partition (at the end) before more arrive.
        assert consumer.poll(0.5) == []
        produce(tools_broker.bootstrap, topic, 1, prefix="late")
        got: list[ShareRecord] = []
        while not got:
            assert time.monotonic() < deadline
            got = consumer.poll(0.5)
        assert [(r.offset, r.value) for r in got] == [(4, b"late-0")]
        consumer.acknowledge(got[0])


def test_record_lock_duration_group_config(tools_broker: BrokerProcess) -> None:  # noqa: F811
    topic, group = "tools-lock", "tools-lock-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    with Admin(tools_broker.bootstrap) as admin:
        # The broker's lower bound (group.share.min.record.lock.duration.ms=1000 here) is enforced.
        assert admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.record.lock.duration.ms": "500"})
        assert admin.incremental_alter_configs(
            RESOURCE_GROUP, group, {"share.record.lock.duration.ms": "1500", "share.auto.offset.reset": "earliest"}
        ) is None
    produce(tools_broker.bootstrap, topic, 1)
    with ShareConsumer(tools_broker.bootstrap, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        deliveries: list[tuple[float, ShareRecord]] = []
        deadline = time.monotonic() + 30
        while not deliveries:
            assert time.monotonic() < deadline
            deliveries += [(time.monotonic(), r) for r in consumer.poll(0.5)]
        # Never acknowledged: the lock runs out and the same record is delivered again. The broker's
        # default lock (30 s) would not let it come back before this deadline.
        deadline = deliveries[0][0] + 10
        while len(deliveries) < 2 and time.monotonic() < deadline:
            deliveries += [(time.monotonic(), r) for r in consumer.poll(0.2)]
        assert [(r.offset, r.delivery_count) for _, r in deliveries] == [(0, 1), (0, 2)]
        assert deliveries[1][0] - deliveries[0][0] >= 1.0
        consumer.acknowledge(deliveries[1][1])
        assert consumer.commit_sync(30) == {(topic, 0): None}


def test_perf_test_reports_kafka_columns(tools_broker: BrokerProcess) -> None:  # noqa: F811
    topic = "tools-perf"
    create_topic(tools_broker.bootstrap, topic, 2)
    delivered = produce(tools_broker.bootstrap, topic, 300, partitions=2)
    total_bytes = sum(len(value) + len(str(i)) for i, (_, _, value) in enumerate(delivered))
    for group in ("tools-perf-1", "tools-perf-2", "tools-perf-3"):
        set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")

    one = ok(perf(tools_broker, "--topic", topic, "--group", "tools-perf-1", "--num-records", "300",
                  "--timeout", "30000", "--print-metrics"))
    lines = one.splitlines()
    assert lines[0] == HEADER
    fields = stats(lines[1])
    assert fields[5] == "300"
    assert fields[2] == f"{total_bytes / MB:.4f}"
    assert "Metric Name" in one and "records-fetched-total" in one
    assert offsets_table(tools_broker, "tools-perf-1") == [
        ["tools-perf-1", topic, "0", "150", "0"], ["tools-perf-1", topic, "1", "150", "0"]
    ]

    # Two share consumers with per-consumer stats, no header, and the deprecated --messages.
    two = ok(perf(tools_broker, "--topic", topic, "--group", "tools-perf-2", "--messages", "300", "--threads", "2",
                  "--timeout", "30000", "--show-consumer-stats", "--hide-header"))
    lines = two.splitlines()
    assert HEADER not in lines
    assert "Warning: --messages is deprecated. Use --num-records instead." in lines
    per_consumer = [stats(line.split("consumption metrics- ")[1]) for line in lines if "consumption metrics- " in line]
    assert len(per_consumer) == 2
    assert sum(int(f[5]) for f in per_consumer) == 300
    assert stats(lines[-1])[5] == "300"

    # Asking for more than the topic holds ends after --timeout without records, with Kafka's warning.
    short = ok(perf(tools_broker, "--topic", topic, "--group", "tools-perf-3", "--num-records", "400",
                    "--timeout", "2000"))
    assert "WARNING: Exiting before consuming the expected number of records" in short
    assert stats(short.splitlines()[-1])[5] == "300"
