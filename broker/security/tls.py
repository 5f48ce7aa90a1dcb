"""TLS for SSL and SASL_SSL listeners: the server context from Kafka's `ssl.*` keys, a memory-BIO TLS
session per connection, and the principal Kafka derives from a client certificate.

TLS runs inside the connection rather than through the event loop's own SSL support because uvloop
drops handshake failures silently; here a refused certificate or a plaintext client on a TLS port is
logged with the client's address and the reason.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from typing import Any

from shoal.broker.common.config import BrokerConfig, ConfigError

from .authorizer import Principal

_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
_READ_CHUNK = 256 * 1024


def normalize_pem(text: str) -> str:
    """Re-wrap PEM blocks; inline PEM in a properties file often loses its line breaks to `\\` joins."""
    blocks = []
    for label, body in _PEM_BLOCK.findall(text):
        b64 = "".join(body.split())
        lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
        blocks.append("\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"]))
    if not blocks:
        raise ConfigError("no PEM block found in inline certificate or key")
    return "\n".join(blocks) + "\n"


def server_context(config: BrokerConfig, listener_name: str) -> ssl.SSLContext:
    """The server-side context for one listener, honouring `listener.name.<l>.ssl.*` overrides."""

    def get(key: str) -> Any:
        return config.for_listener(listener_name, key)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = []
    for name in get("ssl.enabled.protocols"):
        if name not in _TLS_VERSIONS:
            raise ConfigError(f"ssl.enabled.protocols: {name} is not supported (use TLSv1.2, TLSv1.3)")
        versions.append(_TLS_VERSIONS[name])
    if not versions:
        raise ConfigError("ssl.enabled.protocols must name at least one protocol")
    ctx.minimum_version, ctx.maximum_version = min(versions), max(versions)
    password = get("ssl.key.password") or None
    location, chain, key = get("ssl.keystore.location"), get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    try:
        if location:
            # One PEM file with the chain and the key, as Kafka's PEM keystore file.
            ctx.load_cert_chain(location, password=password)
        elif chain and key:
            _load_inline_chain(ctx, normalize_pem(chain), normalize_pem(key), password)
        else:
            raise ConfigError(
                f"listener {listener_name} uses TLS but neither ssl.keystore.location nor "
                "ssl.keystore.certificate.chain with ssl.keystore.key is set"
            )
        truststore, inline_ca = get("ssl.truststore.location"), get("ssl.truststore.certificates")
        if truststore:
            ctx.load_verify_locations(cafile=truststore)
        elif inline_ca:
            ctx.load_verify_locations(cadata=normalize_pem(inline_ca))
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"listener {listener_name}: cannot load TLS key material: {exc}") from exc
    ctx.verify_mode = _CLIENT_AUTH[str(get("ssl.client.auth"))]
    return ctx


def _load_inline_chain(ctx: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    # The ssl module loads key material from files only; a private directory keeps the key unreadable to others.
    with tempfile.TemporaryDirectory(prefix="shoal-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "chain.pem"), os.path.join(tmp, "key.pem")
        for path, text in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
        ctx.load_cert_chain(cert_path, key_path, password=password)


# OpenSSL's long attribute names -> the keywords Java's X500Principal.getName() (RFC 2253) prints.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# Attributes Java prints as OID=#<hex of the DER value>: (OID, DER string tag).
_RFC2253_BY_OID = {"emailAddress": ("1.2.840.113549.1.9.1", 0x16), "serialNumber": ("2.5.4.5", 0x13)}


def _escape_rfc2253(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _der_hex(tag: int, value: str) -> str:
    raw = value.encode()
    if len(raw) < 0x80:
        length = bytes([len(raw)])
    else:
        size = len(raw).to_bytes((len(raw).bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(size)]) + size
    return "#" + (bytes([tag]) + length + raw).hex()


def rfc2253_name(subject: Any) -> str:
    """The subject as Java's X500Principal.getName() renders it: most specific RDN first, comma separated."""
    rdns = []
    for rdn in reversed(subject):
        parts = []
        for attr, value in rdn:
            if attr in _RFC2253_KEYWORDS:
                parts.append(f"{_RFC2253_KEYWORDS[attr]}={_escape_rfc2253(value)}")
            elif attr in _RFC2253_BY_OID:
                oid, tag = _RFC2253_BY_OID[attr]
                parts.append(f"{oid}={_der_hex(tag, value)}")
            else:
                parts.append(f"{attr}={_escape_rfc2253(value)}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def principal_from_certificate(peercert: dict[str, Any] | None) -> Principal | None:
    """`User:<RFC 2253 subject>` for a verified client certificate; None when the client sent none."""
    if not peercert or "subject" not in peercert:
        return None
    return Principal("User", rfc2253_name(peercert["subject"]))


class TlsSession:
    """Server-side TLS over memory BIOs: ciphertext in, plaintext out, and the reverse for writes."""

    def __init__(self, context: ssl.SSLContext):
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshake_done = False
        self.peer_closed = False

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Feed ciphertext; returns (plaintext for the application, ciphertext to send back).

        Raises ssl.SSLError when the peer is not speaking TLS or fails the handshake (e.g. an untrusted
        client certificate); the caller logs and closes.
        """
        self._incoming.write(data)
        if not self.handshake_done:
            try:
                self._obj.do_handshake()
            except ssl.SSLWantReadError:
                return b"", self._outgoing.read()
            self.handshake_done = True
        chunks = []
        while True:
            try:
                chunk = self._obj.read(_READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), self._outgoing.read()

    def send(self, data: bytes | bytearray) -> bytes:
        view = memoryview(data)
        while view:
            written = self._obj.write(view)
            view = view[written:]
        return self._outgoing.read()

    def drain(self) -> bytes:
        """Ciphertext waiting to go out, such as the alert written when a handshake fails."""
        return self._outgoing.read()

    def peer_certificate(self) -> dict[str, Any] | None:
        return self._obj.getpeercert()

    def version(self) -> str | None:
        return self._obj.version()
