"""Share-group protocol on raw sockets against the real broker: the KIP-932 worked example end to end
(acquisitions, delivery counts and every WriteShareGroupState as read back from `__share_group_state`),
and bad or awkward requests answered with the documented error codes while the partition's state stays
as it was."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from shoal.coordinator.share_state import state_partition_for
from shoal.persister.persister import SharePartitionKey
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.coordinator_records import SHARE_GROUP_STATE, SHARE_SNAPSHOT, SHARE_UPDATE, decode_record
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, decode_batches, encode_batch

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import create_topic, set_group_config

GAP, ACCEPT, RELEASE, REJECT = 0, 1, 2, 3
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
STATE_TOPIC = "__share_group_state"
WAIT_S = 30.0  # upper bound for things that happen "soon" (assignment, releases); never asserted on

Ack = tuple[int, int, list[int]]  # first offset, last offset, acknowledge types
Acquired = tuple[int, int, int]  # first offset, last offset, delivery count
StateBatch = tuple[int, int, int, int]  # first, last, state, delivery count


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_member_id() -> str:
    return uuid.uuid4().hex[:22]


# ---- plain requests -----------------------------------------------------------------------------------


def topic_id_of(client: WireClient, topic: str) -> bytes:
    md = messages.MetadataRequest
    req = md(topics=[md.MetadataRequestTopic(name=topic, topic_id=b"\x00" * 16)],  # type: ignore[attr-defined]
             allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    resp = client.request(ApiKey.METADATA, 12, req)
    [t] = resp.topics
    assert t.error_code == ErrorCode.NONE, t.error_code
    return bytes(t.topic_id)


def produce_batches(client: WireClient, topic: str, sizes: list[int], partition: int = 0,
                    prefix: str = "r", keyed: bool = False) -> list[int]:
    """One produce per log batch (so batch boundaries are exactly `sizes`); returns the base offsets.
    `keyed` gives every record a key of its own (a compacted topic refuses records without one)."""
    req = messages.ProduceRequest
    bases = []
    for b, n in enumerate(sizes):
        batch = encode_batch([RecordInput(key=f"{prefix}-{b}-{i}".encode() if keyed else None,
                                          value=f"{prefix}-{i}".encode()) for i in range(n)])
        part = req.PartitionProduceData(index=partition, records=batch)  # type: ignore[attr-defined]
        data = req.TopicProduceData(name=topic, partition_data=[part])  # type: ignore[attr-defined]
        resp = client.request(ApiKey.PRODUCE, 9, req(transactional_id=None, acks=-1, timeout_ms=10_000,
                                                     topic_data=[data]))
        [pr] = [p for t in resp.responses for p in t.partition_responses]
        assert pr.error_code == ErrorCode.NONE, pr.error_code
        bases.append(pr.base_offset)
    return bases


def heartbeat(client: WireClient, group: str, member: str, epoch: int, topics: list[str] | None) -> Any:
    req = messages.ShareGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                                              subscribed_topic_names=topics)
    return client.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, req)


def join(client: WireClient, group: str, member: str, topic: str, topic_id: bytes, partitions: set[int]) -> int:
    """Join with epoch 0, then heartbeat until the assignment is not empty and holds `partitions` (the
    share-partition state of assigned partitions is initialised by then); returns the member epoch."""
    resp = heartbeat(client, group, member, 0, [topic])
    assert resp.error_code == ErrorCode.NONE, (resp.error_code, resp.error_message)
    deadline = time.monotonic() + WAIT_S
    while True:
        assigned = {p for tp in (resp.assignment.topic_partitions if resp.assignment else [])
                    if tp.topic_id == topic_id for p in tp.partitions}
        if assigned and partitions <= assigned:
            return int(resp.member_epoch)
        assert time.monotonic() < deadline, f"{member} not assigned {partitions} (has {assigned})"
        time.sleep(0.2)
        resp = heartbeat(client, group, member, resp.member_epoch, None)
        assert resp.error_code == ErrorCode.NONE, (resp.error_code, resp.error_message)


def state_summary(client: WireClient, group: str, topic_id: bytes, partitions: list[int]) -> list[tuple[int, ...]]:
    """ReadShareGroupStateSummary v1: (partition, error, state epoch, start offset, delivery complete count)."""
    req = messages.ReadShareGroupStateSummaryRequest
    body = req(group_id=group, topics=[req.ReadStateSummaryData(  # type: ignore[attr-defined]
        topic_id=topic_id, partitions=[req.PartitionData(partition=p, leader_epoch=0)  # type: ignore[attr-defined]
                                       for p in partitions])])
    resp = client.request(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, body)
    return [(p.partition, p.error_code, p.state_epoch, p.start_offset, p.delivery_complete_count)
            for r in resp.results for p in r.partitions]


@dataclass(frozen=True)
class StateRecord:
    kind: str  # "snapshot" or "update"
    start_offset: int
    batches: list[StateBatch] = field(default_factory=list)


def state_partition_count(client: WireClient) -> int:
    """The partition count `__share_group_state` was created with (share.coordinator.state.topic.num.partitions)."""
    md = messages.MetadataRequest
    resp = client.request(ApiKey.METADATA, 12, md(topics=[md.MetadataRequestTopic(topic_id=bytes(16), name=STATE_TOPIC)],  # type: ignore[attr-defined]
                                                  allow_auto_topic_creation=False))
    [topic] = resp.topics
    assert topic.error_code == ErrorCode.NONE, topic.error_code
    return len(topic.partitions)


def state_records(client: WireClient, group: str, topic_id: bytes, partition: int) -> list[StateRecord]:
    """Every ShareSnapshot/ShareUpdate written for one share partition, read back with a plain Fetch from the
    `__share_group_state` partition the share coordinator places the key on."""
    key = SharePartitionKey(group, topic_id, partition)
    sp = state_partition_for(key, state_partition_count(client))
    fr = messages.FetchRequest
    out: list[StateRecord] = []
    offset = 0
    while True:
        body = fr(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=16 << 20, isolation_level=0, session_id=0,
                  session_epoch=-1, topics=[fr.FetchTopic(topic=STATE_TOPIC, partitions=[  # type: ignore[attr-defined]
                      fr.FetchPartition(partition=sp, fetch_offset=offset,  # type: ignore[attr-defined]
                                        partition_max_bytes=16 << 20)])],
                  forgotten_topics_data=[], rack_id="")
        resp = client.request(ApiKey.FETCH, 12, body)
        [pd] = [p for t in resp.responses for p in t.partitions]
        assert pd.error_code == ErrorCode.NONE, pd.error_code
        records = decode_batches(bytes(pd.records or b""))
        for r in records:
            rec = decode_record(r.key, r.value, topic=SHARE_GROUP_STATE)
            if rec.record_type not in (SHARE_SNAPSHOT, SHARE_UPDATE):
                continue
            if (rec.key.group_id, bytes(rec.key.topic_id), rec.key.partition) != (group, topic_id, partition):
                continue
            assert rec.value is not None, "unexpected tombstone"
            out.append(StateRecord(
                "snapshot" if rec.record_type == SHARE_SNAPSHOT else "update",
                rec.value.start_offset,
                [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in rec.value.state_batches],
            ))
        if not records or records[-1].offset + 1 >= pd.high_watermark:
            return out
        offset = records[-1].offset + 1


# ---- a raw share consumer ------------------------------------------------------------------------------


class RawShareMember:
    """One member's share session on its own connection, tracking the session epoch as a client would."""

    def __init__(self, broker: BrokerProcess, group: str, topic_id: bytes, member_id: str | None = None):
        self.client = WireClient.connect(broker.bootstrap)
        self.group = group
        self.topic_id = topic_id
        self.member_id = member_id or new_member_id()
        self.epoch = 0

    def _advance(self, sent_epoch: int, error_code: int) -> None:
        if error_code == ErrorCode.NONE:
            self.epoch = -2 if sent_epoch == -1 else (1 if sent_epoch == 0 else sent_epoch + 1)

    def fetch(self, partitions: list[int], *, max_records: int = 500, max_wait_ms: int = 0,
              acks: dict[int, list[Ack]] | None = None, epoch: int | None = None,
              member_id: str | None = None, batch_size: int = 500) -> Any:
        req = messages.ShareFetchRequest
        acks = acks or {}
        parts = [
            req.FetchPartition(partition_index=p, acknowledgement_batches=[  # type: ignore[attr-defined]
                req.AcknowledgementBatch(first_offset=a, last_offset=b, acknowledge_types=t)  # type: ignore[attr-defined]
                for a, b, t in acks.get(p, [])])
            for p in sorted(set(partitions) | set(acks))
        ]
        sent = self.epoch if epoch is None else epoch
        body = req(group_id=self.group, member_id=self.member_id if member_id is None else member_id,
                   share_session_epoch=sent, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                   max_records=max_records, batch_size=batch_size,
                   topics=[req.FetchTopic(topic_id=self.topic_id, partitions=parts)],  # type: ignore[attr-defined]
                   forgotten_topics_data=[])
        resp = self.client.request(ApiKey.SHARE_FETCH, 1, body)
        if epoch is None:
            self._advance(sent, resp.error_code)
        return resp

    def acknowledge(self, acks: dict[int, list[Ack]], *, epoch: int | None = None,
                    member_id: str | None = None) -> Any:
        req = messages.ShareAcknowledgeRequest
        sent = self.epoch if epoch is None else epoch
        body = req(group_id=self.group, member_id=self.member_id if member_id is None else member_id,
                   share_session_epoch=sent, topics=[req.AcknowledgeTopic(  # type: ignore[attr-defined]
                       topic_id=self.topic_id, partitions=[
                           req.AcknowledgePartition(partition_index=p, acknowledgement_batches=[  # type: ignore[attr-defined]
                               req.AcknowledgementBatch(first_offset=a, last_offset=b,  # type: ignore[attr-defined]
                                                        acknowledge_types=t)
                               for a, b, t in batches])
                           for p, batches in sorted(acks.items())])])
        resp = self.client.request(ApiKey.SHARE_ACKNOWLEDGE, 1, body)
        if epoch is None:
            self._advance(sent, resp.error_code)
        return resp

    def ack_codes(self, acks: dict[int, list[Ack]]) -> dict[int, int]:
        """ShareAcknowledge; per-partition error codes (the top level must be fine)."""
        resp = self.acknowledge(acks)
        assert resp.error_code == ErrorCode.NONE, resp.error_code
        return {p.partition_index: p.error_code for t in resp.responses for p in t.partitions}

    def close(self) -> None:
        self.client.close()


