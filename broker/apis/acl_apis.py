"""CreateAcls, DescribeAcls and DeleteAcls: manage the bindings the ACL authorizer enforces.

Changes take effect for the very next request (the authorizer reads the same store). Changing ACLs
needs ALTER on the cluster, listing them DESCRIBE on the cluster, as in Kafka.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from shoal.broker.security.authorizer import (
    CLUSTER_NAME,
    WILDCARD,
    AclAuthorizer,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
)
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.acls")

CreateAclsResponse = messages.CreateAclsResponse
CreationResult = CreateAclsResponse.AclCreationResult
DescribeAclsResponse = messages.DescribeAclsResponse
DescribedResource = DescribeAclsResponse.DescribeAclsResource
AclDescription = DescribeAclsResponse.AclDescription
DeleteAclsResponse = messages.DeleteAclsResponse
FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = DeleteAclsResponse.DeleteAclsMatchingAcl

E = TypeVar("E", bound=Enum)

SECURITY_DISABLED_MESSAGE = "No Authorizer is configured on the broker (authorizer.class.name is empty)."


class InvalidAcl(ValueError):
    pass


def _enum(cls: type[E], value: int, what: str) -> E:
    try:
        return cls(value)
    except ValueError:
        raise InvalidAcl(f"unknown {what} {value}") from None


def binding_from_creation(c: messages.CreateAclsRequest.AclCreation) -> AclBinding:
    """Validate one AclCreation the way Kafka's AclControlManager does; raise InvalidAcl if it is not an ACL."""
    resource_type = _enum(ResourceType, c.resource_type, "resource type")
    pattern = _enum(PatternType, c.resource_pattern_type, "pattern type")
    operation = _enum(Operation, c.operation, "operation")
    permission = _enum(Permission, c.permission_type, "permission type")
    if resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
        raise InvalidAcl(f"Invalid resourceType {resource_type.name}")
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid patternType {pattern.name}")
    if operation in (Operation.ANY, Operation.UNKNOWN):
        raise InvalidAcl(f"Invalid operation {operation.name}")
    if permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAcl(f"Invalid permissionType {permission.name}")
    if not c.resource_name:
        raise InvalidAcl("Resource name must not be empty")
    if resource_type == ResourceType.CLUSTER and c.resource_name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if pattern == PatternType.PREFIXED and c.resource_name == WILDCARD:
        raise InvalidAcl("A PREFIXED pattern cannot be the wildcard '*'")
    try:
        Principal.parse(c.principal)
    except ValueError as exc:
        raise InvalidAcl(f"Could not parse principal from `{c.principal}` ({exc})") from None
    if not c.host:
        raise InvalidAcl("Host must not be empty; use '*' for any host")
    return AclBinding(resource_type, c.resource_name, pattern, c.principal, c.host, operation, permission)


class AclFilter:
    """Kafka's AclBindingFilter: null/ANY fields match everything; MATCH finds the ACLs that apply to a name."""

    def __init__(self, f: messages.DescribeAclsRequest | messages.DeleteAclsRequest.DeleteAclsFilter):
        self.resource_type = _enum(ResourceType, f.resource_type_filter, "resource type")
        self.name: str | None = f.resource_name_filter
        self.pattern = _enum(PatternType, f.pattern_type_filter, "pattern type")
        self.principal: str | None = f.principal_filter
        self.host: str | None = f.host_filter
        self.operation = _enum(Operation, f.operation, "operation")
        self.permission = _enum(Permission, f.permission_type, "permission type")
        if self.pattern == PatternType.UNKNOWN or self.resource_type == ResourceType.UNKNOWN:
            raise InvalidAcl("filter has an UNKNOWN resource or pattern type")
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            raise InvalidAcl("filter has an UNKNOWN operation or permission type")

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and acl.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation != Operation.ANY and acl.operation != self.operation:
            return False
        return self.permission == Permission.ANY or acl.permission == self.permission

    def _matches_pattern(self, acl: AclBinding) -> bool:
        if self.pattern == PatternType.MATCH:
            if self.name is None:
                return True
            if acl.pattern_type == PatternType.LITERAL:
                return acl.resource_name in (self.name, WILDCARD)
            return self.name.startswith(acl.resource_name)
        if self.pattern != PatternType.ANY and acl.pattern_type != self.pattern:
            return False
        return self.name is None or acl.resource_name == self.name


