"""Hostile and broken clients on raw sockets against the real broker process.

Each bad request must get either a defined error answer or a closed connection (never a hang), and
afterwards the broker must still be alive and serving new connections.
"""

from __future__ import annotations

import random
import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest
from kafka import KafkaProducer

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch

from .broker_process import BrokerProcess

SOCKET_TIMEOUT = 15.0
RECORDS_COUNT_POS = 57  # int32 records count, the last field of the 61-byte v2 batch header
CRC_POS = 17
ATTRIBUTES_POS = 21

_correlation = iter(range(1, 2**31))


def next_correlation_id() -> int:
    return next(_correlation)


# ---- raw wire helpers ------------------------------------------------------------------------------


def connect(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=SOCKET_TIMEOUT)
    sock.settimeout(SOCKET_TIMEOUT)
    return sock


def frame(body: Any, api_key: int, version: int, correlation_id: int) -> bytes:
    payload = messages.encode_request(body, api_key, version, correlation_id, "shoal-bad-input-test")
    return struct.pack(">i", len(payload)) + bytes(payload)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None if the peer closed first."""
    out = bytearray()
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def recv_frame(sock: socket.socket) -> bytes | None:
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return recv_exact(sock, size)


def call(sock: socket.socket, body: Any, api_key: int, version: int) -> Any:
    correlation_id = next_correlation_id()
    sock.sendall(frame(body, api_key, version, correlation_id))
    data = recv_frame(sock)
    assert data is not None, "connection closed instead of answering"
    got_id, response = messages.decode_response(data, api_key, version)
    assert got_id == correlation_id
    return response


def assert_closed_by_broker(sock: socket.socket) -> None:
    """The broker closes the connection: the next read sees EOF (or a reset), with no response first."""
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        data = b""
    assert data == b"", f"expected the connection to be closed, got {data[:40]!r}"


def api_versions_request() -> Any:
    return messages.ApiVersionsRequest(client_software_name="shoal-test", client_software_version="1.0")


def log_count(broker: BrokerProcess, text: str) -> int:
    return broker.log_text().count(text)


def assert_healthy(broker: BrokerProcess) -> None:
    """The process is alive and a brand-new connection gets normal ApiVersions and Metadata answers."""
    assert broker.alive()
    with connect(broker) as sock:
        versions = call(sock, api_versions_request(), ApiKey.API_VERSIONS, 3)
        assert versions.error_code == ErrorCode.NONE
        assert any(k.api_key == ApiKey.PRODUCE for k in versions.api_keys)
        md = call(sock, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False), ApiKey.METADATA, 12)
        assert [b.port for b in md.brokers] == [broker.port]


def create_topic(sock: socket.socket, name: str, partitions: int = 1) -> None:
    req_cls = messages.CreateTopicsRequest
    topic = req_cls.CreatableTopic(  # type: ignore[attr-defined]
        name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
    )
    resp = call(sock, req_cls(topics=[topic], timeout_ms=10_000, validate_only=False), ApiKey.CREATE_TOPICS, 7)
    assert [t.error_code for t in resp.topics] == [ErrorCode.NONE]


def produce_request(topic: str, records: bytes, acks: int = -1) -> Any:
    req = messages.ProduceRequest
    partition = req.PartitionProduceData(index=0, records=records)  # type: ignore[attr-defined]
    data = req.TopicProduceData(name=topic, partition_data=[partition])  # type: ignore[attr-defined]
    return req(transactional_id=None, acks=acks, timeout_ms=10_000, topic_data=[data])


def sample_batch(n: int = 5) -> bytearray:
    return bytearray(
        encode_batch([RecordInput(key=b"k%d" % i, value=b"value-%d" % i, headers=[("h", b"x")]) for i in range(n)])
    )


def produce_errors(sock: socket.socket, topic: str, records: bytes) -> list[tuple[int, int]]:
    resp = call(sock, produce_request(topic, bytes(records)), ApiKey.PRODUCE, 9)
    return [(p.error_code, p.base_offset) for t in resp.responses for p in t.partition_responses]


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    name = f"bad-input-{uuid.uuid4().hex[:8]}"
    with connect(broker) as sock:
        create_topic(sock, name)
    return name


@pytest.fixture
def healthy_after(broker: BrokerProcess) -> Iterator[BrokerProcess]:
    yield broker
    assert_healthy(broker)


# ---- framing ---------------------------------------------------------------------------------------


def test_truncated_frame_then_close(healthy_after: BrokerProcess) -> None:
    payload = frame(api_versions_request(), ApiKey.API_VERSIONS, 3, next_correlation_id())
    with connect(healthy_after) as sock:
        sock.sendall(payload[: len(payload) // 2])


def test_disconnect_mid_request(healthy_after: BrokerProcess, topic: str) -> None:
    payload = frame(produce_request(topic, bytes(sample_batch(50))), ApiKey.PRODUCE, 9, next_correlation_id())
    with connect(healthy_after) as sock:
        # A whole request first so the connection is known good, then half of the next one.
        assert call(sock, api_versions_request(), ApiKey.API_VERSIONS, 3).error_code == ErrorCode.NONE
        sock.sendall(payload[: len(payload) // 2])
        sock.shutdown(socket.SHUT_WR)
        # Half a frame is not a request: nothing comes back, and the broker ends the connection.
        assert recv_frame(sock) is None


@pytest.mark.parametrize("size", [0x7FFFFFFF, -1, -(2**31)], ids=["2GiB", "minus-1", "int32-min"])
def test_bad_length_prefix_closes_connection(healthy_after: BrokerProcess, size: int) -> None:
    warnings_before = log_count(healthy_after, "request frame size rejected")
    with connect(healthy_after) as sock:
        sock.sendall(struct.pack(">i", size) + b"\x00" * 16)
        assert_closed_by_broker(sock)
    assert log_count(healthy_after, "request frame size rejected") > warnings_before


def test_unknown_api_key_closes_connection(healthy_after: BrokerProcess) -> None:
    warnings_before = log_count(healthy_after, "unknown api key")
    header = struct.pack(">hhi", 999, 0, next_correlation_id()) + struct.pack(">h", 4) + b"test"
    with connect(healthy_after) as sock:
        sock.sendall(struct.pack(">i", len(header)) + header)
        assert_closed_by_broker(sock)
    assert log_count(healthy_after, "unknown api key") > warnings_before


def test_unsupported_produce_version_closes_connection(healthy_after: BrokerProcess) -> None:
    warnings_before = log_count(healthy_after, "unsupported api or version")
    # A Produce header claiming v99, followed by a body that is irrelevant once the version is refused.
    header = struct.pack(">hhi", ApiKey.PRODUCE, 99, next_correlation_id()) + struct.pack(">h", 4) + b"test"
    body = b"\x00" * 32
    with connect(healthy_after) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        assert_closed_by_broker(sock)
    assert log_count(healthy_after, "unsupported api or version") > warnings_before


def test_api_versions_from_the_future_gets_v0_answer(healthy_after: BrokerProcess) -> None:
    correlation_id = next_correlation_id()
    # KIP-511: a v99 request's body is unreadable, only its header counts.
    header = struct.pack(">hhi", ApiKey.API_VERSIONS, 99, correlation_id) + struct.pack(">h", 4) + b"test"
    body = b"\x00\x05hello\x00"
    with connect(healthy_after) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        data = recv_frame(sock)
        assert data is not None
        got_id, resp = messages.decode_response(data, ApiKey.API_VERSIONS, 0)
        assert got_id == correlation_id
        assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION == 35
        ranges = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert ranges[ApiKey.API_VERSIONS][1] < 99
        assert ApiKey.PRODUCE in ranges and ApiKey.FETCH in ranges and ApiKey.METADATA in ranges
        # The client retries with a version from the list, on the same connection.
        retry = call(sock, api_versions_request(), ApiKey.API_VERSIONS, ranges[ApiKey.API_VERSIONS][1])
        assert retry.error_code == ErrorCode.NONE


def test_random_garbage(healthy_after: BrokerProcess) -> None:
    rng = random.Random(20240611)
    with connect(healthy_after) as sock:
        sock.sendall(b"\xde\xad\xbe\xef" + rng.randbytes(4096))  # the "length" is negative
        assert_closed_by_broker(sock)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(ApiKey.PRODUCE, 9), (ApiKey.FETCH, 12), (ApiKey.METADATA, 12), (ApiKey.CREATE_TOPICS, 7),
     (ApiKey.LIST_OFFSETS, 7), (ApiKey.DELETE_RECORDS, 2), (ApiKey.DESCRIBE_CONFIGS, 4)],
)
def test_well_framed_garbage_bodies(broker: BrokerProcess, api_key: int, version: int) -> None:
    """A correct header followed by random bytes: an error answer or a close, never a crash or a hang."""
    rng = random.Random(api_key * 1000 + version)
    for _ in range(20):
        correlation_id = next_correlation_id()
        header = struct.pack(">hhi", api_key, version, correlation_id) + struct.pack(">h", 4) + b"fuzz"
        if messages.REQUESTS[api_key].is_flexible(version):
            header += b"\x00"  # empty tagged fields
        body = rng.randbytes(rng.randrange(1, 200))
        with connect(broker) as sock:
            sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
            sock.shutdown(socket.SHUT_WR)
            data = recv_frame(sock)
            if data is not None:
                assert int.from_bytes(data[:4], "big", signed=True) == correlation_id
                assert recv_frame(sock) is None
    assert_healthy(broker)
    # Undecodable input must be refused while decoding, never by a handler blowing up.
    assert "handler failed" not in broker.log_text()


def valid_requests(topic: str) -> list[tuple[int, int, Any]]:
    """One well-formed request per API, naming a real topic, for the mutation fuzzer to damage."""
    fetch = messages.FetchRequest
    fetch_topic = fetch.FetchTopic(  # type: ignore[attr-defined]
        topic=topic,
        partitions=[fetch.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)],  # type: ignore[attr-defined]
    )
    lo = messages.ListOffsetsRequest
    lo_topic = lo.ListOffsetsTopic(  # type: ignore[attr-defined]
        name=topic, partitions=[lo.ListOffsetsPartition(partition_index=0, timestamp=-1)]  # type: ignore[attr-defined]
    )
    dr = messages.DeleteRecordsRequest
    dr_topic = dr.DeleteRecordsTopic(  # type: ignore[attr-defined]
        name=topic, partitions=[dr.DeleteRecordsPartition(partition_index=0, offset=0)]  # type: ignore[attr-defined]
    )
    dc = messages.DescribeConfigsRequest
    dc_res = dc.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None)  # type: ignore[attr-defined]
    md = messages.MetadataRequest
    md_topic = md.MetadataRequestTopic(name=topic, topic_id=b"\x00" * 16)  # type: ignore[attr-defined]
    return [
        (ApiKey.PRODUCE, 9, produce_request(topic, bytes(sample_batch(3)), acks=1)),
        (ApiKey.FETCH, 12, fetch(max_wait_ms=0, min_bytes=0, topics=[fetch_topic])),
        (ApiKey.LIST_OFFSETS, 7, lo(replica_id=-1, topics=[lo_topic])),
        (ApiKey.DELETE_RECORDS, 2, dr(topics=[dr_topic], timeout_ms=1000)),
        (ApiKey.DESCRIBE_CONFIGS, 4, dc(resources=[dc_res])),
        (ApiKey.METADATA, 12, md(topics=[md_topic], allow_auto_topic_creation=False)),
        (ApiKey.API_VERSIONS, 3, api_versions_request()),
    ]


def test_mutated_valid_requests(broker: BrokerProcess, topic: str) -> None:
    """Valid requests with a few bytes of the body damaged: whatever still decodes reaches the handlers."""
    rng = random.Random(7)
    answered = 0
    for api_key, version, body in valid_requests(topic):
        correlation_id = next_correlation_id()
        good = bytes(messages.encode_request(body, api_key, version, correlation_id, "fuzz"))
        header_len = len(good) - len(messages.REQUESTS[api_key].encode(body, version, bytearray()))
        for _ in range(40):
            damaged = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                pos = rng.randrange(header_len, len(damaged))
                damaged[pos] = rng.randrange(256)
            if rng.random() < 0.2:
                damaged = damaged[: rng.randrange(header_len, len(damaged))]
            with connect(broker) as sock:
                sock.sendall(struct.pack(">i", len(damaged)) + damaged)
                sock.shutdown(socket.SHUT_WR)
                data = recv_frame(sock)
                if data is not None:
                    answered += 1
                    assert int.from_bytes(data[:4], "big", signed=True) == correlation_id
    assert answered > 0  # some damage is harmless (a changed key byte): those must still be answered
    assert_healthy(broker)
    assert "handler failed" not in broker.log_text()


# ---- record batch validation -----------------------------------------------------------------------


def test_corrupt_crc_is_corrupt_message(healthy_after: BrokerProcess, topic: str) -> None:
    warnings_before = log_count(healthy_after, "rejected produce")
    batch = sample_batch()
    batch[-2] ^= 0x55  # inside the last record: the stored CRC no longer matches
    with connect(healthy_after) as sock:
        assert produce_errors(sock, topic, bytes(batch)) == [(ErrorCode.CORRUPT_MESSAGE, -1)]
        # The connection stays usable and a good batch still goes in.
        assert produce_errors(sock, topic, bytes(sample_batch()))[0][0] == ErrorCode.NONE
    assert log_count(healthy_after, "rejected produce") > warnings_before


def test_wrong_record_count_is_invalid_record(healthy_after: BrokerProcess, topic: str) -> None:
    batch = sample_batch(5)
    batch[RECORDS_COUNT_POS : RECORDS_COUNT_POS + 4] = struct.pack(">i", 7)
    # Re-sign it so the CRC is right and only the count is wrong.
    batch[CRC_POS : CRC_POS + 4] = struct.pack(">I", crc32c.crc32c(bytes(batch[ATTRIBUTES_POS:])))
    with connect(healthy_after) as sock:
        assert produce_errors(sock, topic, bytes(batch)) == [(ErrorCode.INVALID_RECORD, -1)]


def test_rejected_batch_appends_nothing(healthy_after: BrokerProcess) -> None:
    name = f"bad-input-empty-{uuid.uuid4().hex[:8]}"
    with connect(healthy_after) as sock:
        create_topic(sock, name)
        batch = sample_batch()
        batch[-1] ^= 0x01
        assert produce_errors(sock, name, bytes(batch)) == [(ErrorCode.CORRUPT_MESSAGE, -1)]
        # The first good batch still lands at offset 0.
        assert produce_errors(sock, name, bytes(sample_batch())) == [(ErrorCode.NONE, 0)]


def test_two_batches_for_one_partition_are_invalid_record(healthy_after: BrokerProcess) -> None:
    """Kafka's ProduceRequest rule (v3 and later): exactly one record batch per partition. Two valid batches
    in one partition's record set are refused whole with INVALID_RECORD, and nothing of them is appended."""
    name = f"bad-input-two-{uuid.uuid4().hex[:8]}"
    with connect(healthy_after) as sock:
        create_topic(sock, name)
        assert produce_errors(sock, name, bytes(sample_batch()) + bytes(sample_batch())) == \
            [(ErrorCode.INVALID_RECORD, -1)]
        assert produce_errors(sock, name, bytes(sample_batch())) == [(ErrorCode.NONE, 0)]


