"""The record value format of `__shoal_group_configs` (sidecar mode's group configs on the upstream)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.upstream.group_config_log import GROUP_CONFIGS_TOPIC, decode_value, encode_value
from shoal.broker.upstream.state_topics import is_state_topic

configs = st.dictionaries(st.text(min_size=1, max_size=40), st.text(max_size=60), max_size=8)


@given(configs)
def test_value_round_trips(group: dict[str, str]) -> None:
    assert decode_value(encode_value(group)) == (group or None)


def test_no_configs_is_a_tombstone() -> None:
    assert encode_value({}) is None and encode_value(None) is None
    assert decode_value(None) is None


@pytest.mark.parametrize("value", [b"[1, 2]", b'{"a": 1}', b"not json", b'"text"'])
def test_unreadable_values_are_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_value(value)


def test_topic_is_a_state_topic_clients_may_not_write() -> None:
    assert GROUP_CONFIGS_TOPIC == "__shoal_group_configs"
    assert is_state_topic(GROUP_CONFIGS_TOPIC)