class AclApis:
    def __init__(self, broker: Broker):
        self.broker = broker

    def _authorizer(self) -> AclAuthorizer | None:
        authorizer = self.broker.authorizer
        return authorizer if isinstance(authorizer, AclAuthorizer) else None

    def create_acls(self, ctx: RequestContext, req: messages.CreateAclsRequest) -> messages.CreateAclsResponse:
        authorizer = self._authorizer()
        if authorizer is None:
            return CreateAclsResponse(results=[
                CreationResult(error_code=ErrorCode.SECURITY_DISABLED, error_message=SECURITY_DISABLED_MESSAGE)
                for _ in req.creations
            ])
        if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            return CreateAclsResponse(results=[
                CreationResult(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None)
                for _ in req.creations
            ])
        results, valid = [], []
        for creation in req.creations:
            try:
                valid.append(binding_from_creation(creation))
                results.append(CreationResult(error_code=ErrorCode.NONE, error_message=None))
            except InvalidAcl as exc:
                results.append(CreationResult(error_code=ErrorCode.INVALID_REQUEST, error_message=str(exc)))
        if valid:
            authorizer.store.add(valid)
            log.info("acls created", principal=str(ctx.principal), acls=[_render(a) for a in valid])
        return CreateAclsResponse(results=results)

    def describe_acls(self, ctx: RequestContext, req: messages.DescribeAclsRequest) -> messages.DescribeAclsResponse:
        authorizer = self._authorizer()
        if authorizer is None:
            return DescribeAclsResponse(error_code=ErrorCode.SECURITY_DISABLED,
                                        error_message=SECURITY_DISABLED_MESSAGE, resources=[])
        if not ctx.authorize(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return DescribeAclsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                        error_message="Cluster authorization failed.", resources=[])
        try:
            acl_filter = AclFilter(req)
        except InvalidAcl as exc:
            return DescribeAclsResponse(error_code=ErrorCode.INVALID_REQUEST, error_message=str(exc), resources=[])
        grouped: dict[tuple[int, str, int], list[Any]] = {}
        for acl in authorizer.store:
            if acl_filter.matches(acl):
                key = (int(acl.resource_type), acl.resource_name, int(acl.pattern_type))
                grouped.setdefault(key, []).append(
                    AclDescription(principal=acl.principal, host=acl.host, operation=int(acl.operation),
                                   permission_type=int(acl.permission))
                )
        resources = [
            DescribedResource(resource_type=rt, resource_name=name, pattern_type=pt, acls=acls)
            for (rt, name, pt), acls in grouped.items()
        ]
        return DescribeAclsResponse(error_code=ErrorCode.NONE, error_message=None, resources=resources)

    def delete_acls(self, ctx: RequestContext, req: messages.DeleteAclsRequest) -> messages.DeleteAclsResponse:
        authorizer = self._authorizer()
        if authorizer is None:
            return DeleteAclsResponse(filter_results=[
                FilterResult(error_code=ErrorCode.SECURITY_DISABLED, error_message=SECURITY_DISABLED_MESSAGE,
                             matching_acls=[])
                for _ in req.filters
            ])
        if not ctx.authorize(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            return DeleteAclsResponse(filter_results=[
                FilterResult(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None, matching_acls=[])
                for _ in req.filters
            ])
        results = []
        doomed: dict[AclBinding, None] = {}
        for f in req.filters:
            try:
                acl_filter = AclFilter(f)
            except InvalidAcl as exc:
                results.append(FilterResult(error_code=ErrorCode.INVALID_REQUEST, error_message=str(exc),
                                            matching_acls=[]))
                continue
            # An ACL matched by an earlier filter in the same request is reported there only.
            matched = [a for a in authorizer.store if acl_filter.matches(a) and a not in doomed]
            doomed.update((a, None) for a in matched)
            results.append(FilterResult(error_code=ErrorCode.NONE, error_message=None, matching_acls=[
                MatchingAcl(error_code=ErrorCode.NONE, error_message=None, resource_type=int(a.resource_type),
                            resource_name=a.resource_name, pattern_type=int(a.pattern_type), principal=a.principal,
                            host=a.host, operation=int(a.operation), permission_type=int(a.permission))
                for a in matched
            ]))
        if doomed:
            authorizer.store.remove(doomed)
            log.info("acls deleted", principal=str(ctx.principal), acls=[_render(a) for a in doomed])
        return DeleteAclsResponse(filter_results=results)


def _render(acl: AclBinding) -> str:
    return (
        f"{acl.permission.name} {acl.principal}@{acl.host} {acl.operation.name} "
        f"{acl.resource_type.name}:{acl.pattern_type.name}:{acl.resource_name}"
    )


def register(broker: Broker) -> AclApis:
    h = AclApis(broker)
    broker.register(ApiKey.DESCRIBE_ACLS, 1, 3, h.describe_acls)
    broker.register(ApiKey.CREATE_ACLS, 1, 3, h.create_acls)
    broker.register(ApiKey.DELETE_ACLS, 1, 3, h.delete_acls)
    return h
