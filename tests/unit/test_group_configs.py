"""Share-group config bounds as Kafka 4.3: broker min/max keys bound both the broker's default and
every group's dynamic value, and lowering them is how a test runs with short intervals. And the
dead-letter topic name, checked against the broker's current prefix and the topic's opt-in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from shoal.broker.common.config import CLUSTER_DEFAULT, THIS_BROKER, BrokerConfig, ConfigError
from shoal.broker.share.group_configs import GroupConfigs, InvalidGroupConfig, ValidationContext


def configs(tmp_path: Path, broker: dict[str, str] | None = None) -> GroupConfigs:
    return GroupConfigs(tmp_path, BrokerConfig.from_strings({"log.dirs": str(tmp_path)} | (broker or {})))


def check(gc: GroupConfigs, topics: Mapping[str, Mapping[str, str]] | None = None) -> ValidationContext:
    """Validation against `gc`'s broker config and these topics (name -> explicit topic configs)."""
    return ValidationContext(gc.broker_config, (topics or {}).get)


@pytest.mark.parametrize(("key", "low", "lowest", "highest", "high"), [
    ("share.session.timeout.ms", "44999", "45000", "60000", "60001"),
    ("share.heartbeat.interval.ms", "4999", "5000", "15000", "15001"),
    ("share.partition.max.record.locks", "99", "100", "4000", "4001"),
    ("share.delivery.count.limit", "1", "2", "10", "11"),
])
def test_group_configs_are_bounded_by_the_broker_defaults(tmp_path: Path, key: str, low: str, lowest: str,
                                                          highest: str, high: str) -> None:
    gc = configs(tmp_path)
    for ok in (lowest, highest):
        gc.validate(key, ok, check(gc))
    for bad in (low, high):
        with pytest.raises(InvalidGroupConfig, match=key):
            gc.validate(key, bad, check(gc))


def test_broker_min_and_max_keys_move_the_bounds(tmp_path: Path) -> None:
    gc = configs(tmp_path, {
        "group.share.min.session.timeout.ms": "6000", "group.share.max.session.timeout.ms": "90000",
        "group.share.min.heartbeat.interval.ms": "500", "group.share.max.heartbeat.interval.ms": "30000",
        "group.share.max.partition.max.record.locks": "10000",
    })
    for key, value in (("share.session.timeout.ms", "6000"), ("share.session.timeout.ms", "90000"),
                       ("share.heartbeat.interval.ms", "500"), ("share.partition.max.record.locks", "10000")):
        gc.validate(key, value, check(gc))
    gc.apply("g", [("share.heartbeat.interval.ms", "500")], check(gc))
    assert gc.get_int("g", "share.heartbeat.interval.ms") == 500
    assert gc.get_int("other", "share.heartbeat.interval.ms") == 5000


