"""Share-group config bounds as Kafka 4.3: broker min/max keys bound both the broker's default and
every group's dynamic value, and lowering them is how a test runs with short intervals."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.broker.server.config import CLUSTER_DEFAULT, THIS_BROKER, BrokerConfig, ConfigError
from shoal.broker.share.group_configs import GroupConfigs, InvalidGroupConfig


def configs(tmp_path: Path, broker: dict[str, str] | None = None) -> GroupConfigs:
    return GroupConfigs(tmp_path, BrokerConfig.from_strings({"log.dirs": str(tmp_path)} | (broker or {})))


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
        gc.validate(key, ok)
    for bad in (low, high):
        with pytest.raises(InvalidGroupConfig, match=key):
            gc.validate(key, bad)


def test_broker_min_and_max_keys_move_the_bounds(tmp_path: Path) -> None:
    gc = configs(tmp_path, {
        "group.share.min.session.timeout.ms": "6000", "group.share.max.session.timeout.ms": "90000",
        "group.share.min.heartbeat.interval.ms": "500", "group.share.max.heartbeat.interval.ms": "30000",
        "group.share.max.partition.max.record.locks": "10000",
    })
    for key, value in (("share.session.timeout.ms", "6000"), ("share.session.timeout.ms", "90000"),
                       ("share.heartbeat.interval.ms", "500"), ("share.partition.max.record.locks", "10000")):
        gc.validate(key, value)
    gc.apply("g", [("share.heartbeat.interval.ms", "500")])
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
    ("log.retention.ms", "1", "Cannot update these configs dynamically: [log.retention.ms]"),
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
