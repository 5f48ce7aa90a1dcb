"""Share-group behaviour Kafka clients and operators notice, on raw sockets against the real broker:
what one ShareFetch hands back after a piggybacked RELEASE, long polls (MinBytes, the byte budget),
share-session responses, by_duration, acknowledgements of partitions not loaded, and forgetting a
group's share partitions when its last session on the broker closes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import create_topic, set_group_config
from .test_metrics import scrape
from .test_share_protocol import (
    ACCEPT,
    RELEASE,
    RawShareMember,
    ack_error,
    acquired,
    join,
    produce_batches,
    share_setup,
    topic_id_of,
    unique,
)

Req = messages.ShareFetchRequest


def raw_fetch(member: RawShareMember, parts: list[tuple[int, list[tuple[int, int, list[int]]]]], *,
              forgotten: list[int] | None = None, min_bytes: int = 1, max_bytes: int = 1 << 20,
              max_wait_ms: int = 0, max_records: int = 500) -> Any:
    """A ShareFetch with partitions exactly as given (repeats and ForgottenTopicsData included)."""
    body = Req(group_id=member.group, member_id=member.member_id, share_session_epoch=member.epoch,
               max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, max_records=max_records,
               batch_size=max_records,
               topics=[Req.FetchTopic(topic_id=member.topic_id, partitions=[  # type: ignore[attr-defined]
                   Req.FetchPartition(partition_index=p, acknowledgement_batches=[  # type: ignore[attr-defined]
                       Req.AcknowledgementBatch(first_offset=a, last_offset=b, acknowledge_types=t)  # type: ignore[attr-defined]
                       for a, b, t in acks])
                   for p, acks in parts])],
               forgotten_topics_data=[Req.ForgottenTopic(topic_id=member.topic_id,  # type: ignore[attr-defined]
                                                         partitions=forgotten)] if forgotten else [])
    resp = member.client.request(ApiKey.SHARE_FETCH, 1, body)
    assert resp.error_code == ErrorCode.NONE, resp.error_code
    member.epoch = 1 if member.epoch == 0 else member.epoch + 1
    return resp


def partitions_in(resp: Any) -> dict[int, tuple[int, int]]:
    """partition -> (error code, acknowledge error code) of every partition the response names."""
    return {p.partition_index: (p.error_code, p.acknowledge_error_code) for t in resp.responses for p in t.partitions}


# ---- item: a RELEASE is not handed straight back ---------------------------------------------------


@pytest.mark.external
def test_piggybacked_release_is_not_handed_back_in_the_same_response(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[5, 5])
    [m] = s.members
    try:
        assert acquired(m.fetch([0], max_records=1)) == [(0, 4, 1)]
        # The release's write runs alongside the fetch; records in that transition are not acquirable.
        resp = m.fetch([0], acks={0: [(0, 4, [RELEASE])]}, max_wait_ms=5000)
        assert ack_error(resp) == ErrorCode.NONE
        assert acquired(resp) == [(5, 9, 1)]
        # Once written, they are available again (to anyone).
        assert acquired(m.fetch([0], acks={0: [(5, 9, [ACCEPT])]}, max_wait_ms=5000)) == [(0, 4, 2)]
    finally:
        s.close()


# ---- item: long polls ---------------------------------------------------------------------------------


@pytest.mark.external
def test_long_poll_waits_for_min_bytes(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[1])
    [m] = s.members
    try:
        # One small record is less than MinBytes: the fetch waits for more instead of answering with it.
        # (MaxWaitMs is beyond the client's 30 s socket timeout: only the produce below can answer it.)
        m.client.send(ApiKey.SHARE_FETCH, 1, Req(
            group_id=s.group, member_id=m.member_id, share_session_epoch=0, max_wait_ms=120_000, min_bytes=4000,
            max_bytes=1 << 20, max_records=500, batch_size=500,
            topics=[Req.FetchTopic(topic_id=s.topic_id, partitions=[  # type: ignore[attr-defined]
                Req.FetchPartition(partition_index=0, acknowledgement_batches=[])])],  # type: ignore[attr-defined]
            forgotten_topics_data=[]))
        time.sleep(0.2)  # not asserted on: the fetch is parked whether or not it arrived first
        produce_batches(s.admin, s.topic, [100], prefix="x" * 60)  # well over 4000 bytes
        _corr, resp = m.client.receive(ApiKey.SHARE_FETCH, 1)
        m.epoch = 1
        assert acquired(resp) == [(0, 100, 1)]
        # MinBytes never reached: at MaxWaitMs whatever is there is answered.
        produce_batches(s.admin, s.topic, [1])
        assert acquired(raw_fetch(m, [(0, [])], min_bytes=1 << 20, max_wait_ms=300)) == [(101, 101, 1)]
    finally:
        s.close()


@pytest.mark.external
def test_max_bytes_is_split_evenly_between_partitions(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, partitions=2)
    [m] = s.members
    try:
        for p in (0, 1):
            produce_batches(s.admin, s.topic, [20] * 8, partition=p, prefix="x" * 40)
        batch_bytes = len(encode_batch([RecordInput(value=b"x" * 45) for _ in range(20)]))
        join(m.client, s.group, m.member_id, s.topic, s.topic_id, {0, 1})
        resp = raw_fetch(m, [(0, []), (1, [])], max_bytes=4 * batch_bytes)
        got = {p: sum(b - a + 1 for a, b, _ in acquired(resp, p)) for p in (0, 1)}
        # Half the budget each: two or three batches per partition, not four from the first and none after.
        assert all(40 <= n <= 60 for n in got.values()), got
    finally:
        s.close()


# ---- item: share session responses -----------------------------------------------------------------


@pytest.mark.external
def test_forgotten_topics_data_is_ignored_when_opening_a_session(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[3])
    [m] = s.members
    try:
        resp = raw_fetch(m, [(0, [])], forgotten=[0], max_records=1)
        assert 0 in partitions_in(resp)
        assert acquired(resp) == [(0, 2, 1)]
        # The session holds partition 0: a fetch naming no partition still serves it.
        produce_batches(s.admin, s.topic, [2])
        assert acquired(raw_fetch(m, [], max_wait_ms=5000)) == [(3, 4, 1)]
    finally:
        s.close()


@pytest.mark.external
def test_a_partition_named_twice_counts_with_its_last_entry(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[5, 5])
    [m] = s.members
    try:
        assert acquired(m.fetch([0], max_records=1)) == [(0, 4, 1)]
        resp = raw_fetch(m, [(0, [(0, 4, [ACCEPT])]), (0, [(0, 4, [RELEASE])])], max_records=1)
        assert partitions_in(resp) == {0: (ErrorCode.NONE, ErrorCode.NONE)}
        assert acquired(resp) == [(5, 9, 1)]
        # Released, not accepted: the records come back with their delivery count raised.
        assert acquired(raw_fetch(m, [(0, [(5, 9, [ACCEPT])])], max_wait_ms=5000)) == [(0, 4, 2)]
    finally:
        s.close()


@pytest.mark.external
def test_a_partition_whose_error_cleared_is_sent_again(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, partitions=1)
    [m] = s.members
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        resp = raw_fetch(m, [(0, []), (1, [])])
        assert partitions_in(resp)[1] == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NONE)
        assert partitions_in(raw_fetch(m, []))[1][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # still failing
        for future in admin.create_partitions([NewPartitions(s.topic, 2)]).values():
            future.result(30)
        join(m.client, s.group, m.member_id, s.topic, s.topic_id, {0, 1})  # partition 1 gets share state
        # Nothing to deliver, no error: named once more so the client learns the error has cleared.
        assert partitions_in(raw_fetch(m, [])) == {1: (ErrorCode.NONE, ErrorCode.NONE)}
        assert partitions_in(raw_fetch(m, [])) == {}
    finally:
        s.close()


# ---- item: acknowledgements of a partition that is not loaded ---------------------------------------


@pytest.mark.external
def test_empty_acknowledgements_for_a_partition_not_loaded_are_fine(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, partitions=2, batches=[2])
    [m] = s.members
    try:
        assert acquired(m.fetch([0])) == [(0, 1, 1)]
        assert m.ack_codes({0: [(0, 1, [ACCEPT])], 1: []}) == {0: ErrorCode.NONE, 1: ErrorCode.NONE}
        # Acknowledging records of a partition this broker has not loaded is still refused.
        assert m.ack_codes({1: [(0, 0, [ACCEPT])]}) == {1: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    finally:
        s.close()


# ---- item: share.auto.offset.reset=by_duration -------------------------------------------------------


@pytest.mark.external
def test_by_duration_starts_at_the_first_record_at_or_after_the_time(broker: BrokerProcess) -> None:
    topic, group = unique("bd"), unique("bdg")
    create_topic(broker.bootstrap, topic, 1)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset="by_duration:PT1H")
    now = int(time.time() * 1000)
    old, recent = now - 3 * 3_600_000, now - 60_000
    with WireClient.connect(broker.bootstrap) as admin:
        tid = topic_id_of(admin, topic)
        batch = encode_batch([RecordInput(value=f"r{i}".encode(), timestamp=old if i < 3 else recent)
                              for i in range(5)])
        produce = messages.ProduceRequest
        part = produce.PartitionProduceData(index=0, records=batch)  # type: ignore[attr-defined]
        resp = admin.request(ApiKey.PRODUCE, 9, produce(
            transactional_id=None, acks=-1, timeout_ms=10_000,
            topic_data=[produce.TopicProduceData(name=topic, partition_data=[part])]))  # type: ignore[attr-defined]
        assert [p.error_code for t in resp.responses for p in t.partition_responses] == [ErrorCode.NONE]
    m = RawShareMember(broker, group, tid)
    try:
        join(m.client, group, m.member_id, topic, tid, {0})
        assert acquired(m.fetch([0], max_wait_ms=5000)) == [(3, 4, 1)]
    finally:
        m.close()


# ---- item: idle groups do not keep their share partitions in memory -----------------------------------


def loaded_share_partitions(broker: BrokerProcess, group: str) -> set[str]:
    samples, _types = scrape(broker)
    return {dict(labels)["partition"] for (name, labels) in samples
            if name == "shoal_share_partition_start_offset" and dict(labels).get("group") == group}


def test_share_partitions_are_dropped_when_the_groups_last_session_closes(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, partitions=2, batches=[3])
    a, b = s.members
    try:
        assert acquired(a.fetch([0, 1])) == [(0, 2, 1)]
        assert acquired(b.fetch([0, 1])) == []
        assert loaded_share_partitions(broker, s.group) == {"0", "1"}
        assert a.fetch([], acks={0: [(0, 2, [ACCEPT])]}, epoch=-1).error_code == ErrorCode.NONE
        assert loaded_share_partitions(broker, s.group) == {"0", "1"}  # b's session is still open
        assert b.acknowledge({}, epoch=-1).error_code == ErrorCode.NONE
        assert loaded_share_partitions(broker, s.group) == set()
        # Loaded again on next use, from what was made durable.
        c = RawShareMember(broker, s.group, s.topic_id)
        s.members.append(c)
        produce_batches(s.admin, s.topic, [2])
        assert acquired(c.fetch([0], max_wait_ms=5000)) == [(3, 4, 1)]
    finally:
        s.close()
