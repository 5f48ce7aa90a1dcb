"""Client quota enforcement: the sampled rate (Kafka's Rate over a WindowedSum), the throttle time, and which
quota applies to a (user, client-id) pair."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.broker.security.client_quota_manager import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    ClientQuotaManager,
    ClientQuotas,
    SampledRate,
    throttle_time_ms,
)
from shoal.broker.storage.client_quotas import CLIENT_ID, USER, ClientQuotaStore, QuotaOp
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import SplicedBuffer

# (gap in ms since the previous record, value)
records = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 10**6)), min_size=1, max_size=60)
shapes = st.tuples(st.integers(1, 12), st.sampled_from([1, 7, 100, 1000]))


@settings(max_examples=300, deadline=None)
@given(shapes, records, st.integers(0, 5000))
def test_rate_counts_recent_values_over_at_least_the_full_window(shape, recs, later):
    """The rate's sum holds every value of the last `samples - 1` windows and nothing older than
    `samples + 1` windows, and is divided by at least `samples - 1` windows."""
    samples, window = shape
    rate = SampledRate(samples, window)
    now = 0
    history = []
    for gap, value in recs:
        now += gap
        rate.record(value, now)
        history.append((now, value))
    now += later
    window_ms = rate.window_size_ms(now)
    assert window_ms >= max(1, (samples - 1) * window)
    retained = rate.measure(now) * window_ms / 1000
    must = sum(v for t, v in history if t > now - (samples - 1) * window)
    may = sum(v for t, v in history if t > now - (samples + 1) * window)
    assert must - 1e-6 * (must + 1) <= retained <= may + 1e-6 * (may + 1)


@settings(max_examples=200, deadline=None)
@given(shapes, records, st.integers(1, 10**6))
def test_unrecord_takes_a_value_back(shape, recs, value):
    samples, window = shape
    rate = SampledRate(samples, window)
    now = 0
    for gap, v in recs:
        now += gap
        rate.record(v, now)
    before = rate.measure(now)
    rate.record(value, now)
    assert rate.measure(now) > before
    rate.record(-value, now)
    assert math.isclose(rate.measure(now), before, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e9), st.floats(1, 1e7), st.integers(1, 100_000))
def test_throttle_time_brings_the_rate_back_to_the_bound(rate, bound, window_ms):
    """Kafka's QuotaUtils.throttleTime: zero within quota; otherwise the wait after which the same sum over
    the window grown by it is the bound again (to rounding)."""
    throttle = throttle_time_ms(rate, bound, window_ms)
    if rate <= bound:
        assert throttle == 0
        return
    assert throttle >= 0
    total = rate * window_ms / 1000
    assert abs(total / ((window_ms + throttle) / 1000) - bound) <= bound * 0.5 / (window_ms + throttle) + 1e-6 * bound


def test_kafka_example_throttle():
    """A fresh sensor with 11 one-second samples spreads a burst over 10 s (Kafka's ClientQuotaManagerTest)."""
    rate = SampledRate(11, 1000)
    rate.record(2000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == 200
    # 200 B/s against a 100 B/s quota: wait until 2000 bytes spread over 20 s.
    assert throttle_time_ms(rate.measure(0), 100, rate.window_size_ms(0)) == 10_000


class _Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _store(tmp_path: Path, *quotas: tuple[tuple[tuple[str, str | None], ...], str, float]) -> ClientQuotaStore:
    store = ClientQuotaStore(tmp_path)
    for entity, key, value in quotas:
        assert store.alter(entity, [QuotaOp(key, value, False)], validate_only=False) is None
    return store


# Kafka's precedence, most specific first, each with the value it is given below.
LEVELS = [
    (((USER, "alice"), (CLIENT_ID, "app")), 1.0),
    (((USER, "alice"), (CLIENT_ID, None)), 2.0),
    (((USER, "alice"),), 3.0),
    (((USER, None), (CLIENT_ID, "app")), 4.0),
    (((USER, None), (CLIENT_ID, None)), 5.0),
    (((USER, None),), 6.0),
    (((CLIENT_ID, "app"),), 7.0),
    (((CLIENT_ID, None),), 8.0),
]


@pytest.mark.parametrize("first", range(len(LEVELS)))
def test_most_specific_quota_applies(tmp_path, first):
    store = _store(tmp_path, *((entity, PRODUCER_BYTE_RATE, value) for entity, value in LEVELS[first:]))
    manager = ClientQuotaManager(store, PRODUCER_BYTE_RATE, 11, 1)
    assert manager.quota("alice", "app") == LEVELS[first][1]


def test_quota_of_another_key_or_entity_does_not_apply(tmp_path):
    store = _store(tmp_path, (((USER, "bob"),), PRODUCER_BYTE_RATE, 10.0),
                   (((CLIENT_ID, "app"),), CONSUMER_BYTE_RATE, 10.0))
    manager = ClientQuotaManager(store, PRODUCER_BYTE_RATE, 11, 1)
    assert manager.quota("alice", "app") is None
    assert manager.record_and_get_throttle_ms("alice", "app", 10**9, 0) == 0
    assert manager.max_value_in_quota_window("alice", "app") == float("inf")
    assert manager.quota("bob", "other") == 10.0


def test_a_change_of_quota_applies_at_once(tmp_path):
    store = _store(tmp_path)
    manager = ClientQuotaManager(store, PRODUCER_BYTE_RATE, 11, 1)
    assert manager.quota("alice", "app") is None
    store.alter(((CLIENT_ID, None),), [QuotaOp(PRODUCER_BYTE_RATE, 50.0, False)], validate_only=False)
    assert manager.quota("alice", "app") == 50.0
    store.alter(((CLIENT_ID, None),), [QuotaOp(PRODUCER_BYTE_RATE, 0.0, True)], validate_only=False)
    assert manager.quota("alice", "app") is None


def test_client_id_quota_is_shared_by_users_and_user_quota_by_clients(tmp_path):
    store = _store(tmp_path, (((CLIENT_ID, "app"),), PRODUCER_BYTE_RATE, 100.0),
                   (((USER, None),), CONSUMER_BYTE_RATE, 100.0))
    clock = _Clock()
    produce = ClientQuotaManager(store, PRODUCER_BYTE_RATE, 11, 1, clock)
    # 900 bytes in a 10 s window is within 100 B/s; the second user's 900 bytes on the same client id is not.
    assert produce.record_and_get_throttle_ms("alice", "app", 900, 0) == 0
    assert produce.record_and_get_throttle_ms("bob", "app", 900, 0) > 0
    fetch = ClientQuotaManager(store, CONSUMER_BYTE_RATE, 11, 1, clock)
    # The default-user quota gives each user a sensor of their own, shared by that user's client ids.
    assert fetch.record_and_get_throttle_ms("alice", "one", 900, 0) == 0
    assert fetch.record_and_get_throttle_ms("bob", "one", 900, 0) == 0
    assert fetch.record_and_get_throttle_ms("alice", "two", 900, 0) > 0


class _Request:
    def __init__(self, user: str, client_id: str) -> None:
        self.quota_user = user
        self.quota_client_id = client_id
        self.muted: list[int] = []

    def throttle_connection(self, throttle_ms: int) -> None:
        self.muted.append(throttle_ms)


def _fetch_response(*records: bytes) -> messages.FetchResponse:
    fr = messages.FetchResponse
    parts = [fr.PartitionData(partition_index=i, high_watermark=0, last_stable_offset=0, log_start_offset=0,
                              aborted_transactions=None, preferred_read_replica=-1, records=data)
             for i, data in enumerate(records)]
    return fr(error_code=0, session_id=0, responses=[
        fr.FetchableTopicResponse(topic="t", topic_id=b"\x01" * 16, partitions=parts)])


def _share_fetch_response(*records: bytes) -> messages.ShareFetchResponse:
    sf = messages.ShareFetchResponse
    parts = [sf.PartitionData(partition_index=i, records=data, current_leader=sf.LeaderIdAndEpoch(),
                              acquired_records=[sf.AcquiredRecords(first_offset=0, last_offset=0, delivery_count=1)])
             for i, data in enumerate(records)]
    return sf(responses=[sf.ShareFetchableTopicResponse(topic_id=b"\x01" * 16, partitions=parts)], node_endpoints=[])


FETCH_V = 16


def test_throttled_fetch_is_not_counted_and_mutes_the_connection(tmp_path):
    store = _store(tmp_path, (((CLIENT_ID, "reader"),), CONSUMER_BYTE_RATE, 100.0))
    clock = _Clock()
    quotas = ClientQuotas(store, 11, 1, clock)
    request = _Request("ANONYMOUS", "reader")
    assert quotas.fetch_max_bytes(request) == 1000
    big = _fetch_response(b"x" * 700)
    size = messages.response_size(big, ApiKey.FETCH, FETCH_V)
    assert 700 < size < 1000
    assert quotas.throttle_fetch(request, big, ApiKey.FETCH, FETCH_V) == 0
    throttle = quotas.throttle_fetch(request, big, ApiKey.FETCH, FETCH_V)
    assert throttle > 0 and request.muted == [throttle]
    # The throttled response carried no records, so only the first one counts: what is left is within quota.
    rest = _fetch_response(b"y" * (1000 - size - 100))
    assert quotas.throttle_fetch(request, rest, ApiKey.FETCH, FETCH_V) == 0
    # Produce has no quota here: nothing is throttled whatever the size.
    assert quotas.throttle_produce(request, 10**9) == 0 and request.muted == [throttle]


def test_fetch_quota_counts_the_whole_response_not_only_its_records(tmp_path):
    """As Kafka (FetchResponse.sizeOf): a response of many partitions and no records still costs its bytes."""
    store = _store(tmp_path, (((CLIENT_ID, "reader"),), CONSUMER_BYTE_RATE, 100.0))
    quotas = ClientQuotas(store, 11, 1, _Clock())
    request = _Request("ANONYMOUS", "reader")
    empty = _fetch_response(*([b""] * 100))
    assert messages.response_size(empty, ApiKey.FETCH, FETCH_V) > 1000
    assert quotas.throttle_fetch(request, empty, ApiKey.FETCH, FETCH_V) > 0
    share_empty = _share_fetch_response(*([b""] * 100))
    assert quotas.throttle_fetch(_Request("other", "reader2"), share_empty, ApiKey.SHARE_FETCH, 1) == 0
    assert quotas.throttle_fetch(request, share_empty, ApiKey.SHARE_FETCH, 1) > 0


def test_no_quota_no_measure(tmp_path):
    """Without any consumer_byte_rate quota the response is not even measured (it could not throttle)."""
    quotas = ClientQuotas(_store(tmp_path, (((CLIENT_ID, "x"),), PRODUCER_BYTE_RATE, 1.0)), 11, 1, _Clock())
    assert quotas.throttle_fetch(_Request("u", "x"), _fetch_response(b"z" * 10**6), ApiKey.FETCH, FETCH_V) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3 * SplicedBuffer.SPLICE_MIN), min_size=0, max_size=4), st.booleans(),
       st.sampled_from([4, 11, 12, 16, 17]))
def test_response_size_is_the_framed_encoded_size(sizes, share, fetch_version):
    """response_size equals what the connection writes, record sets small (copied) and large (spliced)."""
    records = [bytes(n) for n in sizes]
    body, key, version = ((_share_fetch_response(*records), ApiKey.SHARE_FETCH, 1) if share
                          else (_fetch_response(*records), ApiKey.FETCH, fetch_version))
    parts = messages.encode_response_parts(body, key, version, correlation_id=7)
    assert messages.response_size(body, key, version) == sum(len(memoryview(p)) for p in parts)
