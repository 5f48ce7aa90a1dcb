"""Client configuration by Kafka property names, the TLS context, and the SASL PLAIN / SCRAM exchanges."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import AuthenticationError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


# Kafka client keys `ClientConfig.from_dict` takes, with the attribute each sets (and, apart from these,
# ssl.endpoint.identification.algorithm, which sets ssl_check_hostname).
CLIENT_KEYS: dict[str, str] = {
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's spelling
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "request.timeout.ms": "request_timeout_ms",
    "socket.connection.setup.timeout.ms": "socket_connection_setup_timeout_ms",
    "socket.connection.setup.timeout.max.ms": "socket_connection_setup_timeout_max_ms",
    "reconnect.backoff.ms": "reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "reconnect_backoff_max_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "default.api.timeout.ms": "default_api_timeout_ms",
}
SSL_ENDPOINT_IDENTIFICATION = "ssl.endpoint.identification.algorithm"
# Every key `ClientConfig.from_dict` reads: what tools and the sidecar's upstream.* keys pass through.
CLIENT_KEY_NAMES = frozenset({*CLIENT_KEYS, SSL_ENDPOINT_IDENTIFICATION})


@dataclass(slots=True)
class ClientConfig:
    """The connection-level settings every Shoal client takes, read from a Kafka-style config dict."""

    client_id: str = "shoal-python"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True
    request_timeout_ms: int = 30_000
    # Kafka's socket.connection.setup.timeout.ms: a broker that does not answer the connect (a host gone
    # without a reset) is given up on after this, not after the whole request timeout. As in Kafka, it
    # doubles with each failed attempt in a row, up to socket.connection.setup.timeout.max.ms.
    socket_connection_setup_timeout_ms: int = 10_000
    socket_connection_setup_timeout_max_ms: int = 30_000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1_000
    metadata_max_age_ms: int = 300_000
    # Kafka's default.api.timeout.ms: how long a read by offset keeps retrying a leader it cannot reach.
    default_api_timeout_ms: int = 60_000

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None, **overrides: Any) -> ClientConfig:
        out = cls()
        for key, value in (config or {}).items():
            if key == SSL_ENDPOINT_IDENTIFICATION:
                out.ssl_check_hostname = str(value).lower() == "https"
            elif key in CLIENT_KEYS:
                attr = CLIENT_KEYS[key]
                current = getattr(out, attr)
                setattr(out, attr, int(value) if isinstance(current, int) and not isinstance(current, bool) else value)
            else:
                raise ValueError(f"unknown client config {key!r}")
        for attr, value in overrides.items():
            if value is not None:
                setattr(out, attr, value)
        out.security_protocol = out.security_protocol.upper()
        out.sasl_mechanism = out.sasl_mechanism.upper()
        if out.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security.protocol must be one of {SECURITY_PROTOCOLS}, not {out.security_protocol!r}")
        if out.uses_sasl:
            if out.sasl_mechanism not in SASL_MECHANISMS:
                raise ValueError(f"sasl.mechanism must be one of {SASL_MECHANISMS}, not {out.sasl_mechanism!r}")
            if out.sasl_username is None or out.sasl_password is None:
                raise ValueError("SASL needs sasl.username and sasl.password")
        return out

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_ssl:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_ca_location)
        ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certificate_location:
            ctx.load_cert_chain(self.ssl_certificate_location, self.ssl_key_location, self.ssl_key_password)
        return ctx


class SaslExchange:
    """One client side of a SASL mechanism: `first()` gives the initial bytes, `step()` answers each challenge."""

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, challenge: bytes) -> bytes | None:
        """The next client message, or None when the exchange is complete."""
        raise NotImplementedError


class PlainExchange(SaslExchange):
    def __init__(self, username: str, password: str):
        self.username = username
        self.password = password

    def first(self) -> bytes:
        # RFC 4616: authzid NUL authcid NUL passwd (empty authzid).
        return b"\x00" + self.username.encode() + b"\x00" + self.password.encode()

    def step(self, challenge: bytes) -> bytes | None:
        return None


class ScramExchange(SaslExchange):
    """RFC 5802 SCRAM client without channel binding, as Kafka's SCRAM-SHA-256/512 use it."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None):
        self.hash_name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.username = username
        self.password = password
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self._client_first_bare = ""
        self._server_signature = b""
        self._state = 0

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash_name).digest()

    def first(self) -> bytes:
        user = self.username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={user},r={self.nonce}"
        self._state = 1
        return ("n,," + self._client_first_bare).encode()

    def step(self, challenge: bytes) -> bytes | None:
        if self._state == 1:
            self._state = 2
            return self._client_final(challenge.decode())
        if self._state == 2:
            self._state = 3
            attrs = _scram_attrs(challenge.decode())
            if "e" in attrs:
                raise AuthenticationError(None, f"SCRAM server error: {attrs['e']}")
            if not hmac.compare_digest(base64.b64decode(attrs.get("v", "")), self._server_signature):
                raise AuthenticationError(None, "SCRAM server signature does not match")
            return None
        raise AuthenticationError(None, "unexpected SCRAM challenge")

    def _client_final(self, server_first: str) -> bytes:
        attrs = _scram_attrs(server_first)
        nonce = attrs.get("r", "")
        if not nonce.startswith(self.nonce):
            raise AuthenticationError(None, "SCRAM server nonce does not extend the client nonce")
        salt = base64.b64decode(attrs["s"])
        iterations = int(attrs["i"])
        salted = hashlib.pbkdf2_hmac(self.hash_name, self.password.encode(), salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        without_proof = f"c=biws,r={nonce}"  # biws = base64("n,,")
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _scram_attrs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def sasl_exchange(config: ClientConfig) -> SaslExchange:
    assert config.sasl_username is not None and config.sasl_password is not None
    if config.sasl_mechanism == "PLAIN":
        return PlainExchange(config.sasl_username, config.sasl_password)
    return ScramExchange(config.sasl_mechanism, config.sasl_username, config.sasl_password)
