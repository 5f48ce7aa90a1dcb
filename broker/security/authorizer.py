"""The single authorization seam: every handler asks it about (operation, resource) pairs.

Two implementations: allow-all (the default, `authorizer.class.name` empty) and `AclAuthorizer`, which
follows the rules of Kafka's StandardAuthorizer: super users first, then DENY bindings, then ALLOW
bindings (with implied operations), and `allow.everyone.if.no.acl.found` when no binding names the
resource at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator


class Operation(IntEnum):
    # Numbers as in Kafka's AclOperation, so they can go on the wire unchanged.
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class ResourceType(IntEnum):
    # Kafka's ResourceType codes.
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    # Kafka's PatternType codes; ANY and MATCH only appear in filters.
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# An ALLOW for any of these also allows DESCRIBE (Kafka's AclEntry implied operations).
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.ALTER_CONFIGS})

STANDARD_AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)


@dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """`User:alice` -> Principal("User", "alice"); the name may itself contain colons and commas."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal must look like Type:name, got {text!r}")
        return cls(kind, name)


ANONYMOUS = Principal("User", "ANONYMOUS")


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: who (principal, host) may or may not do what (operation) to which resources (pattern)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name == name or self.resource_name == WILDCARD
        return name.startswith(self.resource_name)


class Authorizer(Protocol):
    def authorize(
        self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool: ...

    def authorize_any(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """True if the principal may perform `operation` on at least one resource of the type."""
        ...


class AllowAllAuthorizer:
    """The default for the embedded one-command broker: no ACLs, everything allowed."""

    acls_enabled = False

    def authorize(
        self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        return True

    def authorize_any(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        return True


def parse_super_users(text: str) -> frozenset[str]:
    # Semicolon separated because SSL principals (`User:CN=a,O=b`) contain commas.
    return frozenset(part.strip() for part in text.split(";") if part.strip())


class AclBindings(Protocol):
    """The ACL bindings an `AclAuthorizer` reads and CreateAcls/DeleteAcls change (acl_store.AclStore)."""

    def for_resource_type(self, resource_type: ResourceType) -> list[AclBinding]: ...

    def __iter__(self) -> Iterator[AclBinding]: ...

    def add(self, bindings: Iterable[AclBinding]) -> None: ...

    def remove(self, bindings: Iterable[AclBinding]) -> None: ...


class AclAuthorizer:
    """StandardAuthorizer semantics over an `AclStore` that CreateAcls/DeleteAcls change in place."""

    acls_enabled = True

    def __init__(self, store: AclBindings, super_users: Iterable[str] = (), allow_if_no_acl: bool = False):
        self.store = store
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl

    def authorize(
        self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        who = str(principal)
        if who in self.super_users:
            return True
        found_any = False
        allowed = False
        for acl in self.store.for_resource_type(resource_type):
            if not acl.matches_resource(resource_type, name):
                continue
            found_any = True
            if acl.principal not in (who, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                continue
            if acl.permission == Permission.DENY:
                # DENY binds only its own operation (or ALL); it wins over any ALLOW.
                if acl.operation in (operation, Operation.ALL):
                    return False
            elif _allow_covers(acl.operation, operation):
                allowed = True
        if allowed:
            return True
        return not found_any and self.allow_if_no_acl

    def authorize_any(self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: some ALLOW for the type that no matching DENY fully covers."""
        who = str(principal)
        if who in self.super_users:
            return True
        relevant = [
            acl
            for acl in self.store.for_resource_type(resource_type)
            if acl.principal in (who, WILDCARD_PRINCIPAL) and acl.host in (host, WILDCARD)
        ]
        denies = [a for a in relevant if a.permission == Permission.DENY and a.operation in (operation, Operation.ALL)]
        if any(d.pattern_type == PatternType.LITERAL and d.resource_name == WILDCARD for d in denies):
            return False
        for acl in relevant:
            if acl.permission != Permission.ALLOW or not _allow_covers(acl.operation, operation):
                continue
            if not any(_covers(d, acl) for d in denies):
                return True
        if self.allow_if_no_acl and not any(True for _ in self.store.for_resource_type(resource_type)):
            return True
        return False


def _allow_covers(granted: Operation, wanted: Operation) -> bool:
    if granted in (wanted, Operation.ALL):
        return True
    if wanted == Operation.DESCRIBE and granted in IMPLIES_DESCRIBE:
        return True
    return wanted == Operation.DESCRIBE_CONFIGS and granted in IMPLIES_DESCRIBE_CONFIGS


def _covers(deny: AclBinding, allow: AclBinding) -> bool:
    """Whether every resource the ALLOW pattern names is also named by the DENY pattern."""
    if deny.pattern_type == PatternType.PREFIXED:
        return allow.resource_name.startswith(deny.resource_name)
    return allow.pattern_type == PatternType.LITERAL and allow.resource_name == deny.resource_name
