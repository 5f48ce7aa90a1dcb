"""The single authorization seam: every handler asks it about (operation, resource) pairs.

Only the allow-all authorizer exists today; an ACL-backed one can replace it without touching handlers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol


class Operation(IntEnum):
    # Numbers as in Kafka's AclOperation, so they can go on the wire unchanged.
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


class ResourceType(IntEnum):
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


ANONYMOUS = Principal("User", "ANONYMOUS")


class Authorizer(Protocol):
    def authorize(
        self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool: ...


class AllowAllAuthorizer:
    """The default for the embedded one-command broker: no ACLs, everything allowed."""

    def authorize(
        self, principal: Principal, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        return True
