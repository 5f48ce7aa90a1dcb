"""Adversarial but well-framed requests, each sent exactly as a fuzzer found it, on a raw socket.

For every one: the broker answers it with Kafka's error (never a dropped connection or a traceback),
answers the next request, leaves its state as it was, and starts again on the same data directory.
The restart checks run once at the end of the module, over everything the earlier tests sent.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import iter_batches
from shoal.protocol.records import RecordInput, encode_batch, write_varint, write_varlong
from shoal.protocol.uuids import ZERO_UUID

from .broker_process import BrokerProcess
from .conftest import FAST_HEARTBEAT
from .kafka_wire import WireClient

STATE_TOPIC = "__share_group_state"
GZIP = 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
LONG_NAME = "c" * 32767  # the longest string a classic (int16-length) field can carry
# Tests read state back through the broker, so a state change would show up in what follows.


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("bad-requests")
    # A small broker-wide partition budget makes the file-descriptor bound testable without 15,000 files.
    proc = BrokerProcess(base / "data", overrides=["max.partitions=160", *FAST_HEARTBEAT])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient.connect(broker.bootstrap, client_id="bad-requests") as c:
        yield c
    assert_answers(broker)


def assert_answers(broker: BrokerProcess) -> None:
    """The broker is alive, answers a new connection, and has logged no traceback."""
    assert broker.alive()
    with WireClient.connect(broker.bootstrap) as c:
        assert c.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
            client_software_name="t", client_software_version="1")).error_code == ErrorCode.NONE
    assert "Traceback" not in broker.log_text()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- request builders -----------------------------------------------------------------------------------


def create_topics(client: WireClient, version: int, name: str, partitions: int = 1,
                  configs: dict[str, str | None] | None = None) -> Any:
    req = messages.CreateTopicsRequest
    cfgs = [req.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()]  # type: ignore[attr-defined]
    topic = req.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,  # type: ignore[attr-defined]
                               assignments=[], configs=cfgs)
    [result] = client.request(ApiKey.CREATE_TOPICS, version, req(topics=[topic], timeout_ms=10_000,
                                                                 validate_only=False)).topics
    return result


def topic_partitions(client: WireClient, name: str) -> tuple[bytes, int] | None:
    md = messages.MetadataRequest
    req = md(topics=[md.MetadataRequestTopic(name=name, topic_id=ZERO_UUID)],  # type: ignore[attr-defined]
             allow_auto_topic_creation=False)
    [t] = client.request(ApiKey.METADATA, 12, req).topics
    if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return None
    assert t.error_code == ErrorCode.NONE
    return bytes(t.topic_id), len(t.partitions)


def produce(client: WireClient, topic: str, records: bytes, *, version: int = 9, acks: int = -1) -> Any:
    req = messages.ProduceRequest
    part = req.PartitionProduceData(index=0, records=records)  # type: ignore[attr-defined]
    data = req.TopicProduceData(name=topic, partition_data=[part])  # type: ignore[attr-defined]
    resp = client.request(ApiKey.PRODUCE, version, req(transactional_id=None, acks=acks, timeout_ms=10_000,
                                                       topic_data=[data]))
    [pr] = [p for t in resp.responses for p in t.partition_responses]
    return pr


def end_offset(client: WireClient, topic: str, partition: int = 0) -> int:
    lo = messages.ListOffsetsRequest
    t = lo.ListOffsetsTopic(name=topic, partitions=[  # type: ignore[attr-defined]
        lo.ListOffsetsPartition(partition_index=partition, timestamp=-1)])  # type: ignore[attr-defined]
    [topic_resp] = client.request(ApiKey.LIST_OFFSETS, 7, lo(replica_id=-1, isolation_level=0, topics=[t])).topics
    [p] = topic_resp.partitions
    assert p.error_code == ErrorCode.NONE
    return int(p.offset)


def raw_batch(records: bytes, count: int, *, base_timestamp: int = 0, attributes: int = 0) -> bytes:
    """A v2 batch around already-encoded records, with a correct CRC (so only the contents are wrong)."""
    tail = struct.pack(">hiqqqhii", attributes, count - 1, base_timestamp, base_timestamp, -1, -1, -1, count) + records
    return struct.pack(">qiibI", 0, 9 + len(tail), -1, 2, crc32c.crc32c(tail)) + tail


def raw_record(*, header_count: int = 0, timestamp_delta: int = 0, value: bytes = b"x", extra: bytes = b"") -> bytes:
    body = bytearray(b"\x00")  # attributes
    write_varlong(body, timestamp_delta)
    write_varint(body, 0)  # offset delta
    write_varint(body, -1)  # null key
    write_varint(body, len(value))
    body += value
    write_varint(body, header_count)
    body += extra
    out = bytearray()
    write_varint(out, len(body))
    return bytes(out + body)


PHANTOM_HEADERS = raw_batch(raw_record(header_count=100_000), 1, base_timestamp=int(time.time() * 1000))


# ---- 1. bad batches -------------------------------------------------------------------------------------


def test_produce_to_internal_topic_is_refused(client: WireClient) -> None:
    before = end_offset(client, STATE_TOPIC)
    pr = produce(client, STATE_TOPIC, PHANTOM_HEADERS, acks=1)
    assert pr.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    # Even a perfectly good batch: clients do not write coordinator topics.
    assert produce(client, STATE_TOPIC, encode_batch([RecordInput(b"k", b"v")])).error_code == \
        ErrorCode.INVALID_TOPIC_EXCEPTION
    assert end_offset(client, STATE_TOPIC) == before


@pytest.mark.parametrize(
    ("batch", "code"),
    [
        (PHANTOM_HEADERS, ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(header_count=-2), 1), ErrorCode.INVALID_RECORD),
        # The record's length claims more bytes than the batch holds.
        (raw_batch(b"\x7e" + raw_record()[1:], 1), ErrorCode.INVALID_RECORD),
        # Two records declared, one present.
        (raw_batch(raw_record(), 2), ErrorCode.INVALID_RECORD),
        # Flagged gzip, but the payload is not a gzip stream.
        (raw_batch(b"not gzip at all", 1, attributes=GZIP), ErrorCode.CORRUPT_MESSAGE),
    ],
    ids=["100000-phantom-headers", "negative-header-count", "record-length-overrun", "missing-record",
         "undecompressible"],
)
def test_log_validator_refuses_bad_records(client: WireClient, batch: bytes, code: int) -> None:
    topic = unique("bad-records")
    create_topics(client, 7, topic)
    pr = produce(client, topic, batch, acks=1)
    assert (pr.error_code, pr.base_offset) == (code, -1)
    assert end_offset(client, topic) == 0
    good = produce(client, topic, encode_batch([RecordInput(b"k", b"v")]))
    assert (good.error_code, good.base_offset) == (ErrorCode.NONE, 0)


def test_timestamp_overflow_is_refused_and_list_offsets_answers(client: WireClient) -> None:
    topic = unique("ts-overflow")
    create_topics(client, 7, topic)
    pr = produce(client, topic, raw_batch(raw_record(timestamp_delta=1), 1, base_timestamp=INT64_MAX), acks=1)
    assert pr.error_code == ErrorCode.INVALID_TIMESTAMP
    assert end_offset(client, topic) == 0
    lo = messages.ListOffsetsRequest
    t = lo.ListOffsetsTopic(name=topic, partitions=[  # type: ignore[attr-defined]
        lo.ListOffsetsPartition(partition_index=0, timestamp=0)])  # type: ignore[attr-defined]
    [resp] = client.request(ApiKey.LIST_OFFSETS, 4, lo(replica_id=-1, isolation_level=0, topics=[t])).topics
    assert [(p.error_code, p.offset) for p in resp.partitions] == [(ErrorCode.NONE, -1)]


# ---- 2. partition counts ----------------------------------------------------------------------------------


def test_huge_partition_counts_are_refused(client: WireClient) -> None:
    name = unique("huge")
    result = create_topics(client, 7, name, partitions=INT32_MAX)
    assert result.error_code == ErrorCode.POLICY_VIOLATION and "max.partitions.per.request" in result.error_message
    assert topic_partitions(client, name) is None

    create_topics(client, 7, name, partitions=1)
    cp = messages.CreatePartitionsRequest
    req = cp(topics=[cp.CreatePartitionsTopic(name=name, count=INT32_MAX, assignments=None)],  # type: ignore[attr-defined]
             timeout_ms=10_000, validate_only=False)
    [res] = client.request(ApiKey.CREATE_PARTITIONS, 3, req).results
    assert res.error_code == ErrorCode.POLICY_VIOLATION
    found = topic_partitions(client, name)
    assert found is not None and found[1] == 1


def test_partition_budget_bounds_open_files(client: WireClient) -> None:
    """Within the per-request bound but beyond the broker's budget (max.partitions=160 here)."""
    name = unique("budget")
    result = create_topics(client, 7, name, partitions=200)
    assert result.error_code == ErrorCode.POLICY_VIOLATION and "max.partitions" in result.error_message
    assert topic_partitions(client, name) is None


