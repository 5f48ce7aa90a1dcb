"""`kafka-share-groups` run as a user runs it: the installed command in a subprocess, against the real broker
with live share groups. Output rows and exit codes are checked, and so is what the broker did.

The module's broker also has a SASL_PLAINTEXT listener (for --command-config) and a 1 s lower bound for
`share.record.lock.duration.ms` (for the lock test in test_tools_share_consumers.py, which reuses it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client import RESOURCE_GROUP, Admin, ShareConsumer

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT
from .share_clients import create_topic, produce, set_group_config

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
TOOL_MODULES = {
    "kafka-share-groups": "shoal.client.tools.share_groups",
    "kafka-console-share-consumer": "shoal.client.tools.console_share_consumer",
    "kafka-share-consumer-perf-test": "shoal.client.tools.share_perf",
}


@pytest.fixture(scope="module")
def tools_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("tools")
    overrides = [
        *FAST_HEARTBEAT,
        "group.share.min.record.lock.duration.ms=1000",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={PLAIN_JAAS}",
    ]
    proc = BrokerProcess(base / "data", overrides=overrides, extra_listeners=["SASL_PLAINTEXT://127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def tool_command(name: str) -> list[str]:
    """An installed tool: the console script next to this Python, or `python -m` when not installed."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", TOOL_MODULES[name]]


def tool(name: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*tool_command(name), *args], capture_output=True, text=True, timeout=timeout)


