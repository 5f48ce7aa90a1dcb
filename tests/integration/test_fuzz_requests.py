"""A bounded, structure-aware fuzzer: requests built from the JSON message specs, for every API and version
the broker advertises, with edge values in every field (limits of each integer type, null where the
version allows it, empty and over-long strings, topic names that exist and ones that cannot, damaged
record batches, arrays of zero to two elements).

Every request is well framed, so every one must be answered (Produce with acks=0 excepted) with the
right correlation id and a response that decodes at that version; the broker must stay up, log no
traceback, and start again on its data afterwards. Seeded, so a failure replays exactly.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch
from shoal.protocol.schema import FieldSpec, StructSpec

from ..unit.strategies import INT_RANGES
from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .test_bad_requests import PHANTOM_HEADERS, create_topics, raw_batch, raw_record, topic_partitions

# Replay or widen a run with SHOAL_FUZZ_SEED / SHOAL_FUZZ_ROUNDS; the suite's run is bounded (a few seconds).
SEED = int(os.environ.get("SHOAL_FUZZ_SEED", "20261123"))
REQUESTS_PER_VERSION = int(os.environ.get("SHOAL_FUZZ_ROUNDS", "12"))

INTERNAL_TOPICS = ("__consumer_offsets", "__share_group_state", "__transaction_state")
INTERNAL_PARTITIONS = 3

# Durations the broker honours by waiting (long polls): their edges would only make the fuzzer sleep.
_WAIT_FIELDS = ("WaitMs", "TimeoutMs")


class Generator:
    """Random request bodies for one broker: names and ids that exist there mixed with hostile ones."""

    def __init__(self, rng: random.Random, topic: str, topic_id: bytes):
        self.rng = rng
        self.topic_id = topic_id
        good_batch = encode_batch([RecordInput(b"k", b"v", [("h", b"x")])])
        self.strings = ["", topic, "fuzz-group", *INTERNAL_TOPICS, "x" * 249, "y" * 250, "bad name/\u00e9",
                        "\x00", "1"]
        self.records = [None, b"", good_batch, PHANTOM_HEADERS, b"\xff" * 70,
                        raw_batch(raw_record(timestamp_delta=1), 1, base_timestamp=2**63 - 1)]

    def body(self, api_key: int, version: int) -> Any:
        codec = messages.REQUESTS[api_key]
        self._root = codec.cls  # nested struct classes hang off the message's class
        return self._struct(codec.cls, codec.spec.root, version, codec.is_flexible(version), depth=0)

    def _struct(self, cls: Any, spec: StructSpec, version: int, flexible: bool, depth: int) -> Any:
        values = {f.attr: self._field(f, version, flexible, depth) for f in spec.fields if version in f.versions}
        return cls(**values)

    def _field(self, f: FieldSpec, version: int, flexible: bool, depth: int) -> Any:
        rng = self.rng
        nullable = version in f.nullable
        if f.is_array:
            if nullable and rng.random() < 0.15:
                return None
            n = rng.choice((0, 1, 1, 2)) if depth < 3 else 0
            return [self._element(f, version, flexible, depth) for _ in range(n)]
        if nullable and rng.random() < 0.15:
            return None
        return self._element(f, version, flexible, depth)

    def _element(self, f: FieldSpec, version: int, flexible: bool, depth: int) -> Any:
        rng = self.rng
        if f.struct is not None:
            return self._struct(getattr(self._root, f.struct.name), f.struct, version, flexible, depth + 1)
        t = f.type
        if t in INT_RANGES:
            lo, hi = INT_RANGES[t]
            if f.name.endswith(_WAIT_FIELDS):
                return rng.choice([v for v in (-1, 0, 1, 50) if lo <= v <= hi])
            return rng.choice((lo, hi, -1 if lo < 0 else 0, 0, 1, rng.randint(lo, hi)))
        if t == "bool":
            return rng.random() < 0.5
        if t == "float64":
            return rng.choice((0.0, -1.0, 1e308, float("inf")))
        if t == "uuid":
            return rng.choice((b"\x00" * 16, self.topic_id, uuid.uuid4().bytes))
        if t == "string":
            if rng.random() < 0.05:
                return "z" * (40_000 if flexible else 32_767)
            return rng.choice(self.strings)
        if t == "bytes":
            return rng.choice((b"", b"\x00", rng.randbytes(16)))
        if t == "records":
            return rng.choice(self.records)
        raise AssertionError(f"unknown field type {t}")


def advertised(client: WireClient) -> list[tuple[int, int]]:
    resp = client.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
        client_software_name="fuzz", client_software_version="1"))
    return [(k.api_key, v) for k in resp.api_keys for v in range(k.min_version, k.max_version + 1)]


class Connection:
    """A raw connection that reconnects when the broker closed it after an answer (a failed login)."""

    def __init__(self, broker: BrokerProcess):
        self.broker = broker
        self.sock: socket.socket | None = None

    def exchange(self, api_key: int, version: int, body: Any, correlation_id: int) -> tuple[int, Any] | None:
        frame = messages.encode_request(body, api_key, version, correlation_id, "fuzz")
        no_answer = api_key == ApiKey.PRODUCE and body.acks == 0
        for attempt in (1, 2):
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.broker.port), timeout=30)
            try:
                self.sock.sendall(struct.pack(">i", len(frame)) + bytes(frame))
                if no_answer:
                    return None
                size = struct.unpack(">i", self._read(4))[0]
                return messages.decode_response(self._read(size), api_key, version)
            except ConnectionError:
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _read(self, n: int) -> bytes:
        assert self.sock is not None
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the broker")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("fuzz")
    proc = BrokerProcess(base / "data", overrides=[
        "max.partitions.per.request=8", "max.partitions=64",
        f"offsets.topic.num.partitions={INTERNAL_PARTITIONS}",
        f"share.coordinator.state.topic.num.partitions={INTERNAL_PARTITIONS}",
        f"transaction.state.log.num.partitions={INTERNAL_PARTITIONS}",
    ])
    proc.start()
    yield proc
    proc.stop()


def test_structure_aware_fuzz(fuzz_broker: BrokerProcess) -> None:
    rng = random.Random(SEED)
    topic = "fuzz-topic"
    with WireClient.connect(fuzz_broker.bootstrap) as client:
        versions = advertised(client)
    gen = Generator(rng, topic, b"\x00" * 16)
    conn = Connection(fuzz_broker)
    sent = answered = 0
    started = time.monotonic()
    try:
        for _round in range(REQUESTS_PER_VERSION):
            # Each round in a new order, against a topic that exists (an earlier DeleteTopics may have hit it).
            gen.topic_id = ensure_topic(fuzz_broker, topic)
            for api_key, version in rng.sample(versions, len(versions)):
                body = gen.body(api_key, version)
                sent += 1
                correlation_id = rng.randint(0, 2**31 - 1)
                try:
                    got = conn.exchange(api_key, version, body, correlation_id)
                except ConnectionError:
                    pytest.fail(f"no answer to {messages.API_NAMES[api_key]} v{version}: {body!r:.2000}")
                if got is not None:
                    answered += 1
                    assert got[0] == correlation_id, (api_key, version)
    finally:
        conn.close()
    assert answered > sent * 0.9
    # Growing an internal topic by one partition fits every budget, so only the refusal stops it.
    grow_internal_topics(fuzz_broker, [v for k, v in versions if k == ApiKey.CREATE_PARTITIONS])
    assert fuzz_broker.alive()
    log_text = fuzz_broker.log_text()
    assert "Traceback" not in log_text and "handler failed" not in log_text, log_text[-4000:]
    print(f"fuzz: {sent} requests over {len(versions)} api versions in {time.monotonic() - started:.1f}s")

    # The broker starts again on whatever the fuzzer left behind (topics it created or deleted included).
    before = all_topics(fuzz_broker)
    assert {t: before[t] for t in INTERNAL_TOPICS if t in before} == dict.fromkeys(
        [t for t in INTERNAL_TOPICS if t in before], INTERNAL_PARTITIONS)
    assert fuzz_broker.stop() == 0
    fuzz_broker.start()
    assert all_topics(fuzz_broker) == before
    assert "Traceback" not in fuzz_broker.log_text()


def grow_internal_topics(broker: BrokerProcess, versions: list[int]) -> None:
    """CreatePartitions(current + 1) on each internal topic that exists, at every version: refused."""
    req = messages.CreatePartitionsRequest
    assert versions
    with WireClient.connect(broker.bootstrap) as client:
        for version in versions:
            existing: dict[str, int] = {}
            for name in INTERNAL_TOPICS:
                found = topic_partitions(client, name)
                if found is not None:
                    existing[name] = found[1]
            assert "__consumer_offsets" in existing and "__share_group_state" in existing
            topics = [req.CreatePartitionsTopic(name=t, count=n + 1, assignments=None)  # type: ignore[attr-defined]
                      for t, n in existing.items()]
            resp = client.request(ApiKey.CREATE_PARTITIONS, version,
                                  req(topics=topics, timeout_ms=10_000, validate_only=version % 2 == 1))
            assert {r.name: r.error_code for r in resp.results} == dict.fromkeys(existing, ErrorCode.INVALID_REQUEST)
            assert all(r.name in (r.error_message or "") for r in resp.results)


def ensure_topic(broker: BrokerProcess, topic: str) -> bytes:
    with WireClient.connect(broker.bootstrap) as client:
        found = topic_partitions(client, topic)
        if found is None:
            assert create_topics(client, 7, topic, partitions=2).error_code == ErrorCode.NONE
            found = topic_partitions(client, topic)
    assert found is not None
    return found[0]


def all_topics(broker: BrokerProcess) -> dict[str, int]:
    with WireClient.connect(broker.bootstrap) as client:
        md = client.request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False))
    assert md.topics and all(t.error_code == ErrorCode.NONE for t in md.topics)
    return {t.name: len(t.partitions) for t in md.topics}