def acquired(resp: Any, partition: int = 0) -> list[Acquired]:
    assert resp.error_code == ErrorCode.NONE, (resp.error_code, resp.error_message)
    out: list[Acquired] = []
    for t in resp.responses:
        for p in t.partitions:
            if p.partition_index == partition:
                assert p.error_code == ErrorCode.NONE, p.error_code
                out += [(r.first_offset, r.last_offset, r.delivery_count) for r in p.acquired_records]
    return out


def ack_error(resp: Any, partition: int = 0) -> int:
    assert resp.error_code == ErrorCode.NONE, resp.error_code
    [code] = [p.acknowledge_error_code for t in resp.responses for p in t.partitions if p.partition_index == partition]
    return int(code)


def delivered_offsets(resp: Any, partition: int = 0) -> set[int]:
    """Offsets the client keeps: records in the payload that fall inside AcquiredRecords."""
    ranges = acquired(resp, partition)
    records = [r for t in resp.responses for p in t.partitions if p.partition_index == partition
               for r in decode_batches(bytes(p.records or b""))]
    return {r.offset for r in records if any(a <= r.offset <= b for a, b, _ in ranges)}


def fetch_until(member: RawShareMember, partitions: list[int], want: int, **kw: Any) -> list[tuple[int, Acquired]]:
    """Fetch (long polls) until `want` records were acquired in total; (partition, range) pairs."""
    got: list[tuple[int, Acquired]] = []
    deadline = time.monotonic() + WAIT_S
    while sum(b - a + 1 for _p, (a, b, _c) in got) < want:
        assert time.monotonic() < deadline, f"only acquired {got}"
        resp = member.fetch(partitions, max_wait_ms=1000, **kw)
        for p in partitions:
            got += [(p, r) for r in acquired(resp, p)]
    return got


