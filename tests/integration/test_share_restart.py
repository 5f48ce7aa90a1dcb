"""A share group survives `kill -9`: membership from `__consumer_offsets`, share-partition state from
`__share_group_state`, both replayed at start-up."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .test_share_protocol import (
    ACCEPT,
    ACKNOWLEDGED,
    ARCHIVED,
    REJECT,
    RawShareMember,
    StateRecord,
    acquired,
    fetch_until,
    join,
    produce_batches,
    share_setup,
    state_records,
    state_summary,
)


def describe(client: WireClient, group: str) -> Any:
    req = messages.ShareGroupDescribeRequest(group_ids=[group], include_authorized_operations=False)
    [g] = client.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, req).groups
    assert g.error_code == ErrorCode.NONE, (g.error_code, g.error_message)
    return g


def group_view(g: Any) -> tuple[Any, ...]:
    members = sorted(
        (m.member_id, m.member_epoch, tuple(sorted(m.subscribed_topic_names or ())),
         tuple(sorted((bytes(tp.topic_id), tuple(sorted(tp.partitions))) for tp in m.assignment.topic_partitions)))
        for m in g.members
    )
    return (g.group_id, g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name, tuple(members))


@pytest.mark.parametrize("updates_per_snapshot", [500, 0], ids=["updates", "snapshots"])
def test_kill_restart_restores_group_and_share_state(fresh_broker: BrokerProcess, updates_per_snapshot: int) -> None:
    # 0 makes every write a full ShareSnapshot, so the replay goes through both record kinds.
    fresh_broker.overrides += [f"share.coordinator.snapshot.update.records.per.snapshot={updates_per_snapshot}"]
    fresh_broker.start()
    s = share_setup(fresh_broker, members=2, partitions=2)
    a, b = s.members
    for p in (0, 1):
        produce_batches(s.admin, s.topic, [10] * 5, partition=p)  # offsets 0-49 in both partitions
    try:
        # Partition 0: a takes 0-19, accepts 0-9 and 15-19, rejects 12 and keeps 10-11, 13-14 unacknowledged.
        assert fetch_until(a, [0], 20, max_records=20) == [(0, (0, 19, 1))]
        assert a.ack_codes({0: [(0, 9, [ACCEPT]), (12, 12, [REJECT]), (15, 19, [ACCEPT])]}) == {0: ErrorCode.NONE}
        # Partition 1: b accepts 0-29.
        assert fetch_until(b, [1], 30, max_records=30) == [(1, (0, 29, 1))]
        assert b.ack_codes({1: [(0, 29, [ACCEPT])]}) == {1: ErrorCode.NONE}

        before_group = group_view(describe(s.admin, s.group))
        assert len(before_group[5]) == 2
        before_summary = state_summary(s.admin, s.group, s.topic_id, [0, 1])
        assert [(p, err, start) for p, err, _se, start, _dcc in before_summary] == [
            (0, ErrorCode.NONE, 10), (1, ErrorCode.NONE, 30)]
        before_log = [state_records(s.admin, s.group, s.topic_id, p) for p in (0, 1)]
        assert before_log[0][-1] == StateRecord("update" if updates_per_snapshot else "snapshot", 10,
                                                [(12, 12, ARCHIVED, 1), (15, 19, ACKNOWLEDGED, 1)])
        # Crash with the members still connected and a still holding 10-11 and 13-14.
        fresh_broker.kill()
    finally:
        s.close()
    fresh_broker.start()

    with WireClient.connect(fresh_broker.bootstrap) as admin:
        # Right after the restart (members only expire after their session timeout).
        assert group_view(describe(admin, s.group)) == before_group
        assert state_summary(admin, s.group, s.topic_id, [0, 1]) == before_summary
        assert [state_records(admin, s.group, s.topic_id, p) for p in (0, 1)] == before_log

        # A new member gets every record that was not accepted (or rejected) and none that was.
        c = RawShareMember(fresh_broker, s.group, s.topic_id)
        try:
            join(c.client, s.group, c.member_id, s.topic, s.topic_id, set())
            expected = {(0, o) for o in (10, 11, 13, 14, *range(20, 50))} | {(1, o) for o in range(30, 50)}
            got = fetch_until(c, [0, 1], len(expected))
            offsets = [(p, o) for p, (first, last, _dc) in got for o in range(first, last + 1)]
            assert sorted(offsets) == sorted(expected)
            # 10-11 and 13-14 were acquired but never acknowledged before the crash: acquisitions are not
            # persisted, so they come back as first deliveries.
            assert {dc for _p, (_f, _l, dc) in got} == {1}
            assert c.ack_codes({0: [(10, 11, [ACCEPT]), (13, 14, [ACCEPT]), (20, 49, [ACCEPT])],
                                1: [(30, 49, [ACCEPT])]}) == {0: ErrorCode.NONE, 1: ErrorCode.NONE}
            assert [(p, err, start) for p, err, _se, start, _dcc in state_summary(admin, s.group, s.topic_id, [0, 1])] \
                == [(0, ErrorCode.NONE, 50), (1, ErrorCode.NONE, 50)]
            assert acquired(c.fetch([0, 1]), 0) == []
        finally:
            c.close()