# ---- 3 and 4. long strings ----------------------------------------------------------------------------------


def test_long_config_name_in_incremental_alter_configs_v0(client: WireClient) -> None:
    topic = unique("long-config")
    create_topics(client, 7, topic)
    iac = messages.IncrementalAlterConfigsRequest
    res = iac.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[  # type: ignore[attr-defined]
        iac.AlterableConfig(name=LONG_NAME, config_operation=0, value="1")])  # type: ignore[attr-defined]
    [r] = client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, iac(resources=[res], validate_only=False)).responses
    assert r.error_code == ErrorCode.INVALID_CONFIG and len(r.error_message) < 1000
    # A long value for a real key, and a long group config name.
    res.configs = [iac.AlterableConfig(name="retention.ms", config_operation=0, value="9" * 32767)]  # type: ignore[attr-defined]
    group = iac.AlterConfigsResource(resource_type=32, resource_name="g", configs=[  # type: ignore[attr-defined]
        iac.AlterableConfig(name=LONG_NAME, config_operation=0, value=LONG_NAME)])  # type: ignore[attr-defined]
    resp = client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, iac(resources=[res, group], validate_only=False))
    assert [x.error_code for x in resp.responses] == [ErrorCode.INVALID_CONFIG] * 2


def test_long_config_name_in_create_topics_v2(client: WireClient) -> None:
    name = unique("long-config")
    result = create_topics(client, 2, name, configs={LONG_NAME: "1"})
    assert result.error_code == ErrorCode.INVALID_CONFIG and len(result.error_message) < 1000
    assert topic_partitions(client, name) is None


