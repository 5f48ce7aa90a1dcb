"""Acknowledgements piggybacked on a ShareFetch are applied before that fetch acquires, as in Kafka: at
the in-flight limit (share.partition.max.record.locks) an ACCEPT frees room for the very fetch that
carries it, while a record it RELEASEs is not handed straight back by it. And Shoal's headers-only
acquisition through the same path. Raw requests against the real broker process."""

from __future__ import annotations

import pytest

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_packed_headers

from .broker_process import BrokerProcess
from .share_clients import set_group_config
from .test_share_protocol import ACCEPT, RELEASE, ack_error, acquired, produce_batches, share_setup

LIMIT = 100  # the smallest share.partition.max.record.locks a group may set


@pytest.mark.external
def test_piggybacked_accept_frees_room_for_the_same_fetch(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[LIMIT])
    set_group_config(broker.bootstrap, s.group, share_partition_max_record_locks=str(LIMIT))
    [m] = s.members
    try:
        assert acquired(m.fetch([0], max_wait_ms=5000)) == [(0, LIMIT - 1, 1)]
        assert produce_batches(s.admin, s.topic, [50]) == [LIMIT]
        # At the limit nothing more goes out while the member holds 0-99.
        assert acquired(m.fetch([0])) == []
        # The ACCEPT of 0-99 rides on a fetch that does not wait: only if it is applied before that
        # fetch acquires can the fetch take the new records.
        resp = m.fetch([0], acks={0: [(0, LIMIT - 1, [ACCEPT])]}, max_wait_ms=0)
        assert ack_error(resp) == ErrorCode.NONE
        assert acquired(resp) == [(LIMIT, LIMIT + 49, 1)]
    finally:
        s.close()


@pytest.mark.external
def test_piggybacked_release_is_not_handed_back_by_the_same_fetch(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[10, 5])
    [m] = s.members
    try:
        assert acquired(m.fetch([0], max_records=10, batch_size=10, max_wait_ms=5000)) == [(0, 9, 1)]
        # Released records are in a state transition until their write completes: this fetch gets the
        # next batch, not 0-9 again.
        resp = m.fetch([0], acks={0: [(0, 9, [RELEASE])]}, max_wait_ms=0)
        assert ack_error(resp) == ErrorCode.NONE
        assert acquired(resp) == [(10, 14, 1)]
        # Once written, the released records go out again with their delivery counted.
        assert acquired(m.fetch([0], max_wait_ms=5000)) == [(0, 9, 2)]
    finally:
        s.close()


@pytest.mark.external
def test_a_headers_only_fetch_gets_each_acquired_batch_s_header_alone(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[3, 4])
    [m] = s.members
    req = messages.ShareFetchRequest
    try:
        body = req(group_id=s.group, member_id=m.member_id, share_session_epoch=0, max_wait_ms=5000, min_bytes=1,
                   max_bytes=1 << 20, max_records=500, batch_size=500, shoal_headers_only=True,
                   topics=[req.FetchTopic(topic_id=s.topic_id, partitions=[req.FetchPartition(partition_index=0)])],
                   forgotten_topics_data=[])
        resp = m.client.request(ApiKey.SHARE_FETCH, 1, body)
        assert acquired(resp) == [(0, 6, 1)]
        [pd] = [p for t in resp.responses for p in t.partitions]
        assert not pd.records
        headers = list(iter_packed_headers(bytes(pd.shoal_batch_headers)))
        assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 2), (3, 6)]
    finally:
        s.close()