def share_groups(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return tool("kafka-share-groups", "--bootstrap-server", broker.bootstrap, *args)


def console(broker: BrokerProcess, topic: str, group: str, *args: str) -> subprocess.CompletedProcess[str]:
    return tool("kafka-console-share-consumer", "--bootstrap-server", broker.bootstrap, "--topic", topic,
                "--group", group, "--timeout-ms", "30000", *args)


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def failed(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, (result.stdout, result.stderr)
    return result.stderr


def offsets_table(broker: BrokerProcess, group: str) -> list[list[str]]:
    table = rows(ok(share_groups(broker, "--describe", "--group", group, "--offsets")))
    assert table[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    return table[1:]


def reset(broker: BrokerProcess, group: str, *args: str) -> list[list[str]]:
    table = rows(ok(share_groups(broker, "--reset-offsets", "--group", group, *args)))
    assert table[0] == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    return table[1:]


def wait_for_assignment(consumer: ShareConsumer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)


def test_lag_after_half_consumed_and_reset_offsets(tools_broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "tools-lag", "tools-lag-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(tools_broker.bootstrap, topic, 10)
    first = ok(console(tools_broker, topic, group, "--max-messages", "10"))
    assert first.splitlines() == [f"v-{i}" for i in range(10)]
    produce(tools_broker.bootstrap, topic, 10, prefix="w")

    # Half the topic is done: the start offset sits after it and the other half is the lag.
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "10", "10"]]
    verbose = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--verbose")))
    assert verbose[0] == ["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"]
    assert [r[0:3] + r[4:] for r in verbose[1:]] == [[group, topic, "0", "10", "10"]]

    # Dry runs print the plan for every scenario and change nothing.
    assert reset(tools_broker, group, "--to-earliest", "--topic", topic, "--dry-run") == [[group, topic, "0", "0"]]
    assert reset(tools_broker, group, "--to-latest", "--all-topics", "--dry-run") == [[group, topic, "0", "20"]]
    assert reset(tools_broker, group, "--to-offset", "7", "--topic", f"{topic}:0", "--dry-run") == [
        [group, topic, "0", "7"]
    ]
    clamped = share_groups(tools_broker, "--reset-offsets", "--group", group, "--to-offset", "99", "--dry-run")
    assert rows(ok(clamped))[1:] == [[group, topic, "0", "20"]]
    assert "higher than latest offset" in clamped.stderr
    assert reset(tools_broker, group, "--to-datetime", "2000-01-01T00:00:00.000", "--dry-run") == [
        [group, topic, "0", "0"]
    ]
    assert reset(tools_broker, group, "--to-datetime", "2999-01-01T00:00:00.000Z", "--dry-run") == [
        [group, topic, "0", "20"]
    ]
    assert reset(tools_broker, group, "--by-duration", "P1DT2H", "--dry-run") == [[group, topic, "0", "0"]]
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "10", "10"]]

    # Kafka 4.4's scenarios: the current start offset, a shift (clamped), and a CSV plan out and back in.
    assert reset(tools_broker, group, "--to-current", "--dry-run") == [[group, topic, "0", "10"]]
    assert reset(tools_broker, group, "--shift-by", "-3", "--dry-run") == [[group, topic, "0", "7"]]
    assert reset(tools_broker, group, "--shift-by", "-30", "--dry-run") == [[group, topic, "0", "0"]]
    exported = ok(share_groups(tools_broker, "--reset-offsets", "--group", group, "--shift-by", "2", "--dry-run",
                               "--export"))
    assert exported.split() == [f"{topic},0,12"]
    plan = tmp_path / "plan.csv"
    plan.write_text(exported)
    assert reset(tools_broker, group, "--from-file", str(plan), "--dry-run") == [[group, topic, "0", "12"]]
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "10", "10"]]

    # Executed: consumption starts over from the first record.
    assert reset(tools_broker, group, "--to-earliest", "--topic", topic, "--execute") == [[group, topic, "0", "0"]]
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "0", "20"]]
    again = ok(console(tools_broker, topic, group, "--max-messages", "20"))
    assert again.splitlines() == [f"v-{i}" for i in range(10)] + [f"w-{i}" for i in range(10)]
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "20", "0"]]

    # --describe --state names the group's dead-letter topic (KIP-1191), `-` while it has none: a column
    # Kafka 4.4's tool does not have. It is the group config that DescribeConfigs on GROUP shows.
    state = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--state")))
    assert state[0] == ["GROUP", "COORDINATOR", "(ID)", "STATE", "#MEMBERS", "DLQ-TOPIC"]
    assert state[1][-3:] == ["Empty", "0", "-"]
    set_group_config(tools_broker.bootstrap, group, errors_deadletterqueue_topic_name=f"dlq.{topic}")
    with Admin(tools_broker.bootstrap) as admin:
        described = admin.describe_configs(RESOURCE_GROUP, group, ["errors.deadletterqueue.topic.name"])
    assert described.entries["errors.deadletterqueue.topic.name"].value == f"dlq.{topic}"
    state = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--state")))
    assert state[1][-3:] == ["Empty", "0", f"dlq.{topic}"]
    verbose = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--state", "--verbose")))
    assert verbose[0][-2:] == ["#MEMBERS", "DLQ-TOPIC"] and verbose[1][-2:] == ["0", f"dlq.{topic}"]


