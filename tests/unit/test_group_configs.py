"""Share-group config bounds as Kafka 4.3: broker min/max keys bound both the broker's default and
every group's dynamic value, and lowering them is how a test runs with short intervals."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.broker.server.config import BrokerConfig, ConfigError
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