# ---- connection behaviour --------------------------------------------------------------------------


def test_pipelined_requests_answered_in_order(healthy_after: BrokerProcess, topic: str) -> None:
    plan: list[tuple[int, int, int]] = []  # (correlation id, api key, version)
    out = bytearray()
    for i in range(100):
        correlation_id = 10_000 + i * 7
        if i % 2 == 0:
            out += frame(api_versions_request(), ApiKey.API_VERSIONS, 3, correlation_id)
            plan.append((correlation_id, ApiKey.API_VERSIONS, 3))
        else:
            md = messages.MetadataRequest(
                topics=[messages.MetadataRequest.MetadataRequestTopic(name=topic, topic_id=b"\x00" * 16)],  # type: ignore[attr-defined]
                allow_auto_topic_creation=False,
            )
            out += frame(md, ApiKey.METADATA, 12, correlation_id)
            plan.append((correlation_id, ApiKey.METADATA, 12))
    with connect(healthy_after) as sock:
        sock.sendall(out)  # all 100 requests in one write
        for correlation_id, api_key, version in plan:
            data = recv_frame(sock)
            assert data is not None
            got_id, resp = messages.decode_response(data, api_key, version)
            assert got_id == correlation_id
            if api_key == ApiKey.METADATA:
                assert [(t.name, t.error_code) for t in resp.topics] == [(topic, ErrorCode.NONE)]
            else:
                assert resp.error_code == ErrorCode.NONE


def test_kafka_python_bootstraps_with_api_versions_v4(healthy_after: BrokerProcess, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=healthy_after.bootstrap, acks="all")
    try:
        md = producer.send(topic, key=b"kp", value=b"hello").get(timeout=30)
        assert md.topic == topic and md.offset >= 0
    finally:
        producer.close()


@pytest.mark.slow
def test_idle_connection_is_closed(fresh_broker: BrokerProcess) -> None:
    fresh_broker.overrides = ["connections.max.idle.ms=1000"]
    broker = fresh_broker.start()
    with connect(broker) as used, connect(broker) as silent:
        assert call(used, api_versions_request(), ApiKey.API_VERSIONS, 3).error_code == ErrorCode.NONE
        # Both see EOF before the 15 s socket timeout would fail the read.
        assert_closed_by_broker(used)
        assert_closed_by_broker(silent)
    assert "closing idle connection" in broker.log_text()
    assert_healthy(broker)
