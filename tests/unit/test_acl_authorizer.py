"""The ACL authorizer's rules (StandardAuthorizer semantics), the ACL filters and the durable store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal.broker.apis.acl_apis import AclFilter, InvalidAcl, binding_from_creation
from shoal.broker.security.acl_store import AclStore
from shoal.broker.security.authorizer import (
    AclAuthorizer,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
    parse_super_users,
)

ALICE = Principal("User", "alice")
BOB = Principal("User", "bob")
T, G = ResourceType.TOPIC, ResourceType.GROUP
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(rt: ResourceType, name: str, op: Operation, perm: Permission = ALLOW, pattern: PatternType = LIT,
        principal: str = "User:alice", host: str = "*") -> AclBinding:
    return AclBinding(rt, name, pattern, principal, host, op, perm)


def authorizer(tmp_path: Path, *acls: AclBinding, super_users: str = "", allow_if_none: bool = False) -> AclAuthorizer:
    store = AclStore(tmp_path)
    store.add(acls)
    return AclAuthorizer(store, parse_super_users(super_users), allow_if_none)


def test_literal_prefixed_and_wildcard(tmp_path: Path) -> None:
    a = authorizer(tmp_path, acl(T, "orders", Operation.READ), acl(T, "pay-", Operation.WRITE, pattern=PRE),
                   acl(G, "*", Operation.READ))
    assert a.authorize(ALICE, "10.0.0.1", Operation.READ, T, "orders")
    assert not a.authorize(ALICE, "10.0.0.1", Operation.READ, T, "orders2")
    assert a.authorize(ALICE, "h", Operation.WRITE, T, "pay-eu")
    assert not a.authorize(ALICE, "h", Operation.WRITE, T, "pay")
    assert a.authorize(ALICE, "h", Operation.READ, G, "any-group")
    assert not a.authorize(BOB, "h", Operation.READ, G, "any-group")
    # A TOPIC binding says nothing about another resource type of the same name.
    assert not a.authorize(ALICE, "h", Operation.READ, ResourceType.TRANSACTIONAL_ID, "orders")


def test_deny_wins_and_binds_only_its_operation(tmp_path: Path) -> None:
    a = authorizer(tmp_path, acl(T, "", Operation.ALL, pattern=PRE), acl(T, "secret", Operation.READ, DENY))
    assert not a.authorize(ALICE, "h", Operation.READ, T, "secret")
    assert a.authorize(ALICE, "h", Operation.WRITE, T, "secret")
    assert a.authorize(ALICE, "h", Operation.DESCRIBE, T, "secret")
    a.store.add([acl(T, "*", Operation.ALL, DENY, principal="User:*")])
    assert not a.authorize(ALICE, "h", Operation.WRITE, T, "public")


def test_implied_operations(tmp_path: Path) -> None:
    a = authorizer(tmp_path, acl(T, "t", Operation.WRITE), acl(T, "c", Operation.ALTER_CONFIGS))
    assert a.authorize(ALICE, "h", Operation.DESCRIBE, T, "t")
    assert not a.authorize(ALICE, "h", Operation.READ, T, "t")
    assert a.authorize(ALICE, "h", Operation.DESCRIBE_CONFIGS, T, "c")
    assert not a.authorize(ALICE, "h", Operation.DESCRIBE, T, "c")
    # DENY READ does not deny the DESCRIBE another ALLOW implies.
    a.store.add([acl(T, "t", Operation.READ, DENY)])
    assert a.authorize(ALICE, "h", Operation.DESCRIBE, T, "t")


def test_hosts_super_users_and_no_acl_rule(tmp_path: Path) -> None:
    a = authorizer(tmp_path, acl(T, "t", Operation.READ, host="10.0.0.1"), super_users="User:root; User:CN=a,O=b")
    assert a.authorize(ALICE, "10.0.0.1", Operation.READ, T, "t")
    assert not a.authorize(ALICE, "10.0.0.2", Operation.READ, T, "t")
    assert a.authorize(Principal("User", "CN=a,O=b"), "h", Operation.ALTER, ResourceType.CLUSTER, "kafka-cluster")
    assert a.authorize(Principal("User", "root"), "h", Operation.DELETE, T, "t")
    assert not a.authorize(BOB, "h", Operation.READ, T, "unnamed")
    lenient = authorizer(tmp_path / "l", acl(T, "t", Operation.READ), allow_if_none=True)
    assert lenient.authorize(BOB, "h", Operation.READ, T, "unnamed")
    # An ACL names "t", so the no-ACL rule no longer applies to it.
    assert not lenient.authorize(BOB, "h", Operation.READ, T, "t")


def test_authorize_any(tmp_path: Path) -> None:
    a = authorizer(tmp_path, acl(T, "x-", Operation.WRITE, pattern=PRE))
    assert a.authorize_any(ALICE, "h", Operation.WRITE, T)
    assert not a.authorize_any(BOB, "h", Operation.WRITE, T)
    a.store.add([acl(T, "x", Operation.WRITE, DENY, pattern=PRE)])
    assert not a.authorize_any(ALICE, "h", Operation.WRITE, T)


def test_store_is_durable_and_applied_in_place(tmp_path: Path) -> None:
    a = authorizer(tmp_path)
    assert not a.authorize(ALICE, "h", Operation.READ, T, "t")
    binding = acl(T, "t", Operation.READ)
    a.store.add([binding])
    assert a.authorize(ALICE, "h", Operation.READ, T, "t")
    assert list(AclStore(tmp_path)) == [binding]
    a.store.remove([binding])
    assert list(AclStore(tmp_path)) == []
    assert not a.authorize(ALICE, "h", Operation.READ, T, "t")


def creation(**kw: object) -> SimpleNamespace:
    base = dict(resource_type=2, resource_name="t", resource_pattern_type=3, principal="User:alice", host="*",
                operation=3, permission_type=3)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("bad", [
    {"resource_type": 1}, {"resource_pattern_type": 2}, {"operation": 1}, {"permission_type": 1},
    {"principal": "alice"}, {"resource_type": 4, "resource_name": "other"}, {"resource_name": ""}, {"operation": 99},
])
def test_invalid_creations_rejected(bad: dict[str, object]) -> None:
    binding_from_creation(creation())
    with pytest.raises(InvalidAcl):
        binding_from_creation(creation(**bad))


def acl_filter(**kw: object) -> AclFilter:
    base = dict(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                host_filter=None, operation=1, permission_type=1)
    return AclFilter(SimpleNamespace(**{**base, **kw}))


def test_filters() -> None:
    lit, pre, wild = acl(T, "orders", Operation.READ), acl(T, "ord", Operation.READ, pattern=PRE), acl(T, "*", Operation.READ)
    everything = [lit, pre, wild]
    assert [a for a in everything if acl_filter().matches(a)] == everything
    match = acl_filter(resource_type_filter=2, resource_name_filter="orders", pattern_type_filter=2)
    assert [a for a in everything if match.matches(a)] == everything
    exact = acl_filter(resource_name_filter="orders", pattern_type_filter=3)
    assert [a for a in everything if exact.matches(a)] == [lit]
    by_name_any_pattern = acl_filter(resource_name_filter="ord")
    assert [a for a in everything if by_name_any_pattern.matches(a)] == [pre]
    assert not acl_filter(principal_filter="User:bob").matches(lit)
    assert not acl_filter(permission_type=2).matches(lit)
