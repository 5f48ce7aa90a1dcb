"""Pure pieces of the bundled client: murmur2 partitioning, SASL exchanges, config, errors, ack encoding,
and how ShareFetch payloads become records."""

from __future__ import annotations

import base64
import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from murmurhash2 import murmurhash2

from shoal.client.consumer.share_consumer import (
    AcknowledgeType,
    AsyncShareConsumer,
    ack_batches,
    new_member_id,
)
from shoal.client.errors import (
    KafkaConnectionError,
    KafkaError,
    NotCoordinatorError,
    UnknownTopicError,
    for_code,
)
from shoal.client.producer.partitioner import StickyPartitioner, murmur2, murmur2_python, partition_for_key
from shoal.client.security import ClientConfig, PlainExchange, ScramExchange
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode
from shoal.protocol.records import RecordInput, encode_batch, encode_txn_marker

ACK_BATCH = messages.ShareFetchRequest.AcknowledgementBatch  # type: ignore[attr-defined]
ACQUIRED = messages.ShareFetchResponse.AcquiredRecords  # type: ignore[attr-defined]


# Values from Apache Kafka's UtilsTest#testMurmur2.
@pytest.mark.parametrize(
    "text, expected",
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected
    # The plain-Python stand-in (for platforms without the compiled wheel) gives the same, unsigned.
    assert murmur2_python(text.encode(), 0x9747B28C) == expected & 0xFFFFFFFF


@given(st.binary(max_size=64))
def test_compiled_and_python_murmur2_agree(data: bytes) -> None:
    assert murmurhash2(data, 0x9747B28C) == murmur2_python(data, 0x9747B28C)
    assert partition_for_key(data, 7) == (murmur2_python(data, 0x9747B28C) & 0x7FFFFFFF) % 7
    assert partition_for_key(bytearray(data), 7) == partition_for_key(data, 7)


def test_partition_for_key_clears_the_sign_bit() -> None:
    # murmur2("21") is negative; Kafka maps it with `& 0x7fffffff`, not abs().
    assert partition_for_key(b"21", 1000) == (-973932308 & 0x7FFFFFFF) % 1000
    assert partition_for_key(b"21", 1000) != abs(-973932308) % 1000


def test_sticky_partitioner_moves_on_only_when_its_batch_closes() -> None:
    sticky = StickyPartitioner()
    first = sticky.partition("t", 4)
    assert {sticky.partition("t", 4) for _ in range(10)} == {first}
    sticky.on_new_batch("t", 4, (first + 2) % 4)  # some other partition's batch: no change
    assert sticky.partition("t", 4) == first
    sticky.on_new_batch("t", 4, first)
    assert sticky.partition("t", 4) == (first + 1) % 4


def test_scram_sha256_rfc7677_exchange() -> None:
    scram = ScramExchange("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert scram.step(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert scram.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


def test_scram_rejects_a_forged_server_signature_and_a_foreign_nonce() -> None:
    scram = ScramExchange("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    scram.first()
    scram.step(b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(KafkaError):
        scram.step(b"v=" + base64.b64encode(b"\x00" * 32))
    other = ScramExchange("SCRAM-SHA-512", "user", "pencil", nonce="abc")
    other.first()
    with pytest.raises(KafkaError):
        other.step(b"r=zzz,s=AAAA,i=4096")


def test_plain_and_config_parsing() -> None:
    assert PlainExchange("alice", "pw").first() == b"\x00alice\x00pw"
    cfg = ClientConfig.from_dict(
        {"security.protocol": "sasl_ssl", "sasl.mechanisms": "scram-sha-512", "sasl.username": "u",
         "sasl.password": "p", "request.timeout.ms": "1234", "ssl.endpoint.identification.algorithm": "none"}
    )
    assert (cfg.security_protocol, cfg.sasl_mechanism, cfg.request_timeout_ms) == ("SASL_SSL", "SCRAM-SHA-512", 1234)
    assert cfg.uses_ssl and cfg.uses_sasl and not cfg.ssl_check_hostname
    for bad in ({"security.protocol": "KERBEROS"}, {"no.such.key": 1},
                {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"},
                {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI", "sasl.username": "u",
                 "sasl.password": "p"}):
        with pytest.raises(ValueError):
            ClientConfig.from_dict(bad)


def test_errors_carry_code_name_and_retriability() -> None:
    err = for_code(ErrorCode.NOT_COORDINATOR, "moved")
    assert isinstance(err, NotCoordinatorError) and err.retriable
    assert (err.code, err.name) == (16, "NOT_COORDINATOR") and "moved" in str(err)
    assert isinstance(for_code(ErrorCode.UNKNOWN_TOPIC_ID), UnknownTopicError)
    assert not for_code(ErrorCode.INVALID_RECORD_STATE).retriable
    assert KafkaConnectionError().retriable and KafkaConnectionError().name == "NETWORK_EXCEPTION"
    assert for_code(9999).name == "ERROR_9999"
    copy = pickle.loads(pickle.dumps(err))
    assert copy == err and type(copy) is NotCoordinatorError


def test_member_id_is_a_22_char_url_safe_uuid() -> None:
    ids = {new_member_id() for _ in range(50)}
    assert len(ids) == 50
    for member_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", member_id)
        assert len(base64.urlsafe_b64decode(member_id + "==")) == 16


def test_ack_batches_merge_runs_of_one_type() -> None:
    acks = {5: 1, 6: 1, 7: 2, 9: 2, 10: 2, 3: 1}
    batches = ack_batches(acks, ACK_BATCH)
    assert [(b.first_offset, b.last_offset, b.acknowledge_types) for b in batches] == [
        (3, 3, [1]),
        (5, 6, [1]),
        (7, 7, [2]),
        (9, 10, [2]),
    ]
    assert ack_batches({}, ACK_BATCH) == []


def test_only_acquired_offsets_become_records_and_the_rest_are_gaps() -> None:
    consumer = AsyncShareConsumer("127.0.0.1:1", "g")
    tid = b"\x01" * 16
    data = (
        encode_batch([RecordInput(b"k0", b"v0"), RecordInput(b"k1", b"v1", [("h", b"x")])], base_offset=0)
        + encode_txn_marker(commit=True, producer_id=7, producer_epoch=0, coordinator_epoch=0, base_offset=2)
        + encode_batch([RecordInput(None, b"v3"), RecordInput(None, b"v4"), RecordInput(None, b"v5")], base_offset=3)
    )
    acquired = [ACQUIRED(first_offset=1, last_offset=3, delivery_count=2), ACQUIRED(first_offset=5, last_offset=6, delivery_count=1)]
    records = consumer._acquired("t", (tid, 0), 1, data, acquired)
    assert [(r.offset, r.key, r.value, r.delivery_count) for r in records] == [
        (1, b"k1", b"v1", 2),
        (3, None, b"v3", 2),
        (5, None, b"v5", 1),
    ]
    assert records[0].headers == [("h", b"x")]
    # Offset 2 is a control record and 6 is past the data: both are acknowledged as GAP by the client.
    assert consumer._pending_acks == {1: {(tid, 0): {2: AcknowledgeType.GAP, 6: AcknowledgeType.GAP}}}
