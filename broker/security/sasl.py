"""SASL on SASL_PLAINTEXT / SASL_SSL listeners: SaslHandshake (v0-1), SaslAuthenticate (v0-2), PLAIN and SCRAM.

Per connection a `SaslSession` tracks the exchange. Until it completes, the connection serves only
ApiVersions, SaslHandshake and SaslAuthenticate (the connection enforces that). With handshake v1 the
mechanism's tokens travel inside SaslAuthenticate requests; with v0 they follow as bare size-prefixed
frames, which the connection hands to `SaslSession.evaluate` directly.
`connections.max.reauth.ms` gives each session a lifetime (KIP-368): the client re-authenticates with a
new handshake on the same connection, as the same principal, or the connection is closed.
"""

from __future__ import annotations

import hmac
import re
import time
from typing import TYPE_CHECKING, Protocol

import structlog

from shoal.protocol.api_keys import ApiKey

from .authorizer import Principal
from .scram import AuthenticationFailed

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig

log = structlog.get_logger("shoal.sasl")


SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
# What an unauthenticated client may send on a SASL listener.
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
# What a client whose session has expired may still send: the re-authentication itself.
REAUTH_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.\-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """`<LoginModule class> <flag> key="value" ...;` -> (class, options). Only the first module is read."""
    body = text.strip()
    if not body:
        return "", {}
    parts = body.split(None, 2)
    if len(parts) < 2:
        raise ValueError(f"JAAS config must be '<LoginModule> <flag> options;', got {text!r}")
    module, flag = parts[0], parts[1].rstrip(";").lower()
    if flag not in ("required", "requisite", "sufficient", "optional"):
        raise ValueError(f"JAAS control flag must be required/requisite/sufficient/optional, got {parts[1]!r}")
    rest = parts[2] if len(parts) > 2 else ""
    options = {}
    for match in _JAAS_OPTION.finditer(rest):
        key, quoted, bare = match.groups()
        options[key] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return module, options


class MechanismServer(Protocol):
    username: str | None
    complete: bool

    def evaluate(self, token: bytes) -> bytes: ...


class PlainServer:
    """RFC 4616: one message `authzid NUL authcid NUL password`, checked against the JAAS `user_<name>` options."""

    def __init__(self, users: dict[str, str]):
        self._users = users
        self.username: str | None = None
        self.complete = False

    def evaluate(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens", "malformed PLAIN message")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8", "malformed PLAIN message") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified", "empty user name")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified", f"empty password for {user!r}")
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username",
                f"authorization id {authzid!r} for user {user!r}",
            )
        expected = self._users.get(user)
        # compare_digest on both branches so the reply time does not reveal which users exist.
        ok = hmac.compare_digest(password.encode(), (expected if expected is not None else "\x00" + password).encode())
        if expected is None or not ok:
            reason = "unknown user" if expected is None else "wrong password"
            raise AuthenticationFailed("Authentication failed: Invalid username or password", f"{reason} {user!r}")
        self.username = user
        self.complete = True
        return b""


HANDSHAKE, AUTHENTICATING, AUTHENTICATED, FAILED = "handshake", "authenticating", "authenticated", "failed"


class SaslSession:
    """SASL state of one connection on a SASL listener."""

    def __init__(self, listener_name: str, reauth_ms: int):
        self.listener_name = listener_name
        self.reauth_ms = reauth_ms
        self.state = HANDSHAKE
        self.mechanism: str | None = None
        self.server: MechanismServer | None = None
        # Handshake v0: the tokens come as bare frames, not inside SaslAuthenticate.
        self.raw_tokens = False
        self.authenticated = False
        self.principal: Principal | None = None
        self.expires_at: float | None = None
        self.lifetime_ms = 0

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def begin(self, mechanism: str, server: MechanismServer, raw_tokens: bool) -> None:
        self.mechanism = mechanism
        self.server = server
        self.raw_tokens = raw_tokens
        self.state = AUTHENTICATING

    def evaluate(self, token: bytes) -> bytes:
        """Run one token through the mechanism; raises AuthenticationFailed (and the session is failed)."""
        server = self.server
        assert server is not None and self.state == AUTHENTICATING
        try:
            challenge = server.evaluate(token)
            if server.complete:
                assert server.username is not None
                principal = Principal("User", server.username)
                if self.authenticated and principal != self.principal:
                    raise AuthenticationFailed(
                        "Cannot change principals during re-authentication",
                        f"re-authentication as {principal} on a connection of {self.principal}",
                    )
                self._complete(principal)
        except AuthenticationFailed:
            self.state = FAILED
            self.raw_tokens = False
            raise
        return challenge

    def _complete(self, principal: Principal) -> None:
        self.principal = principal
        self.authenticated = True
        self.state = AUTHENTICATED
        self.raw_tokens = False
        self.server = None
        if self.reauth_ms > 0:
            self.lifetime_ms = self.reauth_ms
            self.expires_at = time.monotonic() + self.reauth_ms / 1000
        else:
            self.lifetime_ms = 0
            self.expires_at = None


def plain_users(config: BrokerConfig, listener_name: str) -> dict[str, str]:
    _, options = parse_jaas(config.jaas_config(listener_name, "PLAIN"))
    return {key[len("user_") :]: value for key, value in options.items() if key.startswith("user_")}


def log_failure(client: str, session: SaslSession, exc: AuthenticationFailed) -> None:
    log.warning("SASL authentication failed", client=client, listener=session.listener_name,
                mechanism=session.mechanism, reason=exc.reason, error=str(exc))


def log_success(client: str, session: SaslSession) -> None:
    log.info("SASL authentication succeeded", client=client, listener=session.listener_name,
             mechanism=session.mechanism, principal=str(session.principal), session_lifetime_ms=session.lifetime_ms)