@pytest.mark.parametrize("overrides", [
    {"group.share.heartbeat.interval.ms": "1000"},  # below group.share.min.heartbeat.interval.ms
    {"group.share.session.timeout.ms": "30000"},
    {"group.share.partition.max.record.locks": "5000"},
    {"group.share.min.session.timeout.ms": "70000"},  # min above max
    {"group.share.min.heartbeat.interval.ms": "1000", "group.share.heartbeat.interval.ms": "1000",
     "group.share.min.session.timeout.ms": "1000", "group.share.session.timeout.ms": "1000"},  # hb >= session
])
def test_broker_defaults_outside_their_bounds_refuse_to_start(tmp_path: Path, overrides: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig.from_strings({"log.dirs": str(tmp_path)} | overrides)


def test_lowered_bounds_let_the_broker_start_with_short_intervals(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_strings({"log.dirs": str(tmp_path), "group.share.min.heartbeat.interval.ms": "1000",
                                     "group.share.heartbeat.interval.ms": "1000"})
    assert cfg["group.share.heartbeat.interval.ms"] == 1000


# ---- errors.deadletterqueue.topic.name (KIP-1191, refused at config time as well as at dead-letter time) --

DLQ = "errors.deadletterqueue.topic.name"
TOPICS = {
    "dlq.on": {"errors.deadletterqueue.group.enable": "TRUE"},
    "dlq.off": {"errors.deadletterqueue.group.enable": "false"},
    "dlq.unset": {"retention.ms": "1000"},
    "plain": {"errors.deadletterqueue.group.enable": "true"},
}


@pytest.mark.parametrize(("name", "message"), [
    ("", None),  # no dead-letter topic
    ("dlq.on", None),
    ("dlq.not-yet", None),  # may be created later; checked again when a record is dead-lettered
    ("__dlq.x", "^errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'$"),
    ("plain", "^The dead-letter topic name 'plain' must start with the prefix 'dlq.'$"),
    ("DLQ.on", "^The dead-letter topic name 'DLQ.on' must start with the prefix 'dlq.'$"),
    ("dlq.off", r"^Topic 'dlq.off' is not enabled as a dead-letter topic for share groups "
                r"\(errors.deadletterqueue.group.enable=false\)$"),
    ("dlq.unset", "^Topic 'dlq.unset' is not enabled as a dead-letter topic"),
])
def test_dead_letter_topic_name_needs_the_prefix_and_an_opted_in_topic(tmp_path: Path, name: str,
                                                                       message: str | None) -> None:
    gc = configs(tmp_path)
    if message is None:
        gc.apply("g", [(DLQ, name)], check(gc, TOPICS))
        assert gc.get("g", DLQ) == name
    else:
        with pytest.raises(InvalidGroupConfig, match=message):
            gc.apply("g", [(DLQ, name), ("share.delivery.count.limit", "3")], check(gc, TOPICS))
        assert gc.explicit("g") == {}  # nothing of a refused request is kept


def test_dead_letter_prefix_is_the_brokers_current_one(tmp_path: Path) -> None:
    gc = configs(tmp_path, {"errors.deadletterqueue.topic.name.prefix": ""})
    gc.validate(DLQ, "plain", check(gc, TOPICS))  # an empty prefix is no prefix rule
    with pytest.raises(InvalidGroupConfig, match="not enabled as a dead-letter topic"):
        gc.validate(DLQ, "dlq.off", check(gc, TOPICS))  # the opt-in still counts
    gc.broker_config.apply_dynamic(CLUSTER_DEFAULT, [("errors.deadletterqueue.topic.name.prefix", "dead.")])
    with pytest.raises(InvalidGroupConfig, match="must start with the prefix 'dead.'"):
        gc.validate(DLQ, "dlq.on", check(gc, TOPICS))
    gc.broker_config.apply_dynamic(THIS_BROKER, [("errors.deadletterqueue.topic.name.prefix", "dlq.")])
    gc.validate(DLQ, "dlq.on", check(gc, TOPICS))


# ---- dynamic broker configs (IncrementalAlterConfigs on BROKER) --------------------------------------


def test_dynamic_broker_values_win_in_order_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.json"
    cfg = BrokerConfig.from_strings({"log.dirs": str(tmp_path), "errors.deadletterqueue.topic.name.prefix": "s."})
    cfg.load_dynamic(path)
    groups = GroupConfigs(tmp_path, cfg)
    assert cfg["errors.deadletterqueue.topic.name.prefix"] == "s."
    cfg.apply_dynamic(CLUSTER_DEFAULT, [("errors.deadletterqueue.topic.name.prefix", "c."),
                                        ("group.share.assignment.interval.ms", "250")])
    assert (cfg["errors.deadletterqueue.topic.name.prefix"], cfg.dynamic_source("group.share.assignment.interval.ms")) == (
        "c.", CLUSTER_DEFAULT)
    # Groups without their own value follow the broker's at once.
    assert groups.get_int("g", "share.assignment.interval.ms") == 250
    cfg.apply_dynamic(THIS_BROKER, [("errors.deadletterqueue.topic.name.prefix", "b."),
                                    ("errors.deadletterqueue.auto.create.topics.enable", "TRUE")])
    assert (cfg["errors.deadletterqueue.topic.name.prefix"], cfg["errors.deadletterqueue.auto.create.topics.enable"]) == (
        "b.", True)
    # As in Kafka, a dynamic interval outside the broker's min/max keys is capped, not refused.
    cfg.apply_dynamic(THIS_BROKER, [("group.share.assignment.interval.ms", "99999")])
    assert cfg["group.share.assignment.interval.ms"] == 15000
    cfg.apply_dynamic(THIS_BROKER, [("errors.deadletterqueue.topic.name.prefix", None)])
    assert cfg["errors.deadletterqueue.topic.name.prefix"] == "c."

    again = BrokerConfig.from_strings({"log.dirs": str(tmp_path)})
    again.load_dynamic(path)
    assert again.dynamic_values(THIS_BROKER) == {"errors.deadletterqueue.auto.create.topics.enable": "TRUE",
                                                 "group.share.assignment.interval.ms": "99999"}
    assert again["errors.deadletterqueue.topic.name.prefix"] == "c."


@pytest.mark.parametrize(("key", "value", "message"), [
    ("auto.create.topics.enable", "1", "Cannot update these configs dynamically: [auto.create.topics.enable]"),
    ("group.share.assignment.interval.ms", "soon", "Invalid value soon for configuration "
     "group.share.assignment.interval.ms: Not a number of type INT"),
    ("group.share.assignment.interval.ms", "-1", "Value must be at least 0"),
    ("errors.deadletterqueue.auto.create.topics.enable", "yes", "Expected value to be either true or false"),
])
def test_dynamic_broker_values_are_checked_as_kafka_checks_them(tmp_path: Path, key: str, value: str,
                                                                message: str) -> None:
    cfg = BrokerConfig.from_strings({"log.dirs": str(tmp_path)})
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cfg.apply_dynamic(CLUSTER_DEFAULT, [(key, value)])
    assert cfg.dynamic_values(CLUSTER_DEFAULT) == {}
