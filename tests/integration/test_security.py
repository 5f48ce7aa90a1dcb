"""TLS and SASL listeners end to end: the real broker process, certificates made here with `openssl`.

One broker serves PLAINTEXT (the admin's bootstrap path), SSL with required client certificates,
SASL_PLAINTEXT, SASL_SSL (inline PEM key material), and a second SASL_PLAINTEXT listener `REAUTH` with
its own users and a short `connections.max.reauth.ms`. The clients are confluent-kafka (producer,
consumer, admin, share consumer), kafka-python and aiokafka; refusals are checked on the wire, in the
broker log, and by the broker going on serving everyone else.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

from .broker_process import BrokerProcess
from .kafka_wire import WireClient
from .share_clients import Consumed, poll_until, set_group_config, share_consumer

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";'
REAUTH_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_carol="carol-secret";'
REAUTH_MS = 1500


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key_and_csr(cwd: Path, name: str, subject: str) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)


def make_pki(cwd: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1, a client `alice` of that CA, and `mallory` of another CA."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("the openssl CLI is needed to make test certificates")
    cwd.mkdir(parents=True, exist_ok=True)
    for ca, subject in (("ca", "/CN=Shoal Test CA"), ("other-ca", "/CN=Some Other CA")):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", subject, cwd=cwd)
    (cwd / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, ca, ext in (
        ("server", "/CN=localhost", "ca", ["-extfile", "server.ext"]),
        ("alice", "/C=US/O=Acme, Inc./OU=eng/CN=alice", "ca", []),
        ("mallory", "/CN=mallory", "other-ca", []),
    ):
        _key_and_csr(cwd, name, subject)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *ext, cwd=cwd)
    # Kafka's PEM keystore file: certificate chain and private key in one file.
    (cwd / "server.pem").write_text((cwd / "server.crt").read_text() + (cwd / "server.key").read_text())
    return {name: cwd / name for name in (
        "ca.pem", "server.pem", "server.crt", "server.key", "alice.crt", "alice.key", "mallory.crt", "mallory.key"
    )}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("secure")
    overrides = [
        "group.share.min.heartbeat.interval.ms=1000",
        "group.share.heartbeat.interval.ms=1000",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
        "SASL_SSL:SASL_SSL,REAUTH:SASL_PLAINTEXT",
        f"ssl.keystore.location={pki['server.pem']}",
        f"ssl.truststore.location={pki['ca.pem']}",
        "listener.name.ssl.ssl.client.auth=required",
        # SASL_SSL takes its key material inline instead of from a file.
        f"listener.name.sasl_ssl.ssl.keystore.certificate.chain={pki['server.crt'].read_text()}",
        f"listener.name.sasl_ssl.ssl.keystore.key={pki['server.key'].read_text()}",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={PLAIN_JAAS}",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={PLAIN_JAAS}",
        f"listener.name.reauth.plain.sasl.jaas.config={REAUTH_JAAS}",
        "listener.name.reauth.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.reauth.connections.max.reauth.ms={REAUTH_MS}",
    ]
    proc = BrokerProcess(
        base / "data", overrides=overrides,
        extra_listeners=["SSL://127.0.0.1:0", "SASL_PLAINTEXT://127.0.0.1:0", "SASL_SSL://127.0.0.1:0",
                         "REAUTH://127.0.0.1:0"],
    ).start()
    yield proc
    proc.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def client_conf(broker: BrokerProcess, pki: dict[str, Path], kind: str) -> dict[str, Any]:
    """confluent-kafka settings for one way in."""
    if kind == "SSL":
        return {"bootstrap.servers": broker.address("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": str(pki["ca.pem"]), "ssl.certificate.location": str(pki["alice.crt"]),
                "ssl.key.location": str(pki["alice.key"])}
    listener, mechanism, user, password = {
        "PLAIN": ("SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret"),
        "SCRAM-SHA-512": ("SASL_PLAINTEXT", "SCRAM-SHA-512", "scram-user", "scram-secret-512"),
        "SASL_SSL": ("SASL_SSL", "SCRAM-SHA-256", "scram-user", "scram-secret-256"),
    }[kind]
    conf = {"bootstrap.servers": broker.address(listener), "security.protocol": listener,
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if listener == "SASL_SSL":
        conf["ssl.ca.location"] = str(pki["ca.pem"])
    return conf


def ensure_scram_user(broker: BrokerProcess) -> None:
    """The admin on PLAINTEXT (User:ANONYMOUS) creates the SCRAM credentials the SASL clients use."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    alterations: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion("scram-user", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                     b"scram-secret-512"),
        UserScramCredentialUpsertion("scram-user", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                     b"scram-secret-256"),
    ]
    for future in admin.alter_user_scram_credentials(alterations).values():
        future.result(30)


