"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): manage SCRAM users.

Describing needs DESCRIBE on the cluster, altering ALTER on the cluster, as in Kafka. Errors follow
Kafka's: duplicate users in one request, unknown mechanisms, iteration counts outside 4096..16384,
deleting or describing a credential that does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_BY_CODE,
    MECHANISMS,
    MIN_ITERATIONS,
    credential_from_salted_password,
)
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.scram")

DescribeResponse = messages.DescribeUserScramCredentialsResponse
DescribeResult = DescribeResponse.DescribeUserScramCredentialsResult
CredentialInfo = DescribeResponse.CredentialInfo
AlterResponse = messages.AlterUserScramCredentialsResponse
AlterResult = AlterResponse.AlterUserScramCredentialsResult
AlterRequest = messages.AlterUserScramCredentialsRequest
_Alteration = AlterRequest.ScramCredentialDeletion | AlterRequest.ScramCredentialUpsertion

# Error codes newer than the shared ErrorCode table.
RESOURCE_NOT_FOUND = 91
DUPLICATE_RESOURCE = 92
UNACCEPTABLE_CREDENTIAL = 93


class ScramApis:
    def __init__(self, broker: Broker):
        self.broker = broker

    def describe(self, ctx: RequestContext, req: messages.DescribeUserScramCredentialsRequest) -> messages.DescribeUserScramCredentialsResponse:
        store = self.broker.scram_credentials
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return DescribeResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, results=[])
        names = [u.name for u in req.users] if req.users else store.users()
        counts: dict[str, int] = {}
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        results = []
        for name in dict.fromkeys(names):
            if counts[name] > 1:
                results.append(DescribeResult(user=name, error_code=DUPLICATE_RESOURCE, credential_infos=[],
                                              error_message="Cannot describe SCRAM credentials for the same user "
                                                            "twice in a single request"))
                continue
            infos = store.mechanisms_of(name)
            if not infos:
                results.append(DescribeResult(user=name, error_code=RESOURCE_NOT_FOUND, credential_infos=[],
                                              error_message="Attempt to describe a user credential that does not exist"))
                continue
            results.append(DescribeResult(user=name, error_code=ErrorCode.NONE, error_message=None, credential_infos=[
                CredentialInfo(mechanism=MECHANISMS[mech][0], iterations=iterations) for mech, iterations in infos
            ]))
        return DescribeResponse(error_code=ErrorCode.NONE, error_message=None, results=results)

    def alter(self, ctx: RequestContext, req: messages.AlterUserScramCredentialsRequest) -> messages.AlterUserScramCredentialsResponse:
        store = self.broker.scram_credentials
        order = list(dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions]))
        if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            return AlterResponse(results=[
                AlterResult(user=name, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None)
                for name in order
            ])
        errors: dict[str, tuple[int, str]] = {}
        seen: dict[str, set[int]] = {}
        items: list[_Alteration] = [*req.deletions, *req.upsertions]
        for item in items:
            mechs = seen.setdefault(item.name, set())
            if item.mechanism in mechs:
                errors[item.name] = (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
            mechs.add(item.mechanism)
        deletions, upserts = [], []
        for d in req.deletions:
            problem = _check(d) or (
                None if store.get(d.name, MECHANISM_BY_CODE[d.mechanism]) is not None
                else (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
            )
            if problem is not None:
                errors.setdefault(d.name, problem)
            else:
                deletions.append((d.name, MECHANISM_BY_CODE[d.mechanism]))
        for u in req.upsertions:
            problem = _check(u)
            if problem is None and u.iterations < MIN_ITERATIONS:
                problem = (UNACCEPTABLE_CREDENTIAL, f"Too few iterations ({u.iterations}, at least {MIN_ITERATIONS})")
            if problem is None and u.iterations > MAX_ITERATIONS:
                problem = (UNACCEPTABLE_CREDENTIAL, f"Too many iterations ({u.iterations}, at most {MAX_ITERATIONS})")
            if problem is not None:
                errors.setdefault(u.name, problem)
                continue
            mech = MECHANISM_BY_CODE[u.mechanism]
            upserts.append((u.name, mech, credential_from_salted_password(mech, u.salt, u.salted_password, u.iterations)))
        # A user with any failed alteration has none of its alterations applied.
        deletions = [d for d in deletions if d[0] not in errors]
        upserts = [u for u in upserts if u[0] not in errors]
        if deletions or upserts:
            store.apply(deletions, upserts)
            log.info("scram credentials altered", principal=str(ctx.principal),
                     upserted=[f"{u}:{m}" for u, m, _ in upserts], deleted=[f"{u}:{m}" for u, m in deletions])
        return AlterResponse(results=[
            AlterResult(user=name, error_code=errors.get(name, (ErrorCode.NONE, None))[0],
                        error_message=errors.get(name, (ErrorCode.NONE, None))[1])
            for name in order
        ])


def _check(item: _Alteration) -> tuple[int, str] | None:
    if not item.name:
        return UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if item.mechanism not in MECHANISM_BY_CODE:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {item.mechanism}"
    return None


def register(broker: Broker) -> ScramApis:
    h = ScramApis(broker)
    broker.register(50, 0, 0, h.describe)  # DescribeUserScramCredentials
    broker.register(51, 0, 0, h.alter)  # AlterUserScramCredentials
    return h