def test_describe_configs_v1_broker_logger_with_long_name(client: WireClient) -> None:
    dc = messages.DescribeConfigsRequest
    req = dc(resources=[dc.DescribeConfigsResource(resource_type=4, resource_name=LONG_NAME,  # type: ignore[attr-defined]
                                                   configuration_keys=None)], include_synonyms=False)
    [r] = client.request(ApiKey.DESCRIBE_CONFIGS, 1, req).results
    assert r.error_code == ErrorCode.INVALID_REQUEST and len(r.error_message) < 1000


def test_illegal_topic_names(client: WireClient) -> None:
    for name, code in [("t" * 250, ErrorCode.INVALID_TOPIC_EXCEPTION), ("bad name!" * 3000, ErrorCode.INVALID_TOPIC_EXCEPTION),
                       ("..", ErrorCode.INVALID_TOPIC_EXCEPTION)]:
        result = create_topics(client, 7, name)
        assert result.error_code == code and len(result.error_message) < 1000
    assert create_topics(client, 7, "t" * 249).error_code == ErrorCode.NONE


def heartbeat(client: WireClient, group: str, member: str, epoch: int, topics: list[str] | None) -> Any:
    hb = messages.ShareGroupHeartbeatRequest
    return client.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, hb(group_id=group, member_id=member, member_epoch=epoch,
                                                              rack_id=None, subscribed_topic_names=topics))


def test_share_group_heartbeat_with_40000_byte_group_id(client: WireClient) -> None:
    resp = heartbeat(client, "g" * 40_000, uuid.uuid4().hex[:22], 0, ["t"])
    assert resp.error_code == ErrorCode.INVALID_REQUEST
    resp = heartbeat(client, unique("g"), "m" * 40_000, 0, ["t"])
    assert resp.error_code == ErrorCode.INVALID_REQUEST
    lg = messages.ListGroupsRequest
    groups = client.request(ApiKey.LIST_GROUPS, 5, lg(states_filter=[], types_filter=[])).groups
    assert all(len(g.group_id) < 1000 for g in groups)