def confluent_roundtrip(conf: dict[str, Any], count: int = 300, pad: int = 0) -> str:
    """Create a topic with the admin client, produce, read back with an assigned consumer; returns the topic.
    `pad` bytes after each value make the Produce requests large (received into buffers of their own)."""
    topic = _name("sec")
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert topic in admin.list_topics(timeout=30).topics
    producer = Producer({**conf, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=b"v-%d" % i + b"." * pad)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": _name("unused"), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value() or b"")
    consumer.close()
    assert got == [b"v-%d" % i + b"." * pad for i in range(count)]
    return topic


def test_large_produce_requests_over_tls(secure_broker: BrokerProcess, pki: dict[str, Path]) -> None:
    # Requests of hundreds of KiB arrive as many TLS records: decrypted, they are cut into the same frames.
    confluent_roundtrip(client_conf(secure_broker, pki, "SSL"), count=120, pad=8 * 1024)


@pytest.mark.parametrize("kind", ["SSL", "PLAIN", "SCRAM-SHA-512", "SASL_SSL"])
def test_confluent_clients_over_each_protocol(secure_broker: BrokerProcess, pki: dict[str, Path], kind: str) -> None:
    ensure_scram_user(secure_broker)
    conf = client_conf(secure_broker, pki, kind)
    topic = confluent_roundtrip(conf)
    # The share consumer over the same secured listener sees the same records.
    group = _name("sg")
    set_group_config(secure_broker.bootstrap, group, share_auto_offset_reset="earliest")
    extra = {k.replace(".", "_"): v for k, v in conf.items() if k != "bootstrap.servers"}
    consumer = share_consumer(conf["bootstrap.servers"], group, [topic], **extra)
    sink = Consumed()
    try:
        poll_until(consumer, lambda: len(sink) >= 300, sink, 60)
    finally:
        consumer.close()
    assert sorted(o for _p, o, _v, _d in sink.records) == list(range(300))


def test_scram_credentials_described_without_secrets(secure_broker: BrokerProcess) -> None:
    ensure_scram_user(secure_broker)
    admin = AdminClient({"bootstrap.servers": secure_broker.bootstrap})
    futures = admin.describe_user_scram_credentials(["scram-user"])
    assert isinstance(futures, dict)
    described = futures["scram-user"].result(30)
    infos = {(i.mechanism, i.iterations) for i in described.scram_credential_infos}
    assert infos == {(ScramMechanism.SCRAM_SHA_512, 4096), (ScramMechanism.SCRAM_SHA_256, 8192)}
    with pytest.raises(KafkaException) as err:
        missing = admin.describe_user_scram_credentials(["nobody"])
        assert isinstance(missing, dict)
        missing["nobody"].result(30)
    assert err.value.args[0].code() == 91  # RESOURCE_NOT_FOUND


def test_kafka_python_over_sasl_plain(secure_broker: BrokerProcess) -> None:
    topic = _name("kp")
    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "bob", "sasl_plain_password": "bob-secret"}
    producer = KafkaProducer(bootstrap_servers=secure_broker.address("SASL_PLAINTEXT"), **auth)
    for i in range(100):
        producer.send(topic, value=b"kp-%d" % i, partition=0)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=secure_broker.address("SASL_PLAINTEXT"), group_id=None,
                             enable_auto_commit=False, **auth)
    consumer.assign([KpTopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        for records in consumer.poll(500).values():
            got += [r.value for r in records]
    consumer.close()
    assert got == [b"kp-%d" % i for i in range(100)]


def test_aiokafka_over_sasl_plain(secure_broker: BrokerProcess) -> None:
    topic = _name("aio")
    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=secure_broker.address("SASL_PLAINTEXT"), **auth)
        await producer.start()
        try:
            for i in range(100):
                await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=secure_broker.address("SASL_PLAINTEXT"), group_id=None,
                                    enable_auto_commit=False, **auth)
        await consumer.start()
        got: list[bytes] = []
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + 30
            while len(got) < 100 and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got += [r.value for r in records]
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == [b"aio-%d" % i for i in range(100)]


