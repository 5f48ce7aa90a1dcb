"""Kafka's keys in Shoal's config: ignored with a reason, unknown as a warning (or an error with
--strict), and a bad value of a known key an error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.broker.common.config import BrokerConfig, ConfigError
from shoal.broker.server.main import main


def test_kafka_keys_that_do_not_apply_are_noted_with_a_reason() -> None:
    cfg = BrokerConfig.from_strings({"process.roles": "broker,controller", "replica.lag.time.max.ms": "30000",
                                     "num.io.threads": "8", "background.threads": "10"})
    notes = {n.key: n for n in cfg.notes}
    assert set(notes) == {"process.roles", "replica.lag.time.max.ms", "num.io.threads", "background.threads"}
    assert all(n.known and n.reason for n in notes.values())
    assert "controller" in notes["process.roles"].reason


def test_unknown_keys_warn_unless_strict() -> None:
    cfg = BrokerConfig.from_strings({"log.dri": "/tmp/x"})
    [note] = cfg.notes
    assert (note.key, note.known) == ("log.dri", False)
    with pytest.raises(ConfigError, match="log.dri"):
        BrokerConfig.from_strings({"log.dri": "/tmp/x"}, strict=True)
    # Kafka's own keys are never "unknown", even with --strict.
    assert BrokerConfig.from_strings({"num.network.threads": "3"}, strict=True).notes[0].known


@pytest.mark.parametrize(("key", "value"), [("num.partitions", "many"), ("log.segment.bytes", "1"),
                                            ("group.initial.rebalance.delay.ms", "-5")])
def test_bad_values_of_known_keys_fail_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_strings({key: value})


def test_command_line_strict_refuses_unknown_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "server.properties"
    config.write_text("made.up.key=1\n")
    assert main([str(config), "--strict"]) == 2
    assert "made.up.key" in capsys.readouterr().err