def test_group_heartbeats_with_a_null_subscribed_topic_name(client: WireClient) -> None:
    """No client sends a null name (the schema's strings are not nullable), so the raw wire does: the
    heartbeat is refused with INVALID_REQUEST, and nothing is joined or logged as a crash."""
    topic = unique("hb-null")
    create_topics(client, 7, topic)
    used: list[str] = []
    for epoch in (0, 1):
        used.append(unique("g"))
        resp = heartbeat(client, used[-1], uuid.uuid4().hex[:22], epoch, [topic, None])  # type: ignore[list-item]
        assert resp.error_code == ErrorCode.INVALID_REQUEST, resp
        assert resp.error_message
    cg = messages.ConsumerGroupHeartbeatRequest
    for epoch in (0, 1):
        used.append(unique("cg"))
        req = cg(group_id=used[-1], member_id=uuid.uuid4().hex[:22], member_epoch=epoch, instance_id=None,
                 rack_id=None, rebalance_timeout_ms=30_000, subscribed_topic_names=[None, topic],
                 subscribed_topic_regex=None, server_assignor=None, topic_partitions=[])
        resp = client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, req)
        assert resp.error_code == ErrorCode.INVALID_REQUEST, resp
        assert resp.error_message
    # No group was created by the joins.
    lg = messages.ListGroupsRequest
    groups = client.request(ApiKey.LIST_GROUPS, 5, lg(states_filter=[], types_filter=[])).groups
    assert not {g.group_id for g in groups} & set(used)


# ---- 5. topic config values -----------------------------------------------------------------------------------


def test_segment_bytes_minus_one(client: WireClient) -> None:
    name = unique("segment")
    result = create_topics(client, 7, name, configs={"segment.bytes": "-1"})
    assert result.error_code == ErrorCode.INVALID_CONFIG
    assert "segment.bytes" in result.error_message
    assert topic_partitions(client, name) is None
    create_topics(client, 7, name)
    iac = messages.IncrementalAlterConfigsRequest
    for value in ("-1", "99999999999", "x"):
        res = iac.AlterConfigsResource(resource_type=2, resource_name=name, configs=[  # type: ignore[attr-defined]
            iac.AlterableConfig(name="segment.bytes", config_operation=0, value=value)])  # type: ignore[attr-defined]
        [r] = client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, iac(resources=[res], validate_only=False)).responses
        assert r.error_code == ErrorCode.INVALID_CONFIG, value
    assert produce(client, name, encode_batch([RecordInput(b"k", b"v")])).error_code == ErrorCode.NONE


# ---- 6. share state ------------------------------------------------------------------------------------------


def test_write_share_state_with_inverted_batch(client: WireClient) -> None:
    topic = unique("share-state")
    create_topics(client, 7, topic)
    topic_id, _ = topic_partitions(client, topic)  # type: ignore[misc]
    group = unique("state-group")
    init = messages.InitializeShareGroupStateRequest
    resp = client.request(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, init(group_id=group, topics=[
        init.InitializeStateData(topic_id=topic_id, partitions=[  # type: ignore[attr-defined]
            init.PartitionData(partition=0, state_epoch=0, start_offset=0)])]))  # type: ignore[attr-defined]
    assert resp.results[0].partitions[0].error_code == ErrorCode.NONE
    before = read_state(client, group, topic_id)

    write = messages.WriteShareGroupStateRequest
    batches = [write.StateBatch(first_offset=0, last_offset=9, delivery_state=0, delivery_count=1),  # type: ignore[attr-defined]
               write.StateBatch(first_offset=5, last_offset=3, delivery_state=2, delivery_count=1)]  # type: ignore[attr-defined]
    resp = client.request(ApiKey.WRITE_SHARE_GROUP_STATE, 0, write(group_id=group, topics=[
        write.WriteStateData(topic_id=topic_id, partitions=[write.PartitionData(  # type: ignore[attr-defined]
            partition=0, state_epoch=0, leader_epoch=0, start_offset=0, state_batches=batches)])]))  # type: ignore[attr-defined]
    [p] = resp.results[0].partitions
    assert p.error_code == ErrorCode.INVALID_REQUEST and p.error_message
    assert read_state(client, group, topic_id) == before


def read_state(client: WireClient, group: str, topic_id: bytes) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    read = messages.ReadShareGroupStateRequest
    resp = client.request(ApiKey.READ_SHARE_GROUP_STATE, 0, read(group_id=group, topics=[
        read.ReadStateData(topic_id=topic_id, partitions=[read.PartitionData(partition=0, leader_epoch=0)])]))  # type: ignore[attr-defined]
    [p] = resp.results[0].partitions
    assert p.error_code == ErrorCode.NONE
    return p.state_epoch, p.start_offset, [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                                           for b in p.state_batches]


