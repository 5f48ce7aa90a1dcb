"""SCRAM-SHA-256/512 (RFC 5802, RFC 7677): the stored credentials and the server side of the exchange.

The broker never sees a password: AlterUserScramCredentials carries (salt, iterations, SaltedPassword),
from which only StoredKey and ServerKey are kept, in one JSON file in the data directory.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("shoal.scram")

FILE_NAME = "shoal-scram-credentials.json"
# Kafka's ScramMechanism codes on the wire, and the hash each uses.
MECHANISMS: dict[str, tuple[int, str]] = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
MECHANISM_BY_CODE: dict[int, str] = {code: name for name, (code, _) in MECHANISMS.items()}
# Kafka's accepted iteration range for SCRAM credentials.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


class AuthenticationFailed(Exception):
    """The client failed to prove who it is; `str()` goes to the client, `reason` only to the log."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802, which is PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism][1], password, salt, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    hash_name = MECHANISMS[mechanism][1]
    client_key = _hmac(hash_name, salted, b"Client Key")
    stored_key = hashlib.new(hash_name, client_key).digest()
    server_key = _hmac(hash_name, salted, b"Server Key")
    return ScramCredential(salt, stored_key, server_key, iterations)


class ScramCredentialStore:
    """(user, mechanism) -> credential; every change is on disk before it is acknowledged."""

    def __init__(self, data_dir: Path):
        self.path = data_dir / FILE_NAME
        self._creds: dict[tuple[str, str], ScramCredential] = {}
        if self.path.exists():
            for e in json.loads(self.path.read_text())["credentials"]:
                self._creds[(e["user"], e["mechanism"])] = ScramCredential(
                    base64.b64decode(e["salt"]), base64.b64decode(e["stored_key"]),
                    base64.b64decode(e["server_key"]), int(e["iterations"]),
                )

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._creds.get((user, mechanism))

    def users(self) -> list[str]:
        return sorted({user for user, _ in self._creds})

    def mechanisms_of(self, user: str) -> list[tuple[str, int]]:
        return sorted((mech, cred.iterations) for (u, mech), cred in self._creds.items() if u == user)

    def apply(self, deletions: Iterable[tuple[str, str]], upserts: Iterable[tuple[str, str, ScramCredential]]) -> None:
        updated = dict(self._creds)
        for key in deletions:
            updated.pop(key, None)
        for user, mech, cred in upserts:
            updated[(user, mech)] = cred
        self._save(updated)
        self._creds = updated

    def _save(self, creds: dict[tuple[str, str], ScramCredential]) -> None:
        doc = {
            "credentials": [
                {
                    "user": user,
                    "mechanism": mech,
                    "salt": base64.b64encode(c.salt).decode(),
                    "stored_key": base64.b64encode(c.stored_key).decode(),
                    "server_key": base64.b64encode(c.server_key).decode(),
                    "iterations": c.iterations,
                }
                for (user, mech), c in creds.items()
            ]
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        # Derived keys allow impersonation by a broker-side attacker only, but keep them private anyway.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _attributes(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ValueError(f"malformed SCRAM attribute {part!r}")
        out.append((key, value))
    return out


def _decode_saslname(name: str) -> str:
    # RFC 5802 escapes ',' and '=' in user names as =2C and =3D; any other '=' is malformed.
    out = name.replace("=2C", ",").replace("=3D", "=")
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ValueError("malformed escaping in SCRAM user name")
    return out


class ScramServer:
    """One SCRAM exchange: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: str, store: ScramCredentialStore):
        self.mechanism = mechanism
        self.hash_name = MECHANISMS[mechanism][1]
        self.store = store
        self.username: str | None = None
        self.complete = False
        self._state = "first"
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None

    def _fail(self, reason: str) -> AuthenticationFailed:
        self._state = "failed"
        return AuthenticationFailed(
            f"Authentication failed during authentication due to invalid credentials with SASL mechanism "
            f"{self.mechanism}",
            reason,
        )

    def evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("SCRAM message is not UTF-8") from None
        if self._state == "first":
            return self._client_first(text)
        if self._state == "final":
            return self._client_final(text)
        raise self._fail(f"unexpected SCRAM message in state {self._state}")

    def _client_first(self, text: str) -> bytes:
        cbind, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if cbind not in ("n", "y"):
            raise self._fail("channel binding is not supported")
        try:
            attrs = _attributes(bare)
            if attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
                raise ValueError("client-first-message must start with n=<user>,r=<nonce>")
            user = _decode_saslname(attrs[0][1])
        except (ValueError, IndexError) as exc:
            raise self._fail(f"malformed client-first-message: {exc}") from None
        extensions = dict(attrs[2:])
        if extensions.get("tokenauth", "false").lower() == "true":
            raise self._fail("delegation-token authentication is not supported")
        if authzid and authzid != "a=" + attrs[0][1]:
            raise self._fail("authorization id differs from the user name")
        credential = self.store.get(user, self.mechanism)
        if credential is None:
            raise self._fail(f"no {self.mechanism} credential for user {user!r}")
        self.username = user
        self._credential = credential
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._nonce = attrs[1][1] + secrets.token_urlsafe(24)
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise self._fail("client-final-message has no proof")
        try:
            attrs = dict(_attributes(without_proof))
            proof = base64.b64decode(proof_b64, validate=True)
            binding = base64.b64decode(attrs.get("c", ""), validate=True)
        except ValueError as exc:
            raise self._fail(f"malformed client-final-message: {exc}") from None
        if binding != self._gs2_header.encode():
            raise self._fail("channel-binding data does not match the gs2 header")
        if attrs.get("r") != self._nonce:
            raise self._fail("nonce does not match the server nonce")
        credential = self._credential
        assert credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self.hash_name, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise self._fail("client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.hash_name, client_key).digest(), credential.stored_key):
            raise self._fail("client proof does not match the stored credential (wrong password)")
        server_signature = _hmac(self.hash_name, credential.server_key, auth_message)
        self._state = "done"
        self.complete = True
        return b"v=" + base64.b64encode(server_signature)
