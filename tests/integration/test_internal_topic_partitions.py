"""Internal topics keep the partition count they were created with (issue 34).

A stock admin client asks for more partitions of `__consumer_offsets`, `__share_group_state` and
`__transaction_state`: the broker refuses. A data directory where an older broker accepted it (51
partitions where 50 were created) still starts, and every group is served as before: committed offsets
of classic, KIP-848 and admin-only groups, and a share group whose offsets AlterShareGroupOffsets set.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from shoal.coordinator.placement import coordinator_partition
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT, NO_JOIN_DELAY
from .kafka_wire import WireClient
from .share_clients import Consumed, create_topic, poll_until, produce, share_consumer
from .test_share_admin import alter_offsets, describe_offsets, offsets_by_partition

INTERNAL = ("__consumer_offsets", "__share_group_state", "__transaction_state")
CREATED = 50  # Kafka's default for each internal topic, which the broker keeps here
GROWN = 51
TOPIC = "orders"
PARTITIONS = 2
RECORDS = 10  # per partition
# Offsets set by the admin client only (no member ever joined): one group per id, each id's own offsets.
ADMIN_GROUPS = {"\U0001f475": 3, "gr\u00fcn-\u00e4": 5, "g-simple": 7}
CLASSIC_GROUP, CONSUMER_GROUP, SHARE_GROUP = "g-classic", "g-consumer", "share-\U0001f475"
SHARE_START = 4


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # Kafka's own counts: the moved-key ids below are chosen for 50 and 51 partitions.
    counts = [f"{key}={CREATED}" for key in ("offsets.topic.num.partitions", "share.coordinator.state.topic.num.partitions",
                                             "transaction.state.log.num.partitions")]
    proc = BrokerProcess(tmp_path / "data", overrides=[*FAST_HEARTBEAT, *NO_JOIN_DELAY, *counts])
    yield proc
    proc.stop()


def test_moved_group_ids_are_the_ones_the_issue_is_about() -> None:
    # Not a tautology: the restart test below only proves something if these ids change partition.
    moved = [g for g in [*ADMIN_GROUPS, CLASSIC_GROUP, CONSUMER_GROUP]
             if coordinator_partition(g, CREATED) != coordinator_partition(g, GROWN)]
    assert "\U0001f475" in moved and coordinator_partition("\U0001f475", GROWN) == GROWN - 1
    assert len(moved) == len(ADMIN_GROUPS) + 2


def _init_transactions(bootstrap: str) -> None:
    """A transactional producer's first InitProducerId creates `__transaction_state`."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "txn-internal"})
    producer.init_transactions(30)


def _create_partitions_errors(admin: AdminClient, count: int, *, validate_only: bool) -> dict[str, KafkaError]:
    futures = admin.create_partitions([NewPartitions(t, count) for t in INTERNAL], validate_only=validate_only,
                                      request_timeout=30)
    errors: dict[str, KafkaError] = {}
    for topic, future in futures.items():
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        errors[topic] = refused.value.args[0]
    return errors


def _partition_counts(admin: AdminClient) -> dict[str, int]:
    md = admin.list_topics(timeout=30)
    return {name: len(md.topics[name].partitions) for name in INTERNAL}


def _commit_as_member(bootstrap: str, group: str, protocol: str, offsets: dict[int, int]) -> None:
    """Join `group`, wait for the assignment, commit `offsets`, leave."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                              "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    if protocol == "classic":
        config |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    consumer = Consumer(config)
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 60
        while len(consumer.assignment()) < PARTITIONS and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert len(consumer.assignment()) == PARTITIONS, consumer.assignment()
        consumer.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _committed(admin: AdminClient, group: str) -> dict[int, int]:
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    [future] = admin.list_consumer_group_offsets([request], request_timeout=30).values()
    return {tp.partition: tp.offset for tp in future.result(30).topic_partitions}


def _expected_offsets() -> dict[str, dict[int, int]]:
    expected = {g: {p: base + p for p in range(PARTITIONS)} for g, base in ADMIN_GROUPS.items()}
    expected[CLASSIC_GROUP] = {0: 1, 1: 2}
    expected[CONSUMER_GROUP] = {0: 6, 1: 8}
    return expected


def _grow_internal_topics_as_an_old_broker_did(data_dir: Path) -> None:
    """What a broker that accepted CreatePartitions(51) left behind: the registry says 51 partitions (and,
    written before creation counts were kept, nothing else), and the new partitions' directories exist."""
    registry = data_dir / "shoal-topics.json"
    doc = json.loads(registry.read_text())
    for entry in doc["topics"]:
        if entry["name"] in ("__consumer_offsets", "__share_group_state"):
            assert entry["partitions"] == CREATED and entry.pop("created_partitions") == CREATED
            entry["partitions"] = GROWN
            (data_dir / f"{entry['name']}-{CREATED}").mkdir()
        else:
            entry.pop("created_partitions", None)
    registry.write_text(json.dumps(doc, indent=1))


def _share_group(bootstrap: str) -> Any:
    with WireClient.connect(bootstrap) as client:
        [group] = client.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, messages.ShareGroupDescribeRequest(
            group_ids=[SHARE_GROUP], include_authorized_operations=False)).groups
    return group


def _share_starts(bootstrap: str) -> dict[int, int]:
    described = offsets_by_partition(describe_offsets(bootstrap, SHARE_GROUP, {TOPIC: list(range(PARTITIONS))}))
    assert all(error == ErrorCode.NONE for _start, _lag, error in described.values()), described
    return {p: start for (_t, p), (start, _lag, _error) in described.items()}


