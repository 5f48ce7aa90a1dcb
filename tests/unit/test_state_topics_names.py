"""The names of a sidecar deployment's state topics on the upstream (`state_topic_names.py`, the
`upstream.state.topic.prefix` and `upstream.membership.group.id` keys)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.storage.topic_registry import CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE
from shoal.broker.upstream.settings import UpstreamConfigError, parse_upstream
from shoal.broker.upstream.state_topic_names import (
    MAX_PREFIX_LENGTH,
    MAX_TOPIC_NAME_LENGTH,
    StateTopicNames,
    is_state_topic,
)

# Kafka's Topic.validate: a name of legal characters, at most 249 of them, other than "." and "..".
_KAFKA_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_INTERNAL = {CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE}
# Group ids that can name topics, up to the longest the prefix allows (`__shoal_` is 8 characters).
legal_group_ids = st.one_of(st.just("shoal-sidecars"),
                            st.text(alphabet="abcXYZ019._-", min_size=1, max_size=MAX_PREFIX_LENGTH - 8))
# Every prefix the setting takes; short parts made of the suffixes' own words, to look for overlaps.
legal_prefixes = st.one_of(st.just("__shoal"), st.lists(
    st.sampled_from(["share", "group", "state", "consumer", "offsets", "configs", "deployment", "a", "_", "-"]),
    min_size=1, max_size=8).map(lambda parts: "__shoal_" + "".join(parts)))


def _names(keys: dict[str, str]) -> StateTopicNames:
    return parse_upstream({"bootstrap.servers": "h:1", **keys}).state_topics


def _all_names(names: StateTopicNames) -> set[str]:
    return {names.for_internal(CONSUMER_OFFSETS), names.for_internal(SHARE_GROUP_STATE), names.group_configs,
            names.deployment}


def test_the_default_deployment_keeps_the_names_it_had() -> None:
    for keys in ({}, {"membership.group.id": "shoal-sidecars"}):
        names = _names(keys)
        assert (names.for_internal(CONSUMER_OFFSETS), names.for_internal(SHARE_GROUP_STATE), names.group_configs) \
            == ("__shoal_consumer_offsets", "__shoal_share_group_state", "__shoal_group_configs")
        assert names.deployment == "__shoal_deployment"


def test_another_membership_group_gets_topics_of_its_own() -> None:
    names = _names({"membership.group.id": "staging"})
    assert _all_names(names) == {"__shoal_staging_consumer_offsets", "__shoal_staging_share_group_state",
                                 "__shoal_staging_group_configs", "__shoal_staging_deployment"}
    assert set(names.all) == _all_names(names)


def test_an_explicit_prefix_wins_over_the_membership_group() -> None:
    assert _names({"membership.group.id": "prod-2", "state.topic.prefix": "__shoal_prod"}).group_configs == \
        "__shoal_prod_group_configs"
    # A deployment renamed, or given a new group id, can keep the default deployment's topics.
    assert _names({"membership.group.id": "prod-2", "state.topic.prefix": "__shoal"}) == StateTopicNames()


@pytest.mark.parametrize("group_id", ["team a", "équipe", "a/b", "x" * (MAX_PREFIX_LENGTH - 7)])
def test_a_group_id_that_cannot_name_topics_is_refused_with_the_way_out(group_id: str) -> None:
    with pytest.raises(UpstreamConfigError, match=r"upstream\.membership\.group\.id=.*upstream\.state\.topic\.prefix"):
        _names({"membership.group.id": group_id})


@pytest.mark.parametrize("prefix", ["shoal", "__shoalx", "_shoal_a", "__shoal_a b", "__shoal_" + "y" * MAX_PREFIX_LENGTH])
def test_a_prefix_outside_the_shoal_namespace_or_kafkas_rules_is_refused(prefix: str) -> None:
    with pytest.raises(UpstreamConfigError, match=r"upstream\.state\.topic\.prefix"):
        _names({"membership.group.id": "a", "state.topic.prefix": prefix})


def test_the_longest_group_id_allowed_names_legal_topics() -> None:
    names = _names({"membership.group.id": "g" * (MAX_PREFIX_LENGTH - 8)})
    assert max(map(len, _all_names(names))) == MAX_TOPIC_NAME_LENGTH


def test_user_topics_are_not_state_topics() -> None:
    assert not any(is_state_topic(t) for t in ("orders", "__consumer_offsets", "__shoalx", "_shoal_a", None))


@given(legal_group_ids)
def test_every_state_topic_name_is_a_legal_kafka_topic_clients_cannot_write(group_id: str) -> None:
    for name in _all_names(_names({"membership.group.id": group_id})):
        assert _KAFKA_LEGAL.fullmatch(name) and name not in (".", "..")
        assert is_state_topic(name)
        assert name not in _INTERNAL


@given(legal_group_ids, legal_group_ids)
def test_distinct_membership_groups_never_share_a_state_topic(first: str, second: str) -> None:
    a, b = _all_names(_names({"membership.group.id": first})), _all_names(_names({"membership.group.id": second}))
    assert len(a) == len(b) == 4
    assert (a == b) == (first == second)
    assert a == b or not a & b


@given(legal_prefixes, legal_prefixes)
def test_distinct_prefixes_never_share_a_state_topic(first: str, second: str) -> None:
    a = _all_names(_names({"state.topic.prefix": first}))
    b = _all_names(_names({"state.topic.prefix": second}))
    assert len(a) == len(b) == 4
    assert (a == b) == (first == second)
    assert a == b or not a & b
