"""Sidecar mode's state settings and names: the `__shoal_*` topics, the transactional ids that fence their
writers, the `upstream.` keys that are Shoal's own rather than client settings, and how queued state
writes are cut into upstream transactions and batches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE
from shoal.broker.upstream.settings import DEFAULT_MEMBERSHIP_GROUP_ID, UpstreamConfigError, parse_upstream
from shoal.broker.upstream.state_log import (
    appends_per_transaction,
    transaction_batches,
    transaction_version_to_use,
    transactional_id,
)
from shoal.broker.upstream.state_topic_names import StateTopicNames
from shoal.coordinator.offset_metadata_manager import CommittedOffset, offset_commit_record
from shoal.protocol.record_batch import iter_batches


def test_state_topics_carry_the_shoal_prefix_and_never_an_internal_topics_name() -> None:
    names = StateTopicNames()
    assert names.for_internal(CONSUMER_OFFSETS) == "__shoal_consumer_offsets"
    assert names.for_internal(SHARE_GROUP_STATE) == "__shoal_share_group_state"
    assert {names.for_internal(t) for t in (CONSUMER_OFFSETS, SHARE_GROUP_STATE)}.isdisjoint(
        {CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE})


def test_each_state_partition_has_its_own_transactional_id_per_membership_group() -> None:
    ids = {transactional_id(group, topic, p) for group in ("a", "b") for topic in ("__shoal_x", "__shoal_y")
           for p in range(3)}
    assert len(ids) == 12
    assert transactional_id("shoal-sidecars", "__shoal_share_group_state", 7) == \
        "shoal-shoal-sidecars-state-__shoal_share_group_state-7"


def test_membership_group_and_state_replication_factor_are_shoal_keys() -> None:
    default = parse_upstream({"bootstrap.servers": "h:1"})
    assert default.membership_group_id == DEFAULT_MEMBERSHIP_GROUP_ID == "shoal-sidecars"
    assert default.state_topic_replication_factor is None  # the upstream's default
    chosen = parse_upstream({"bootstrap.servers": "h:1", "membership.group.id": "team-a",
                             "state.topic.replication.factor": "3"})
    assert (chosen.membership_group_id, chosen.state_topic_replication_factor) == ("team-a", 3)
    assert parse_upstream({"bootstrap.servers": "h:1",
                           "state.topic.replication.factor": "-1"}).state_topic_replication_factor is None


@pytest.mark.parametrize("keys", [
    {"state.topic.replication.factor": "0"},
    {"state.topic.replication.factor": "three"},
    {"membership.group.id": " "},
    {"state.transaction.version": "3"},
    {"state.transaction.version": "two"},
])
def test_bad_state_settings_are_refused_by_name(keys: dict[str, str]) -> None:
    with pytest.raises(UpstreamConfigError,
                       match="upstream\\.(state\\.topic\\.replication\\.factor|membership|state\\.transaction)"):
        parse_upstream({"bootstrap.servers": "h:1", **keys})


@given(st.lists(st.integers(min_value=1, max_value=50), max_size=40), st.integers(min_value=1, max_value=120))
def test_a_transaction_takes_the_oldest_appends_that_fit_and_at_least_one(queued: list[int], limit: int) -> None:
    taken = appends_per_transaction(queued, limit)
    if not queued:
        assert taken == 0
        return
    assert 1 <= taken <= len(queued)
    assert taken == 1 or sum(queued[:taken]) <= limit  # within the limit, unless one append alone is larger
    assert taken == len(queued) or sum(queued[:taken + 1]) > limit  # the next one would not fit


def test_every_queued_append_is_taken_in_order_across_transactions() -> None:
    queued, limit, transactions = [3, 5, 1, 9, 2, 2, 7], 8, []
    while queued:
        taken = appends_per_transaction(queued, limit)
        transactions.append(queued[:taken])
        queued = queued[taken:]
    assert transactions == [[3, 5], [1], [9], [2, 2], [7]]


def test_the_state_transaction_version_setting_caps_what_the_writers_use() -> None:
    assert parse_upstream({"bootstrap.servers": "h:1"}).state_transaction_version == 2
    assert parse_upstream({"bootstrap.servers": "h:1", "state.transaction.version": "1"}).state_transaction_version == 1


@pytest.mark.parametrize(("finalized", "produce_max", "end_txn_max", "cap", "used"), [
    (2, 13, 5, 2, 2),  # Kafka 4.x, standalone Shoal: no AddPartitionsToTxn
    (2, 13, 5, 1, 1),  # the setting keeps TV1
    (1, 13, 5, 2, 1),  # TV2 served but not finalized
    (0, 11, 4, 2, 1),  # Kafka 3.9, librdkafka's mock, Tansu: no transaction.version feature
    (2, 11, 5, 2, 1),  # finalized, but no Produce v12 to add the partition with
    (2, 12, 4, 2, 1),  # nor EndTxn v5 to bump the epoch with
])
def test_transaction_version_2_needs_the_feature_and_the_request_versions(
        finalized: int, produce_max: int, end_txn_max: int, cap: int, used: int) -> None:
    assert transaction_version_to_use(finalized, produce_max, end_txn_max, cap) == used


@given(st.lists(st.lists(st.text(max_size=300), min_size=1, max_size=5), min_size=1, max_size=6),
       st.integers(0, 1000), st.sampled_from([200, 2_000, 1_000_000]))
def test_a_transaction_is_one_batch_per_produce_with_sequences_in_order(
        appends_metadata: list[list[str]], sequence: int, max_bytes: int) -> None:
    """Kafka takes one magic v2 batch per partition in a Produce: the appends are one batch when it fits,
    else one batch each; either way the record counts add up and the sequences run on without a gap."""
    appends = [[offset_commit_record("g", "t", i, CommittedOffset(i, -1, meta, 0)) for i, meta in enumerate(metas)]
               for metas in appends_metadata]
    batches = transaction_batches(appends, 7, 3, sequence, max_bytes)
    total = sum(len(a) for a in appends)
    if len(appends) == 1 or len(transaction_batches(appends, 7, 3, sequence)[0][0]) <= max_bytes:
        assert len(batches) == 1
    else:
        assert [count for _b, count in batches] == [len(a) for a in appends]
    expected_sequence = sequence
    for batch, count in batches:
        [(_pos, header)] = list(iter_batches(batch))  # exactly one batch
        assert (header.producer_id, header.producer_epoch, header.is_transactional) == (7, 3, True)
        assert (header.base_sequence, header.records_count) == (expected_sequence, count)
        expected_sequence += count
    assert expected_sequence == sequence + total