# ---- 7. metadata by topic id on versions that cannot answer it ---------------------------------------------


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_unknown_topic_id_with_null_name(client: WireClient, version: int) -> None:
    md = messages.MetadataRequest
    unknown = uuid.uuid4().bytes
    req = md(topics=[md.MetadataRequestTopic(name=None, topic_id=unknown)],  # type: ignore[attr-defined]
             allow_auto_topic_creation=False)
    resp = client.request(ApiKey.METADATA, version, req)  # decodes: no null name in a v10/v11 response
    assert [(t.error_code, t.name, bytes(t.topic_id)) for t in resp.topics] == [(ErrorCode.INVALID_REQUEST, "", unknown)]
    # v12 can look topic ids up, and its response may carry a null name.
    [t] = client.request(ApiKey.METADATA, 12, req).topics
    assert (t.error_code, t.name) == (ErrorCode.UNKNOWN_TOPIC_ID, None)


# ---- 8. share groups of deleted topics (and an idle broker stays quiet) ------------------------------------


def test_delete_group_after_its_topic_was_deleted(broker: BrokerProcess, client: WireClient) -> None:
    topic = unique("deleted-under-group")
    create_topics(client, 7, topic, partitions=3)
    group = unique("orphaned")
    member = uuid.uuid4().hex[:22]
    joined = heartbeat(client, group, member, 0, [topic])
    assert joined.error_code == ErrorCode.NONE
    # Heartbeat until the member holds the partitions (their state is initialised by then).
    deadline = time.monotonic() + 30
    epoch = joined.member_epoch
    while time.monotonic() < deadline:
        resp = heartbeat(client, group, member, epoch, None)
        epoch = resp.member_epoch
        if resp.assignment is not None and resp.assignment.topic_partitions:
            break
        time.sleep(0.2)
    else:
        pytest.fail("no assignment")
    dt = messages.DeleteTopicsRequest
    [r] = client.request(ApiKey.DELETE_TOPICS, 6, dt(topics=[dt.DeleteTopicState(name=topic, topic_id=ZERO_UUID)],  # type: ignore[attr-defined]
                                                    timeout_ms=10_000)).responses
    assert r.error_code == ErrorCode.NONE
    assert heartbeat(client, group, member, -1, None).error_code == ErrorCode.NONE
    dg = messages.DeleteGroupsRequest
    [res] = client.request(ApiKey.DELETE_GROUPS, 2, dg(groups_names=[group])).results
    assert res.error_code == ErrorCode.NONE
    assert "share partition state deletion failed" not in broker.log_text()


def test_idle_broker_logs_nothing(broker: BrokerProcess) -> None:
    """After the deletions above, a few maintenance rounds (one a second) pass without a line."""
    size = len(broker.log_text())
    time.sleep(3.5)
    assert broker.log_text()[size:] == ""


# ---- every item: the broker starts again on the same data ---------------------------------------------------


def test_restart_on_the_same_data(broker: BrokerProcess) -> None:
    with WireClient.connect(broker.bootstrap) as c:
        lg = messages.ListGroupsRequest
        groups_before = sorted(g.group_id for g in c.request(ApiKey.LIST_GROUPS, 5, lg(states_filter=[], types_filter=[])).groups)
        state_end = end_offset(c, STATE_TOPIC)
    assert broker.stop() == 0
    broker.start()
    assert_answers(broker)
    with WireClient.connect(broker.bootstrap) as c:
        groups_after = sorted(g.group_id for g in c.request(ApiKey.LIST_GROUPS, 5, lg(states_filter=[], types_filter=[])).groups)
        assert groups_after == groups_before
        assert end_offset(c, STATE_TOPIC) == state_end


def test_start_up_skips_an_unreadable_internal_batch(broker: BrokerProcess) -> None:
    """Data written before produce validated records (or damaged on disk behind a valid CRC): the broker
    still starts, and says loudly what it skipped."""
    assert broker.stop() == 0
    partition_dir = Path(broker.data_dir) / f"{STATE_TOPIC}-0"
    segment = sorted(partition_dir.glob("*.log"))[-1]
    data = bytearray(segment.read_bytes())
    next_offset = 0
    for _pos, header in iter_batches(data):
        next_offset = header.last_offset + 1
    bad = bytearray(PHANTOM_HEADERS)
    struct.pack_into(">q", bad, 0, next_offset)  # the base offset is outside the CRC
    with open(segment, "ab") as fh:
        fh.write(bad)
    broker.start()
    assert "skipping unreadable batch in internal topic" in broker.log_text()
    with WireClient.connect(broker.bootstrap) as c:
        assert end_offset(c, STATE_TOPIC) >= next_offset + 1  # the skipped batch keeps its offset
    assert broker.alive()
