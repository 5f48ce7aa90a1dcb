"""The record value format of `__shoal_group_configs` (sidecar mode's group configs on the upstream)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.upstream.group_config_log import (
    GROUP_CONFIGS_TOPIC,
    GroupConfigView,
    change_records,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from shoal.broker.upstream.state_topic_names import is_state_topic

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


# ---- the records of one change per (group, name) ------------------------------------------------------

names = st.sampled_from(["share.auto.offset.reset", "share.delivery.count.limit", "share.isolation.level"])
changes = st.lists(st.tuples(st.sampled_from(["g1", "g2"]), names, st.one_of(st.none(), st.text(max_size=8))),
                   max_size=30)


def _in_order(log: list[tuple[str, str, str | None]]) -> dict[str, dict[str, str]]:
    """Each change applied in the partition's order: what every sidecar must end with."""
    groups: dict[str, dict[str, str]] = {}
    for group, name, value in log:
        configs = groups.setdefault(group, {})
        if value is None:
            configs.pop(name, None)
        else:
            configs[name] = value
    return {g: c for g, c in groups.items() if c}


def _records(log: list[tuple[str, str, str | None]]) -> list[tuple[bytes, bytes | None, int]]:
    return [(record.key, record.value, offset)
            for offset, (group, name, value) in enumerate(log)
            for record in change_records(group, [(name, value)])
            if record.key is not None]


@given(changes, st.data())
def test_an_own_write_applied_before_the_tail_reaches_older_records_is_not_undone(
        log: list[tuple[str, str, str | None]], data: st.DataObject) -> None:
    # A sidecar applies its own write (offset w) at once; its tail then reads the records before it, some
    # of them older changes of the same name made through other sidecars, and reaches w later.
    if not log:
        return
    w = data.draw(st.integers(0, len(log) - 1))
    j = data.draw(st.integers(0, w))
    records = _records(log)
    view = GroupConfigView()
    view.apply_record(*records[w])
    for record in records[:j]:
        view.apply_record(*record)
    assert view.groups == _in_order([*log[:j], log[w]])
    for record in records[j:]:
        view.apply_record(*record)
    assert view.groups == _in_order(log)


@given(changes)
def test_compaction_keeps_what_the_log_says(log: list[tuple[str, str, str | None]]) -> None:
    # The upstream's cleaner keeps each key's latest record: a sidecar reading the compacted partition
    # ends with the same configs as one that read every record.
    records = _records(log)
    latest = {key: (key, value, offset) for key, value, offset in records}
    compacted = sorted(latest.values(), key=lambda r: r[2])
    view = GroupConfigView()
    for key, value, offset in compacted:
        view.apply_record(key, value, offset)
    assert view.groups == _in_order(log)


def test_a_whole_map_record_of_the_earlier_layout_sets_its_names_and_deletes_the_others() -> None:
    view = GroupConfigView()
    view.apply_record(encode_key("g", "share.isolation.level"), b"read_committed", 0)
    view.apply_record(b"g", encode_value({"share.auto.offset.reset": "earliest"}), 1)
    assert view.groups == {"g": {"share.auto.offset.reset": "earliest"}} and view.whole_map_groups == {"g"}
    view.apply_record(encode_key("g", "share.delivery.count.limit"), b"3", 2)
    assert view.explicit("g") == {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"}
    view.apply_record(b"g", None, 3)  # the tombstone deleting the group writes
    assert view.groups == {} and view.whole_map_groups == set()


def test_keys_name_group_and_config() -> None:
    assert decode_key(encode_key("a:b[c]", "share.isolation.level")) == ("a:b[c]", "share.isolation.level")
    assert decode_key(b"plain-group") == ("plain-group", None)
    assert decode_key(b'["not", "a", "pair"]') == ('["not", "a", "pair"]', None)