# ---- refusals ------------------------------------------------------------------------------------


def sasl_plain(client: WireClient, user: str, password: str, handshake_version: int = 1) -> Any:
    hs = client.request(ApiKey.SASL_HANDSHAKE, handshake_version, messages.SaslHandshakeRequest(mechanism="PLAIN"))
    assert hs.error_code == ErrorCode.NONE, hs
    token = b"\x00" + user.encode() + b"\x00" + password.encode()
    return client.request(ApiKey.SASL_AUTHENTICATE, 2, messages.SaslAuthenticateRequest(auth_bytes=token))


def metadata(client: WireClient) -> Any:
    return client.request(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False))


def assert_closed(client: WireClient) -> None:
    client.sock.settimeout(10)
    with pytest.raises(ConnectionError):
        while True:
            if not client.sock.recv(4096):
                raise ConnectionError("closed")


@pytest.mark.parametrize(("user", "password", "reason"), [
    ("alice", "wrong", "wrong password"),
    ("nobody", "whatever", "unknown user"),
])
def test_bad_plain_login_refused_logged_and_closed(secure_broker: BrokerProcess, user: str, password: str,
                                                   reason: str) -> None:
    with WireClient.connect(secure_broker.address("SASL_PLAINTEXT")) as client:
        resp = sasl_plain(client, user, password)
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert resp.error_message == "Authentication failed: Invalid username or password"
        assert_closed(client)
    assert f"{reason} '{user}'" in secure_broker.log_text()
    # Others keep being served.
    with WireClient.connect(secure_broker.address("SASL_PLAINTEXT")) as client:
        assert sasl_plain(client, "alice", "alice-secret").error_code == ErrorCode.NONE
        assert metadata(client).brokers[0].port == secure_broker.ports["SASL_PLAINTEXT"]


def test_bad_scram_password_refused_by_confluent(secure_broker: BrokerProcess, pki: dict[str, Path]) -> None:
    ensure_scram_user(secure_broker)
    conf = {**client_conf(secure_broker, pki, "SCRAM-SHA-512"), "sasl.password": "not-the-password"}
    refused = AdminClient(conf)
    with pytest.raises(KafkaException):
        refused.list_topics(timeout=5)
    del refused  # stop librdkafka's reconnect attempts
    assert "client proof does not match the stored credential (wrong password)" in secure_broker.log_text()
    assert confluent_roundtrip(client_conf(secure_broker, pki, "SCRAM-SHA-512"), count=10)


def test_unauthenticated_request_on_sasl_listener_closes_connection(secure_broker: BrokerProcess) -> None:
    with WireClient.connect(secure_broker.address("SASL_PLAINTEXT")) as client:
        # ApiVersions is allowed before authentication, Metadata is not.
        versions = client.request(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
            client_software_name="t", client_software_version="1"))
        assert {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE} <= {k.api_key for k in versions.api_keys}
        client.send(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False))
        assert_closed(client)
    assert "request before SASL authentication completed" in secure_broker.log_text()


def test_sasl_handshake_v0_raw_tokens(secure_broker: BrokerProcess) -> None:
    with WireClient.connect(secure_broker.address("SASL_PLAINTEXT")) as client:
        hs = client.request(ApiKey.SASL_HANDSHAKE, 0, messages.SaslHandshakeRequest(mechanism="PLAIN"))
        assert hs.error_code == ErrorCode.NONE and "SCRAM-SHA-512" in hs.mechanisms
        token = b"\x00bob\x00bob-secret"
        client.sock.sendall(len(token).to_bytes(4, "big") + token)
        # The PLAIN server's (empty) reply comes back as a bare frame, then Kafka requests work.
        assert client._read(4) == b"\x00\x00\x00\x00"
        assert metadata(client).cluster_id


