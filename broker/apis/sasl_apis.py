"""SaslHandshake and SaslAuthenticate: drive a connection's `SaslSession` (see security/sasl.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.sasl import (
    AUTHENTICATED,
    AUTHENTICATING,
    HANDSHAKE,
    SASL_PROTOCOLS,
    MechanismServer,
    PlainServer,
    log_failure,
    log_success,
    plain_users,
)
from shoal.broker.security.scram import MECHANISMS as SCRAM_MECHANISMS
from shoal.broker.security.scram import AuthenticationFailed, ScramServer
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.sasl")

SaslHandshakeResponse = messages.SaslHandshakeResponse
SaslAuthenticateResponse = messages.SaslAuthenticateResponse


class SaslApis:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._plain_users: dict[str, dict[str, str]] = {}
        for lst in broker.config.listeners():
            if lst.security_protocol in SASL_PROTOCOLS:
                # Parsed once at start-up so a bad JAAS line fails the start, not the first login.
                self._plain_users[lst.name] = plain_users(broker.config, lst.name)

    def _enabled(self, listener_name: str) -> list[str]:
        return list(self.broker.config.for_listener(listener_name, "sasl.enabled.mechanisms"))

    def _server_for(self, listener_name: str, mechanism: str) -> MechanismServer:
        if mechanism == "PLAIN":
            return PlainServer(self._plain_users.get(listener_name, {}))
        assert mechanism in SCRAM_MECHANISMS
        return ScramServer(mechanism, self.broker.scram_credentials)

    def sasl_handshake(self, ctx: RequestContext, req: messages.SaslHandshakeRequest) -> messages.SaslHandshakeResponse:
        conn = ctx.connection
        session = conn.sasl
        if session is None:
            # Kafka answers a handshake on a listener without SASL this way.
            return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
        enabled = self._enabled(session.listener_name)
        if session.state not in (HANDSHAKE, AUTHENTICATED):
            log.warning("unexpected SaslHandshake, closing connection", state=session.state, client=conn.client_host)
            ctx.close_after_response()
            return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=enabled)
        if req.mechanism not in enabled:
            log.warning("unsupported SASL mechanism requested, closing connection", mechanism=req.mechanism,
                        enabled=enabled, client=conn.client_host, listener=session.listener_name)
            ctx.close_after_response()
            return SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
        if session.authenticated and req.mechanism != session.mechanism:
            log.warning("re-authentication with a different SASL mechanism, closing connection",
                        mechanism=req.mechanism, previous=session.mechanism, client=conn.client_host)
            ctx.close_after_response()
            return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=enabled)
        session.begin(req.mechanism, self._server_for(session.listener_name, req.mechanism), ctx.api_version == 0)
        return SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=enabled)

    def sasl_authenticate(self, ctx: RequestContext, req: messages.SaslAuthenticateRequest) -> messages.SaslAuthenticateResponse:
        conn = ctx.connection
        session = conn.sasl
        if session is None or session.state != AUTHENTICATING or session.raw_tokens:
            log.warning("unexpected SaslAuthenticate, closing connection", client=conn.client_host,
                        state=None if session is None else session.state)
            ctx.close_after_response()
            return SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                            error_message="SaslAuthenticate without a preceding SaslHandshake",
                                            auth_bytes=b"")
        try:
            challenge = session.evaluate(req.auth_bytes)
        except AuthenticationFailed as exc:
            log_failure(conn.client_host, session, exc)
            ctx.close_after_response()
            return SaslAuthenticateResponse(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=str(exc),
                                            auth_bytes=b"")
        lifetime = 0
        if session.state == AUTHENTICATED:
            conn.principal = session.principal or conn.principal
            log_success(conn.client_host, session)
            lifetime = session.lifetime_ms
        return SaslAuthenticateResponse(error_code=ErrorCode.NONE, error_message=None, auth_bytes=challenge,
                                        session_lifetime_ms=lifetime)



def register(broker: Broker) -> SaslApis:
    h = SaslApis(broker)
    broker.register(ApiKey.SASL_HANDSHAKE, 0, 1, h.sasl_handshake)
    broker.register(ApiKey.SASL_AUTHENTICATE, 0, 2, h.sasl_authenticate)
    return h
