"""Internal topics get Kafka's configs, so no amount of time or size retention removes group state."""

from __future__ import annotations

import json
from pathlib import Path

from shoal.broker.common.config import BrokerConfig
from shoal.broker.server.server import Broker
from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS, REGISTRY_FILE, SHARE_GROUP_STATE


def make_broker(data: Path, **extra: str) -> Broker:
    config = BrokerConfig.from_strings({
        "log.dirs": str(data), "offsets.topic.num.partitions": "2",
        "share.coordinator.state.topic.num.partitions": "2", "log.retention.ms": "1000",
        "log.retention.bytes": "100", **extra,
    })
    broker = Broker(config)
    broker.topics.load()
    broker.ensure_internal_topics()
    return broker


def test_internal_topics_are_never_aged_out(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"share.coordinator.state.topic.segment.bytes": "4096"})
    try:
        offsets = broker.topics.get(CONSUMER_OFFSETS)
        state = broker.topics.get(SHARE_GROUP_STATE)
        assert offsets is not None and state is not None
        assert offsets.configs["cleanup.policy"] == "compact"
        assert offsets.configs["segment.bytes"] == str(100 * 1024 * 1024)
        assert state.configs["cleanup.policy"] == "delete"
        assert state.configs["retention.ms"] == "-1" and state.configs["retention.bytes"] == "-1"
        for plog in offsets.partitions:
            assert not plog.config.cleanup_delete
        for plog in state.partitions:
            assert plog.config.cleanup_delete and plog.config.retention_ms == -1
            assert plog.config.retention_bytes == -1 and plog.config.segment_bytes == 4096
        # A user topic follows the broker defaults, and its own cleanup.policy.
        user = broker.topics.create("events", 1)
        compacted = broker.topics.create("table", 1, {"cleanup.policy": "compact"})
        both = broker.topics.create("both", 1, {"cleanup.policy": "compact,delete"})
        assert user.partitions[0].config.cleanup_delete and user.partitions[0].config.retention_ms == 1000
        assert not compacted.partitions[0].config.cleanup_delete
        assert both.partitions[0].config.cleanup_delete
        assert broker.topics.effective_config(compacted)["cleanup.policy"] == ("compact", True)
        assert broker.topics.effective_config(user)["cleanup.policy"] == ("delete", False)
    finally:
        broker.topics.close()


def test_older_data_directory_gets_the_missing_internal_configs(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    broker.topics.close()
    # What an older version wrote: the share-state topic with only a cleanup policy.
    path = tmp_path / REGISTRY_FILE
    doc = json.loads(path.read_text())
    for entry in doc["topics"]:
        if entry["name"] == SHARE_GROUP_STATE:
            entry["configs"] = {"cleanup.policy": "delete"}
        else:
            entry["configs"] = {"cleanup.policy": "compact", "segment.bytes": "2048"}
    path.write_text(json.dumps(doc))
    broker = make_broker(tmp_path)
    try:
        state = broker.topics.get(SHARE_GROUP_STATE)
        offsets = broker.topics.get(CONSUMER_OFFSETS)
        assert state is not None and offsets is not None
        assert state.configs["retention.ms"] == "-1"
        assert state.partitions[0].config.retention_ms == -1
        assert offsets.configs["segment.bytes"] == "2048"  # what an operator set is kept
    finally:
        broker.topics.close()
    # The repair was saved: a plain reload sees it.
    reloaded = {e["name"]: e["configs"] for e in json.loads(path.read_text())["topics"]}
    assert reloaded[SHARE_GROUP_STATE]["retention.ms"] == "-1"


def _grow_as_an_old_broker(data: Path, name: str, partitions: int) -> None:
    """An older registry (no creation count) where CreatePartitions was accepted."""
    path = data / REGISTRY_FILE
    doc = json.loads(path.read_text())
    for entry in doc["topics"]:
        entry.pop("created_partitions", None)
        if entry["name"] == name:
            entry["partitions"] = partitions
    path.write_text(json.dumps(doc))


def test_the_creation_partition_count_is_recorded_and_kept(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    offsets = broker.topics.get(CONSUMER_OFFSETS)
    assert offsets is not None and offsets.created_partitions == 2
    broker.topics.close()
    # Restarted with another setting: the topic keeps the count it was created with.
    broker = make_broker(tmp_path, **{"offsets.topic.num.partitions": "7"})
    assert broker.coordinator_partitions(CONSUMER_OFFSETS, 7) == 2
    broker.topics.close()

    # An older registry with a grown topic: the count the broker created it with (its setting) wins,
    # recorded once; a setting raised along with the partitions is the only count the directory shows.
    _grow_as_an_old_broker(tmp_path, CONSUMER_OFFSETS, 3)
    broker = make_broker(tmp_path)
    assert broker.coordinator_partitions(CONSUMER_OFFSETS, 2) == 2
    broker.topics.close()
    broker = make_broker(tmp_path, **{"offsets.topic.num.partitions": "3"})
    assert broker.coordinator_partitions(CONSUMER_OFFSETS, 3) == 2  # recorded: a later setting changes nothing
    broker.topics.close()
    _grow_as_an_old_broker(tmp_path, SHARE_GROUP_STATE, 3)
    broker = make_broker(tmp_path, **{"share.coordinator.state.topic.num.partitions": "3"})
    assert broker.coordinator_partitions(SHARE_GROUP_STATE, 3) == 3
    broker.topics.close()