def test_untrusted_client_certificate_refused(secure_broker: BrokerProcess, pki: dict[str, Path]) -> None:
    ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    ctx.load_cert_chain(str(pki["mallory.crt"]), str(pki["mallory.key"]))
    raw = socket.create_connection(("127.0.0.1", secure_broker.ports["SSL"]), timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            # TLS 1.3 reports the refused client certificate on the first read after the handshake.
            tls.sendall(b"\x00\x00\x00\x00")
            if not tls.recv(1):
                raise ConnectionError("closed")
    assert "TLS handshake failed" in secure_broker.log_text()
    assert confluent_roundtrip(client_conf(secure_broker, pki, "SSL"), count=10)


def test_plaintext_bytes_on_ssl_port_dropped(secure_broker: BrokerProcess, pki: dict[str, Path]) -> None:
    with WireClient.connect(secure_broker.address("SSL")) as client:
        client.send(ApiKey.API_VERSIONS, 0, messages.ApiVersionsRequest())
        assert_closed(client)
    with WireClient.connect(secure_broker.address("SASL_SSL")) as client:
        client.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert_closed(client)
    assert secure_broker.alive()
    assert confluent_roundtrip(client_conf(secure_broker, pki, "SSL"), count=10)


# ---- re-authentication ---------------------------------------------------------------------------


def test_session_expires_without_reauthentication(secure_broker: BrokerProcess) -> None:
    with WireClient.connect(secure_broker.address("REAUTH")) as client:
        resp = sasl_plain(client, "carol", "carol-secret")
        assert resp.error_code == ErrorCode.NONE and resp.session_lifetime_ms == REAUTH_MS
        assert metadata(client).cluster_id
        time.sleep(REAUTH_MS / 1000 + 0.3)
        client.send(ApiKey.METADATA, 12, messages.MetadataRequest(topics=None, allow_auto_topic_creation=False))
        assert_closed(client)
    assert "SASL session expired without re-authentication" in secure_broker.log_text()


def test_reauthentication_keeps_connection(secure_broker: BrokerProcess) -> None:
    with WireClient.connect(secure_broker.address("REAUTH")) as client:
        assert sasl_plain(client, "carol", "carol-secret").error_code == ErrorCode.NONE
        time.sleep(REAUTH_MS / 1000 + 0.3)
        assert sasl_plain(client, "carol", "carol-secret").session_lifetime_ms == REAUTH_MS
        assert metadata(client).cluster_id
    # Users of the other SASL listener do not exist on this one.
    with WireClient.connect(secure_broker.address("REAUTH")) as client:
        assert sasl_plain(client, "alice", "alice-secret").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_reauthentication_as_another_user_refused(secure_broker: BrokerProcess) -> None:
    with WireClient.connect(secure_broker.address("SASL_PLAINTEXT")) as client:
        assert sasl_plain(client, "alice", "alice-secret").error_code == ErrorCode.NONE
        resp = sasl_plain(client, "bob", "bob-secret")
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals" in resp.error_message
        assert_closed(client)


def test_confluent_producer_reauthenticates(secure_broker: BrokerProcess) -> None:
    conf = {"bootstrap.servers": secure_broker.address("REAUTH"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": "carol", "sasl.password": "carol-secret"}
    topic = _name("reauth")
    expired_before = secure_broker.log_text().count("SASL session expired")
    producer = Producer(conf)
    # Spans several session lifetimes: librdkafka must re-authenticate in time (KIP-368), or the broker
    # closes its connection and logs the expiry.
    for i in range(12):
        producer.produce(topic, value=b"r-%d" % i)
        assert producer.flush(10) == 0
        time.sleep(REAUTH_MS / 1000 / 4)
    assert secure_broker.log_text().count("SASL session expired") == expired_before