@dataclass
class ShareSetup:
    topic: str
    topic_id: bytes
    group: str
    admin: WireClient
    members: list[RawShareMember]

    def close(self) -> None:
        for m in self.members:
            m.close()
        self.admin.close()


def share_setup(broker: BrokerProcess, *, members: int, partitions: int = 1, reset: str = "earliest",
                batches: list[int] | None = None) -> ShareSetup:
    """A topic (optionally filled with log batches of the given sizes on partition 0), a group with
    `share.auto.offset.reset`, and raw members that joined and got the partitions assigned."""
    topic, group = unique("sp"), unique("sg")
    create_topic(broker.bootstrap, topic, partitions)
    set_group_config(broker.bootstrap, group, share_auto_offset_reset=reset)
    admin = WireClient.connect(broker.bootstrap)
    tid = topic_id_of(admin, topic)
    if batches:
        produce_batches(admin, topic, batches)
    raw = [RawShareMember(broker, group, tid) for _ in range(members)]
    for m in raw:
        join(m.client, group, m.member_id, topic, tid, set())
    return ShareSetup(topic, tid, group, admin, raw)


# ---- the KIP-932 worked example ------------------------------------------------------------------------


def test_kip932_worked_example_end_to_end(fresh_broker: BrokerProcess) -> None:
    """Offsets 100-120, consumers c1-c3: fetch, release, accept, a lock timeout and SPSO moving to 111 then 120,
    as tests/unit/test_share_partition.py::test_kip_worked_example_offsets_100_to_120 pins for the state machine;
    here through ShareFetch/ShareAcknowledge with each WriteShareGroupState read back from the state topic."""
    fresh_broker.overrides += ["group.share.min.record.lock.duration.ms=1000"]
    fresh_broker.start()
    bs = fresh_broker.bootstrap
    topic, group = unique("kip"), unique("kipg")
    create_topic(bs, topic, 1)
    long_lock, short_lock = "60000", "5000"
    set_group_config(bs, group, share_record_lock_duration_ms=long_lock)  # share.auto.offset.reset stays latest
    admin = WireClient.connect(bs)
    tid = topic_id_of(admin, topic)
    assert produce_batches(admin, topic, [100], prefix="filler") == [0]
    c1, c2, c3 = (RawShareMember(fresh_broker, group, tid) for _ in range(3))
    try:
        for c in (c1, c2, c3):
            join(c.client, group, c.member_id, topic, tid, {0})

        seen = 0

        def new_writes() -> list[StateRecord]:
            """State records written for the partition since the previous call."""
            nonlocal seen
            records = state_records(admin, group, tid, 0)
            fresh, seen = records[seen:], len(records)
            return fresh

        # Opening the sessions loads the share partition: SPSO = high watermark (latest) = 100.
        for c in (c1, c2, c3):
            assert acquired(c.fetch([0])) == []
        # InitializeShareGroupState (StartOffset -1), then the leader records the SPSO its reset policy chose.
        assert new_writes() == [StateRecord("snapshot", -1, []), StateRecord("update", 100, [])]
        [(_p, err, _se, start, _dcc)] = state_summary(admin, group, tid, [0])
        assert (err, start) == (ErrorCode.NONE, 100)

        assert produce_batches(admin, topic, [10], prefix="ex") == [100]
        resp = c1.fetch([0], max_wait_ms=5000)
        assert acquired(resp) == [(100, 109, 1)]
        assert delivered_offsets(resp) == set(range(100, 110))
        assert c1.ack_codes({0: [(100, 109, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 110, [])]

        # The log now holds batches 110-112, 113-118 and 119; soft limits round up to batch ends.
        assert produce_batches(admin, topic, [3, 6, 1], prefix="ex") == [110, 113, 119]
        set_group_config(bs, group, share_record_lock_duration_ms=short_lock)  # only c1's first lock is short
        assert acquired(c1.fetch([0], max_records=3)) == [(110, 112, 1)]
        set_group_config(bs, group, share_record_lock_duration_ms=long_lock)
        assert acquired(c2.fetch([0], max_records=6)) == [(113, 118, 1)]
        assert acquired(c3.fetch([0], max_records=1)) == [(119, 119, 1)]
        assert new_writes() == []  # acquisitions are not persisted

        assert c1.ack_codes({0: [(110, 110, [RELEASE])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 110, [(110, 110, AVAILABLE, 1)])]
        assert c3.ack_codes({0: [(119, 119, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 110, [(119, 119, ACKNOWLEDGED, 1)])]

        assert produce_batches(admin, topic, [1], prefix="ex") == [120]
        resp = c1.fetch([0], max_records=2)
        assert acquired(resp) == [(110, 110, 2), (120, 120, 1)]
        assert delivered_offsets(resp) == {110, 120}
        assert new_writes() == []

        # c1's lock on 111-112 runs out (110 and 120 were re-locked with the long duration): they become
        # AVAILABLE again and the expiry is persisted.
        deadline = time.monotonic() + WAIT_S
        while not (expired := new_writes()):
            assert time.monotonic() < deadline, "acquisition lock of 111-112 never expired"
            time.sleep(0.2)
        assert expired == [StateRecord("update", 110, [(111, 112, AVAILABLE, 1)])]

        assert c2.ack_codes({0: [(113, 118, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 110, [(113, 118, ACKNOWLEDGED, 1)])]
        # c1 no longer holds 111: acknowledging it fails and changes nothing.
        assert c1.ack_codes({0: [(111, 111, [ACCEPT])]}) == {0: ErrorCode.INVALID_RECORD_STATE}
        assert new_writes() == []

        assert acquired(c3.fetch([0], max_records=2)) == [(111, 112, 2)]
        assert c1.ack_codes({0: [(110, 110, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 111, [])]
        assert c3.ack_codes({0: [(111, 112, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert new_writes() == [StateRecord("update", 120, [])]
        [(_p, err, _se, start, _dcc)] = state_summary(admin, group, tid, [0])
        assert (err, start) == (ErrorCode.NONE, 120)
        # 120 is still c1's: nobody else gets it.
        assert acquired(c2.fetch([0])) == []
    finally:
        for c in (c1, c2, c3):
            c.close()
        admin.close()


# ---- bad input: session errors ----------------------------------------------------------------------


@pytest.mark.external
def test_share_session_errors_leave_state_untouched(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=1, batches=[10])
    [m] = s.members
    try:
        assert acquired(m.fetch([0], max_wait_ms=5000)) == [(0, 9, 1)]
        before = state_records(s.admin, s.group, s.topic_id, 0)
        summary = state_summary(s.admin, s.group, s.topic_id, [0])

        # Acknowledgements cannot ride on an opening (epoch 0) ShareFetch.
        resp = m.fetch([0], acks={0: [(0, 9, [ACCEPT])]}, epoch=0)
        assert resp.error_code == ErrorCode.INVALID_REQUEST
        # ShareAcknowledge can never open a session.
        assert m.acknowledge({0: [(0, 9, [ACCEPT])]}, epoch=0).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        # Wrong epochs for the existing session, in both RPCs.
        assert m.epoch == 1
        assert m.fetch([0], epoch=5).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        assert m.acknowledge({0: [(0, 9, [ACCEPT])]}, epoch=2).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        # A member with no session here: any non-zero epoch, closing included.
        stranger = new_member_id()
        assert m.fetch([0], epoch=1, member_id=stranger).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        assert m.fetch([0], epoch=-1, member_id=stranger).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        assert m.acknowledge({0: [(0, 9, [ACCEPT])]}, epoch=3,
                             member_id=stranger).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        # Member ids must be 1 to 36 characters.
        for bad_id in ("", "x" * 37):
            assert m.fetch([0], epoch=0, member_id=bad_id).error_code == ErrorCode.INVALID_REQUEST
            assert m.acknowledge({0: [(0, 9, [ACCEPT])]}, epoch=1,
                                 member_id=bad_id).error_code == ErrorCode.INVALID_REQUEST

        assert state_records(s.admin, s.group, s.topic_id, 0) == before
        assert state_summary(s.admin, s.group, s.topic_id, [0]) == summary
        # The session survived every refusal at its expected epoch, and the records are still m's.
        assert m.ack_codes({0: [(0, 9, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert state_records(s.admin, s.group, s.topic_id, 0)[len(before):] == [StateRecord("update", 10, [])]
    finally:
        s.close()


@pytest.mark.external
def test_bad_acknowledgements_get_partition_errors_and_change_nothing(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[10, 10])
    a, b = s.members
    try:
        assert acquired(a.fetch([0], max_records=10, max_wait_ms=5000)) == [(0, 9, 1)]
        assert acquired(b.fetch([0], max_records=5, max_wait_ms=5000)) == [(10, 19, 1)]
        assert a.ack_codes({0: [(5, 9, [RELEASE])]}) == {0: ErrorCode.NONE}  # 5-9 AVAILABLE, nobody's
        before = state_records(s.admin, s.group, s.topic_id, 0)
        assert before[-1] == StateRecord("update", 0, [(5, 9, AVAILABLE, 1)])

        cases: list[tuple[list[Ack], int]] = [
            ([(3, 4, [ACCEPT]), (0, 1, [ACCEPT])], ErrorCode.INVALID_REQUEST),  # out of order
            ([(0, 3, [ACCEPT]), (2, 4, [ACCEPT])], ErrorCode.INVALID_REQUEST),  # overlapping
            ([(4, 2, [ACCEPT])], ErrorCode.INVALID_REQUEST),  # first > last
            ([(0, 4, [])], ErrorCode.INVALID_REQUEST),  # no type
            ([(0, 4, [ACCEPT, ACCEPT])], ErrorCode.INVALID_REQUEST),  # types neither 1 nor one per offset
            ([(0, 4, [7])], ErrorCode.INVALID_REQUEST),  # unknown type
            ([(0, 4, [4])], ErrorCode.INVALID_REQUEST),  # RENEW without IsRenewAck (v1 has no RENEW)
            ([(5, 9, [ACCEPT])], ErrorCode.INVALID_RECORD_STATE),  # AVAILABLE, not acquired
            ([(0, 2, [ACCEPT]), (5, 6, [REJECT])], ErrorCode.INVALID_RECORD_STATE),  # atomic: 0-2 rolls back
            ([(10, 12, [ACCEPT])], ErrorCode.INVALID_RECORD_STATE),  # b's records
            ([(18, 25, [ACCEPT])], ErrorCode.INVALID_REQUEST),  # past the cached end (19)
            ([(30, 35, [ACCEPT])], ErrorCode.INVALID_REQUEST),  # wholly past the cached end
        ]
        for batches, code in cases:
            assert a.ack_codes({0: batches}) == {0: code}, batches
            resp = a.fetch([], max_records=0, acks={0: batches})  # the same, piggybacked on ShareFetch
            assert ack_error(resp) == code, batches
            assert acquired(resp) == []

        assert state_records(s.admin, s.group, s.topic_id, 0) == before
        # Nothing moved: a still holds 0-4, b still holds 10-19 and can accept them; 5-9 are fetchable.
        assert a.ack_codes({0: [(0, 4, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert b.ack_codes({0: [(10, 19, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert acquired(a.fetch([0])) == [(5, 9, 2)]
        assert state_records(s.admin, s.group, s.topic_id, 0)[len(before):] == [
            StateRecord("update", 5, []),
            StateRecord("update", 5, [(10, 19, ACKNOWLEDGED, 1)]),
        ]
    finally:
        s.close()


@pytest.mark.external
def test_acks_for_records_of_another_member_are_refused(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[4, 4])
    owner, thief = s.members
    try:
        assert acquired(owner.fetch([0], max_records=4, max_wait_ms=5000)) == [(0, 3, 1)]
        assert acquired(thief.fetch([0], max_wait_ms=5000)) == [(4, 7, 1)]
        before = state_records(s.admin, s.group, s.topic_id, 0)
        for t in (ACCEPT, RELEASE, REJECT):
            assert thief.ack_codes({0: [(0, 3, [t])]}) == {0: ErrorCode.INVALID_RECORD_STATE}
        # Mixed: its own records plus one of the owner's; nothing of it applies.
        assert thief.ack_codes({0: [(3, 7, [ACCEPT])]}) == {0: ErrorCode.INVALID_RECORD_STATE}
        assert state_records(s.admin, s.group, s.topic_id, 0) == before
        assert owner.ack_codes({0: [(0, 3, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert thief.ack_codes({0: [(4, 7, [ACCEPT])]}) == {0: ErrorCode.NONE}
        [(_p, err, _se, start, _dcc)] = state_summary(s.admin, s.group, s.topic_id, [0])
        assert (err, start) == (ErrorCode.NONE, 8)
    finally:
        s.close()


# ---- release paths --------------------------------------------------------------------------------------


@pytest.mark.external
def test_final_epoch_processes_acks_closes_session_and_releases(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[10])
    a, b = s.members
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 9, 1)]
        # Epoch -1: the piggybacked accept of 0-3 is applied, nothing is fetched, the session goes away
        # and a's other records are released.
        resp = a.fetch([0], acks={0: [(0, 3, [ACCEPT])]}, epoch=-1)
        assert ack_error(resp) == ErrorCode.NONE
        assert acquired(resp) == []
        assert a.fetch([0], epoch=a.epoch).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        got = fetch_until(b, [0], 6)
        assert got == [(0, (4, 9, 2))]
        assert b.ack_codes({0: [(4, 9, [ACCEPT])]}) == {0: ErrorCode.NONE}
        [(_p, err, _se, start, _dcc)] = state_summary(s.admin, s.group, s.topic_id, [0])
        assert (err, start) == (ErrorCode.NONE, 10)
        # A member can open a fresh session after closing.
        reopened = a.fetch([0], epoch=0)
        assert reopened.error_code == ErrorCode.NONE and acquired(reopened) == []
    finally:
        s.close()


@pytest.mark.external
def test_share_acknowledge_final_epoch_releases(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[6])
    a, b = s.members
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 5, 1)]
        resp = a.acknowledge({0: [(0, 1, [REJECT])]}, epoch=-1)
        assert resp.error_code == ErrorCode.NONE
        assert [p.error_code for t in resp.responses for p in t.partitions] == [ErrorCode.NONE]
        assert a.acknowledge({0: [(2, 2, [ACCEPT])]}, epoch=1).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        assert fetch_until(b, [0], 4) == [(0, (2, 5, 2))]
    finally:
        s.close()


@pytest.mark.external
def test_connection_drop_releases_the_members_records(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[8])
    a, b = s.members
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 7, 1)]
        assert acquired(b.fetch([0])) == []
        a.close()  # no close epoch, no acknowledgement: the socket just goes away
        got = fetch_until(b, [0], 8)
        assert got == [(0, (0, 7, 2))]
        assert b.ack_codes({0: [(0, 7, [ACCEPT])]}) == {0: ErrorCode.NONE}
    finally:
        s.close()


@pytest.mark.external
def test_release_on_disconnect_at_delivery_limit_archives(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[5])
    set_group_config(broker.bootstrap, s.group, share_delivery_count_limit="2")
    a, b = s.members
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 4, 1)]
        assert a.ack_codes({0: [(0, 4, [RELEASE])]}) == {0: ErrorCode.NONE}
        assert acquired(b.fetch([0])) == [(0, 4, 2)]
        b.close()  # the second delivery is the last: released at the limit, the records are archived
        deadline = time.monotonic() + WAIT_S
        while state_summary(s.admin, s.group, s.topic_id, [0])[0][3] != 5:
            assert time.monotonic() < deadline, "SPSO never moved past the archived records"
            time.sleep(0.1)
        assert state_records(s.admin, s.group, s.topic_id, 0)[-2:] == [
            StateRecord("update", 0, [(0, 4, AVAILABLE, 1)]), StateRecord("update", 5, [])]
        assert acquired(a.fetch([0], max_wait_ms=200)) == []
        # Acknowledgements wholly below SPSO are ignored, not refused.
        written = len(state_records(s.admin, s.group, s.topic_id, 0))
        assert a.ack_codes({0: [(0, 4, [ACCEPT])]}) == {0: ErrorCode.NONE}
        assert len(state_records(s.admin, s.group, s.topic_id, 0)) == written
    finally:
        s.close()


@pytest.mark.external
def test_old_connection_close_leaves_a_reopened_session_alone(broker: BrokerProcess) -> None:
    s = share_setup(broker, members=2, batches=[5])
    a, b = s.members
    moved = RawShareMember(broker, s.group, s.topic_id, member_id=a.member_id)
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 4, 1)]
        # The same member opens a new session on another connection (epoch 0 replaces, releases nothing),
        # then the first connection goes away: the newer session and the member's records stay.
        assert acquired(moved.fetch([0])) == []
        a.close()
        assert acquired(b.fetch([0], max_wait_ms=500)) == []
        assert moved.ack_codes({0: [(0, 4, [ACCEPT])]}) == {0: ErrorCode.NONE}
        [(_p, err, _se, start, _dcc)] = state_summary(s.admin, s.group, s.topic_id, [0])
        assert (err, start) == (ErrorCode.NONE, 5)
    finally:
        moved.close()
        s.close()


def test_share_session_limit(fresh_broker: BrokerProcess) -> None:
    fresh_broker.overrides += ["group.share.max.share.sessions=2"]
    fresh_broker.start()
    s = share_setup(fresh_broker, members=3, batches=[3])
    a, b, c = s.members
    try:
        assert acquired(a.fetch([0], max_wait_ms=5000)) == [(0, 2, 1)]
        assert acquired(b.fetch([0])) == []
        resp = c.fetch([0], max_wait_ms=100)
        assert resp.error_code == ErrorCode.SHARE_SESSION_LIMIT_REACHED
        assert c.epoch == 0
        # Re-opening an existing session does not need a new slot.
        assert a.fetch([0], epoch=0).error_code == ErrorCode.NONE
        a.epoch = 1
        assert a.fetch([0], epoch=-1).error_code == ErrorCode.NONE  # frees a slot, releases 0-2
        resp = c.fetch([0], max_wait_ms=5000)
        assert resp.error_code == ErrorCode.NONE
        assert acquired(resp) == [(0, 2, 2)]
        assert a.fetch([0], epoch=0, max_wait_ms=100).error_code == ErrorCode.SHARE_SESSION_LIMIT_REACHED
    finally:
        s.close()