def _assert_every_group_served(broker: BrokerProcess, expected: dict[str, dict[int, int]],
                               share_starts: dict[int, int] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for group, offsets in expected.items():
        assert _committed(admin, group) == offsets, group
    for group in (CLASSIC_GROUP, CONSUMER_GROUP):
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert described.group_id == group
    shared = _share_group(broker.bootstrap)
    assert (shared.error_code, shared.group_id) == (ErrorCode.NONE, SHARE_GROUP)
    assert _share_starts(broker.bootstrap) == (share_starts or dict.fromkeys(range(PARTITIONS), SHARE_START))


@pytest.mark.parametrize("setting", [CREATED, GROWN], ids=["setting-unchanged", "setting-raised-too"])
def test_create_partitions_refused_and_a_grown_data_dir_still_serves_every_group(
        own_broker: BrokerProcess, setting: int) -> None:
    broker = own_broker.start()
    bs = broker.bootstrap
    create_topic(bs, TOPIC, PARTITIONS)
    produce(bs, TOPIC, RECORDS * PARTITIONS, partitions=PARTITIONS)
    admin = AdminClient({"bootstrap.servers": bs})
    expected = _expected_offsets()
    for group in ADMIN_GROUPS:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(TOPIC, p, o) for p, o in expected[group].items()])
        [future] = admin.alter_consumer_group_offsets([request], request_timeout=30).values()
        future.result(30)
    _commit_as_member(bs, CLASSIC_GROUP, "classic", expected[CLASSIC_GROUP])
    _commit_as_member(bs, CONSUMER_GROUP, "consumer", expected[CONSUMER_GROUP])
    # AlterShareGroupOffsets creates the share group (empty, with its start offsets).
    altered = alter_offsets(bs, SHARE_GROUP, TOPIC, {p: SHARE_START for p in range(PARTITIONS)})
    assert altered.error_code == ErrorCode.NONE
    assert all(p.error_code == ErrorCode.NONE for t in altered.responses for p in t.partitions)
    # Nor may a client create `__transaction_state` (with a count of its own) before the broker does.
    [future] = admin.create_topics([NewTopic("__transaction_state", 7, 1)], request_timeout=30).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    md = messages.MetadataRequest
    with WireClient.connect(bs) as client:  # nor auto-create it with num.partitions
        [auto] = client.request(ApiKey.METADATA, 12, md(topics=[md.MetadataRequestTopic(  # type: ignore[attr-defined]
            name="__transaction_state", topic_id=b"\x00" * 16)], allow_auto_topic_creation=True)).topics
    assert (auto.error_code, auto.partitions) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
    _init_transactions(bs)

    # The stock admin client's request is refused for every internal topic, validate_only or not.
    for validate_only in (True, False):
        errors = _create_partitions_errors(admin, GROWN, validate_only=validate_only)
        for topic, error in errors.items():
            assert error.code() == KafkaError.INVALID_REQUEST, (topic, error)
            assert topic in error.str(), error
    assert _partition_counts(admin) == dict.fromkeys(INTERNAL, CREATED)
    _assert_every_group_served(broker, expected)

    # A data directory an older, accepting broker left behind, started with the setting as it was or
    # raised along with the partitions.
    assert broker.stop() == 0
    _grow_internal_topics_as_an_old_broker_did(broker.data_dir)
    broker.overrides += [f"offsets.topic.num.partitions={setting}",
                         f"share.coordinator.state.topic.num.partitions={setting}"]
    broker.start()
    _assert_every_group_served(broker, expected)
    # The share group resumes where its offsets were altered to.
    consumer = share_consumer(bs, SHARE_GROUP, [TOPIC])
    sink = Consumed()
    try:
        poll_until(consumer, lambda: len(sink) >= (RECORDS - SHARE_START) * PARTITIONS, sink, 60)
    finally:
        consumer.close()
    assert sorted((p, o) for p, o, _v, _d in sink.records) == [
        (p, o) for p in range(PARTITIONS) for o in range(SHARE_START, RECORDS)]
    share_after = _share_starts(bs)  # however far the consumer's acknowledgements moved them
    assert all(SHARE_START <= start <= RECORDS for start in share_after.values()), share_after

    # New commits of a moved group go where its records are: a second restart still finds them.
    moved = "\U0001f475"
    expected[moved] = {0: 9, 1: 9}
    request = ConsumerGroupTopicPartitions(moved, [TopicPartition(TOPIC, p, o) for p, o in expected[moved].items()])
    admin = AdminClient({"bootstrap.servers": bs})
    [future] = admin.alter_consumer_group_offsets([request], request_timeout=30).values()
    future.result(30)
    assert broker.stop() == 0
    registry = json.loads((broker.data_dir / "shoal-topics.json").read_text())
    created = {e["name"]: e.get("created_partitions") for e in registry["topics"]}
    # Recorded once from what the directory and the setting say, and kept from then on.
    assert created["__consumer_offsets"] == created["__share_group_state"] == min(setting, GROWN)
    broker.start()
    _assert_every_group_served(broker, expected, share_after)
    log_text = broker.log_text()
    assert "Traceback" not in log_text, log_text[-4000:]
    found_elsewhere = "coordinator key found outside its partition" in log_text
    assert found_elsewhere == (setting == GROWN)
