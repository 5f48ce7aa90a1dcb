"""`kafka-consumer-groups` run as a user runs it (the installed command in a subprocess) against the real
broker with a live classic group: rows, exit codes, and what the broker then holds."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.client import Admin

from .broker_process import BrokerProcess
from .test_tools_share_groups import TOOL_MODULES, tool

TOOL_MODULES.setdefault("kafka-consumer-groups", "shoal.client.tools.consumer_groups")
PER_PARTITION = 5


def consumer_groups(broker: BrokerProcess, *args: str) -> tuple[int, list[list[str]], str]:
    done = tool("kafka-consumer-groups", "--bootstrap-server", broker.bootstrap, *args)
    return done.returncode, [line.split() for line in done.stdout.splitlines() if line.strip()], done.stderr


def committed(broker: BrokerProcess, group: str) -> dict[tuple[str, int], int]:
    with Admin(broker.bootstrap) as admin:
        return admin.list_consumer_group_offsets(group)


def test_consumer_groups_tool(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = f"cgt-{uuid.uuid4().hex[:6]}", f"cgt-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for p in (0, 1):
        for i in range(PER_PARTITION):
            producer.produce(topic, value=b"%d" % i, partition=p)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "client.id": "cg-client"})
    consumer.subscribe([topic])
    got = 0
    for _ in range(200):
        got += len([m for m in consumer.consume(50, 0.2) if m.error() is None])
        if got == 2 * PER_PARTITION:
            break
    consumer.commit(asynchronous=False)

    code, rows, _ = consumer_groups(broker, "--list")
    assert code == 0 and [group] in rows
    code, rows, _ = consumer_groups(broker, "--describe", "--group", group)
    assert code == 0 and rows[0][:6] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    assert sorted((r[2], r[3], r[4], r[5], r[8]) for r in rows[1:]) == [
        ("0", "5", "5", "0", "cg-client"), ("1", "5", "5", "0", "cg-client")]
    code, rows, _ = consumer_groups(broker, "--describe", "--group", group, "--members", "--verbose")
    assert code == 0 and rows[1][4:] == ["2", f"{topic}:0,1"]
    code, rows, _ = consumer_groups(broker, "--describe", "--group", group, "--state")
    assert code == 0 and rows[1][-3:] == ["range", "Stable", "1"]
    # An active group's offsets are not reset.
    code, _, err = consumer_groups(broker, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                                   "--execute")
    assert code == 1 and "inactive" in err
    consumer.close()

    def reset(*scenario: str, execute: bool = True) -> list[list[str]]:
        code, rows, err = consumer_groups(broker, "--reset-offsets", "--group", group, "--topic", topic, *scenario,
                                          "--execute" if execute else "--dry-run")
        assert code == 0, err
        return rows

    assert [r[2:] for r in reset("--to-earliest", execute=False)[1:]] == [["0", "0"], ["1", "0"]]
    assert committed(broker, group) == {(topic, 0): 5, (topic, 1): 5}
    reset("--to-earliest")
    assert committed(broker, group) == {(topic, 0): 0, (topic, 1): 0}
    reset("--shift-by", "3")
    assert committed(broker, group) == {(topic, 0): 3, (topic, 1): 3}
    assert [r[3] for r in reset("--to-current", execute=False)[1:]] == ["3", "3"]
    reset("--to-offset", "100")  # kept within the partition: the latest offset
    assert committed(broker, group) == {(topic, 0): 5, (topic, 1): 5}
    reset("--by-duration", "PT1H")
    assert committed(broker, group) == {(topic, 0): 0, (topic, 1): 0}
    reset("--to-datetime", "2999-01-01T00:00:00.000")
    assert committed(broker, group) == {(topic, 0): 5, (topic, 1): 5}
    plan = tmp_path / "plan.csv"
    plan.write_text(f"{topic},0,1\n{topic},1,2\n")
    code, _, err = consumer_groups(broker, "--reset-offsets", "--group", group, "--from-file", str(plan), "--execute")
    assert code == 0, err
    assert committed(broker, group) == {(topic, 0): 1, (topic, 1): 2}
    code, rows, _ = consumer_groups(broker, "--reset-offsets", "--group", group, "--all-topics", "--to-latest",
                                    "--dry-run", "--export")
    assert code == 0 and rows == [[f"{topic},0,5"], [f"{topic},1,5"]]

    code, rows, _ = consumer_groups(broker, "--delete-offsets", "--group", group, "--topic", f"{topic}:0")
    assert code == 0 and rows[1] == [topic, "0", "Successful"]
    assert committed(broker, group) == {(topic, 1): 2}
    code, rows, _ = consumer_groups(broker, "--delete", "--group", group)
    assert code == 0 and "successful" in " ".join(rows[0])
    code, rows, _ = consumer_groups(broker, "--list")
    assert [group] not in rows
    code, _, err = consumer_groups(broker, "--describe", "--group", group)
    assert code == 1 and "does not exist" in err