def test_live_member_shown_and_changes_refused(tools_broker: BrokerProcess) -> None:
    topic, group = "tools-live", "tools-live-g"
    create_topic(tools_broker.bootstrap, topic, 2)
    set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(tools_broker.bootstrap, topic, 4, partitions=2)
    consumer = ShareConsumer(tools_broker.bootstrap, group, client_id="tools-live-client",
                             acknowledgement_mode="explicit")
    try:
        consumer.subscribe([topic])
        wait_for_assignment(consumer)
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline
            consumer.poll(0.2)

        members = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--members")))
        assert members[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert len(members) == 2
        g, member_id, host, client_id, count, assignment = members[1]
        assert (g, member_id, client_id, count, assignment) == (
            group, consumer.member_id, "tools-live-client", "2", f"{topic}:0,1"
        )
        assert "127.0.0.1" in host
        verbose = rows(ok(share_groups(tools_broker, "--describe", "--group", group, "--members", "--verbose")))
        assert verbose[0][5] == "MEMBER-EPOCH" and int(verbose[1][5]) > 0

        state = ok(share_groups(tools_broker, "--describe", "--group", group, "--state")).strip().splitlines()
        assert state[0].split() == ["GROUP", "COORDINATOR", "(ID)", "STATE", "#MEMBERS", "DLQ-TOPIC"]
        assert state[1].split() == [group, tools_broker.bootstrap, "(1)", "Stable", "1", "-"]
        listed = rows(ok(share_groups(tools_broker, "--list", "--state")))
        assert listed[0] == ["GROUP", "STATE"] and [group, "Stable"] in listed
        assert [group, "Stable"] in rows(ok(share_groups(tools_broker, "--list", "--state", "stable")))
        assert [group, "Stable"] not in rows(ok(share_groups(tools_broker, "--list", "--state", "Empty")))

        # The group has a member holding records: offsets must not move and the group must stay.
        refused = share_groups(tools_broker, "--reset-offsets", "--group", group, "--to-earliest", "--execute")
        assert f"Share group '{group}' is not empty." in failed(refused)
        assert f"Share group '{group}' is not EMPTY." in failed(share_groups(tools_broker, "--delete", "--group", group))
        deleting = share_groups(tools_broker, "--delete-offsets", "--group", group, "--topic", topic)
        assert f"Share group '{group}' is not empty." in failed(deleting)
        assert group in ok(share_groups(tools_broker, "--list")).split()
    finally:
        consumer.close()

    state = ok(share_groups(tools_broker, "--describe", "--group", group, "--state")).strip().splitlines()
    assert state[1].split()[-3:] == ["Empty", "0", "-"]
    assert [group, "Empty"] in rows(ok(share_groups(tools_broker, "--list", "--state", "Empty")))
    assert reset(tools_broker, group, "--to-earliest", "--execute") == [[group, topic, "0", "0"], [group, topic, "1", "0"]]


def test_delete_offsets_then_consumption_follows_auto_offset_reset(tools_broker: BrokerProcess) -> None:
    topic, group = "tools-deloff", "tools-deloff-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
    produce(tools_broker.bootstrap, topic, 5)
    assert len(ok(console(tools_broker, topic, group, "--max-messages", "5")).splitlines()) == 5
    assert offsets_table(tools_broker, group) == [[group, topic, "0", "5", "0"]]

    result = rows(ok(share_groups(tools_broker, "--delete-offsets", "--group", group, "--topic", topic)))
    assert result == [["TOPIC", "STATUS"], [topic, "Successful"]]
    described = ok(share_groups(tools_broker, "--describe", "--group", group))
    assert f"Share group '{group}' has no offset information." in described

    # The group's state for the topic is gone, so share.auto.offset.reset=earliest applies again: the five
    # records, all acknowledged before, are delivered afresh.
    out = ok(console(tools_broker, topic, group, "--max-messages", "5", "--property", "print.delivery=true"))
    assert out.splitlines() == [f"Delivery:1\tv-{i}" for i in range(5)]

    unknown = share_groups(tools_broker, "--delete-offsets", "--group", group, "--topic", "tools-no-such-topic")
    failed(unknown)
    assert ["tools-no-such-topic", "Error:", "UNKNOWN_TOPIC_OR_PARTITION"] in rows(unknown.stdout)


def test_delete_groups(tools_broker: BrokerProcess) -> None:
    topic = "tools-del"
    create_topic(tools_broker.bootstrap, topic, 1)
    produce(tools_broker.bootstrap, topic, 2)
    for group in ("tools-del-a", "tools-del-b"):
        set_group_config(tools_broker.bootstrap, group, share_auto_offset_reset="earliest")
        assert len(ok(console(tools_broker, topic, group, "--max-messages", "2")).splitlines()) == 2
    assert {"tools-del-a", "tools-del-b"} <= set(ok(share_groups(tools_broker, "--list")).split())

    out = ok(share_groups(tools_broker, "--delete", "--group", "tools-del-a"))
    assert "Deletion of requested share groups ('tools-del-a') was successful." in out
    assert "tools-del-a" not in ok(share_groups(tools_broker, "--list")).split()
    gone = share_groups(tools_broker, "--describe", "--group", "tools-del-a")
    assert "Share group 'tools-del-a' does not exist." in failed(gone)

    # One good, one unknown: the good one goes, the command reports the other and fails.
    mixed = share_groups(tools_broker, "--delete", "--group", "tools-del-b", "--group", "tools-del-zz")
    err = failed(mixed)
    assert "* Group 'tools-del-zz' could not be deleted due to: Group 'tools-del-zz' is not a share group." in err
    assert "These share groups were deleted successfully: 'tools-del-b'" in mixed.stdout
    assert "tools-del-b" not in ok(share_groups(tools_broker, "--list")).split()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--list", "--describe"], "Command must include exactly one action"),
        (["--describe"], "Option --describe takes one of these options: --group, --all-groups"),
        (["--describe", "--group", "g", "--members", "--state"], "at most one of these options"),
        (["--reset-offsets", "--to-earliest", "--execute"], "Option --reset-offsets takes the option: --group"),
        (["--reset-offsets", "--group", "g", "--to-earliest", "--execute", "--dry-run"],
         "only accepts one of --execute and --dry-run"),
        (["--reset-offsets", "--group", "g", "--to-earliest"], "takes the option: --execute or --dry-run"),
        (["--reset-offsets", "--group", "g", "--to-earliest", "--to-latest", "--dry-run"], "exactly one of"),
        (["--reset-offsets", "--group", "g", "--to-datetime", "yesterday", "--dry-run"], "YYYY-MM-DDTHH:mm:SS.sss"),
        (["--reset-offsets", "--group", "g", "--by-duration", "1 day", "--dry-run"], "PnDTnHnMnS"),
        (["--reset-offsets", "--group", "g", "--from-file", "x.csv", "--topic", "t", "--dry-run"],
         "--from-file cannot be used with --topic"),
        (["--describe", "--group", "g", "--export"], "--export can only be used with --reset-offsets"),
        (["--delete-offsets", "--group", "g"], "Option --delete-offsets takes the following options"),
        (["--delete", "--group", "g", "--all-groups"], "--group cannot be used with --all-groups"),
        (["--list", "--state", "Rebalancing"], "Invalid state list 'Rebalancing'"),
        (["--list", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_misuse_is_refused(tools_broker: BrokerProcess, args: list[str], message: str) -> None:
    assert message in failed(share_groups(tools_broker, *args))


def test_help_version_and_missing_bootstrap() -> None:
    helped = tool("kafka-share-groups", "--help")
    assert "--reset-offsets" in ok(helped) and "--command-config" in helped.stdout
    assert ok(tool("kafka-share-groups", "--version")).strip()
    assert "bootstrap-server" in failed(tool("kafka-share-groups", "--list"))


def test_command_config_over_sasl(tools_broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "tools-sasl", "tools-sasl-g"
    create_topic(tools_broker.bootstrap, topic, 1)
    with Admin(tools_broker.bootstrap) as admin:
        assert admin.incremental_alter_configs(RESOURCE_GROUP, group, {"share.auto.offset.reset": "earliest"}) is None
    produce(tools_broker.bootstrap, topic, 2)
    sasl = tools_broker.address("SASL_PLAINTEXT")

    def config(password: str) -> str:
        path = tmp_path / f"client-{password}.properties"
        path.write_text(
            "# written as for Kafka's Java tools\n"
            "security.protocol=SASL_PLAINTEXT\n"
            "sasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
            f'    username="alice" password="{password}";\n'
        )
        return str(path)

    good = config("alice-secret")
    consumed = tool("kafka-console-share-consumer", "--bootstrap-server", sasl, "--topic", topic, "--group", group,
                    "--consumer.config", good, "--max-messages", "2", "--timeout-ms", "30000")
    assert ok(consumed).splitlines() == ["v-0", "v-1"]
    listed = tool("kafka-share-groups", "--bootstrap-server", sasl, "--command-config", good, "--list")
    assert group in ok(listed).split()

    wrong = tool("kafka-share-groups", "--bootstrap-server", sasl, "--command-config", config("nope"), "--list")
    assert "SASL_AUTHENTICATION_FAILED" in failed(wrong)
    plain = tool("kafka-share-groups", "--bootstrap-server", sasl, "--list", "--timeout", "3000")
    failed(plain)
