"""SASL mechanisms, JAAS parsing, certificate principals and the security config keys, without a broker."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from shoal.broker.common.config import BrokerConfig, ConfigError
from shoal.broker.security import scram
from shoal.broker.security.sasl import PlainServer, SaslSession, parse_jaas
from shoal.broker.security.scram import AuthenticationFailed, ScramCredentialStore, ScramServer
from shoal.broker.security.tls import normalize_pem, rfc2253_name

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_PART = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_store(tmp_path: Path, password: bytes = b"pencil") -> ScramCredentialStore:
    store = ScramCredentialStore(tmp_path)
    salted = scram.salted_password("SCRAM-SHA-256", password, RFC_SALT, 4096)
    store.apply([], [("user", "SCRAM-SHA-256", scram.credential_from_salted_password("SCRAM-SHA-256", RFC_SALT, salted, 4096))])
    return store


def test_scram_sha256_matches_rfc7677_vector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda _n: RFC_SERVER_PART)
    server = ScramServer("SCRAM-SHA-256", rfc_store(tmp_path))
    first = server.evaluate(f"n,,n=user,r={RFC_CLIENT_NONCE}".encode())
    assert first == f"r={RFC_CLIENT_NONCE}{RFC_SERVER_PART},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    final = server.evaluate(f"c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_PART},p={RFC_PROOF}".encode())
    assert final == RFC_SERVER_FINAL and server.complete and server.username == "user"


def test_scram_wrong_password_and_tampered_nonce_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda _n: RFC_SERVER_PART)
    server = ScramServer("SCRAM-SHA-256", rfc_store(tmp_path, b"not-pencil"))
    server.evaluate(f"n,,n=user,r={RFC_CLIENT_NONCE}".encode())
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        server.evaluate(f"c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_PART},p={RFC_PROOF}".encode())
    assert not server.complete
    server = ScramServer("SCRAM-SHA-256", rfc_store(tmp_path / "b"))
    server.evaluate(f"n,,n=user,r={RFC_CLIENT_NONCE}".encode())
    with pytest.raises(AuthenticationFailed) as err:
        server.evaluate(f"c=biws,r={RFC_CLIENT_NONCE}other,p={RFC_PROOF}".encode())
    assert "nonce" in err.value.reason


def test_scram_unknown_user_and_other_mechanism_fail(tmp_path: Path) -> None:
    store = rfc_store(tmp_path)
    with pytest.raises(AuthenticationFailed) as err:
        ScramServer("SCRAM-SHA-256", store).evaluate(b"n,,n=someone,r=abc")
    assert "no SCRAM-SHA-256 credential" in err.value.reason
    # The user only has a SHA-256 credential.
    with pytest.raises(AuthenticationFailed):
        ScramServer("SCRAM-SHA-512", store).evaluate(b"n,,n=user,r=abc")


def test_scram_credentials_persist_without_password(tmp_path: Path) -> None:
    rfc_store(tmp_path)
    reloaded = ScramCredentialStore(tmp_path)
    assert reloaded.mechanisms_of("user") == [("SCRAM-SHA-256", 4096)]
    assert b"pencil" not in (tmp_path / scram.FILE_NAME).read_bytes()


@pytest.mark.parametrize(("token", "message"), [
    (b"\x00alice\x00alice-secret", None),
    (b"alice\x00alice\x00alice-secret", None),
    (b"\x00alice\x00wrong", "Invalid username or password"),
    (b"\x00mallory\x00alice-secret", "Invalid username or password"),
    (b"bob\x00alice\x00alice-secret", "authorization id that is different"),
    (b"\x00alice", "expected 3 tokens"),
    (b"\x00\x00pw", "username not specified"),
])
def test_plain(token: bytes, message: str | None) -> None:
    server = PlainServer({"alice": "alice-secret"})
    if message is None:
        assert server.evaluate(token) == b"" and server.username == "alice"
    else:
        with pytest.raises(AuthenticationFailed, match=message):
            server.evaluate(token)
        assert not server.complete


def test_reauthentication_must_keep_the_principal() -> None:
    session = SaslSession("SASL_PLAINTEXT", reauth_ms=1000)
    users = {"alice": "a", "bob": "b"}
    session.begin("PLAIN", PlainServer(users), raw_tokens=False)
    session.evaluate(b"\x00alice\x00a")
    assert session.authenticated and session.lifetime_ms == 1000 and session.expires_at is not None
    session.begin("PLAIN", PlainServer(users), raw_tokens=False)
    with pytest.raises(AuthenticationFailed, match="Cannot change principals"):
        session.evaluate(b"\x00bob\x00b")


def test_parse_jaas() -> None:
    module, options = parse_jaas(
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="a;b \\"c\\"" user_alice="alice-secret" user_bob=bob;'
    )
    assert module.endswith("PlainLoginModule")
    assert options == {"username": "admin", "password": 'a;b "c"', "user_alice": "alice-secret", "user_bob": "bob"}
    with pytest.raises(ValueError):
        parse_jaas("org.example.Module sometimes;")


def test_rfc2253_rendering_like_java() -> None:
    subject = ((("countryName", "US"),), (("organizationName", "Acme, Inc."),), (("organizationalUnitName", "eng"),),
               (("commonName", "alice"),), (("emailAddress", "a@x.io"),))
    assert rfc2253_name(subject) == "1.2.840.113549.1.9.1=#16066140782e696f,CN=alice,OU=eng,O=Acme\\, Inc.,C=US"


def test_inline_pem_rewrapped() -> None:
    joined = "-----BEGIN CERTIFICATE-----" + "A" * 100 + "-----END CERTIFICATE-----"
    lines = normalize_pem(joined).splitlines()
    assert lines == ["-----BEGIN CERTIFICATE-----", "A" * 64, "A" * 36, "-----END CERTIFICATE-----"]


def test_security_config_keys() -> None:
    cfg = BrokerConfig.load(None, [
        "listeners=PLAINTEXT://:9092,SASL_SSL://:9093,INTERNAL://:9094",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,INTERNAL:SASL_PLAINTEXT",
        "listener.name.internal.sasl.enabled.mechanisms=SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config=x.ScramLoginModule required;",
        "listener.name.sasl_ssl.ssl.client.auth=required",
        "connections.max.reauth.ms=60000",
    ])
    assert cfg.for_listener("INTERNAL", "sasl.enabled.mechanisms") == ["SCRAM-SHA-512"]
    assert cfg.for_listener("SASL_SSL", "sasl.enabled.mechanisms") == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert cfg.for_listener("sasl_ssl", "ssl.client.auth") == "required"
    assert cfg.for_listener("INTERNAL", "connections.max.reauth.ms") == 60000
    assert cfg.jaas_config("INTERNAL", "SCRAM-SHA-512").startswith("x.ScramLoginModule")
    for bad in ("sasl.enabled.mechanisms=GSSAPI", "ssl.client.auth=sometimes", "ssl.keystore.type=JKS"):
        with pytest.raises(ConfigError):
            BrokerConfig.load(None, [bad])
    # Per-listener keys that do not exist are unknown keys: a warning, an error with --strict.
    for unknown in ("listener.name.internal.log.dirs=/x", "listener.name.x.no.such.key=1"):
        assert not BrokerConfig.load(None, [unknown]).notes[0].known
        with pytest.raises(ConfigError):
            BrokerConfig.load(None, [unknown], strict=True)
