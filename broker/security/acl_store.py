"""ACL bindings kept in memory for the authorizer and in one JSON file in the data directory.

Every change rewrites the file (temp file, fsync, rename) before it is acknowledged, so an ACL a client
was told exists survives a crash; ACL sets are small enough that a full rewrite is the simple choice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.config import ConfigError

from .authorizer import (
    STANDARD_AUTHORIZER_CLASSES,
    AclAuthorizer,
    AclBinding,
    AllowAllAuthorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    parse_super_users,
)

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig

log = structlog.get_logger("shoal.acls")

FILE_NAME = "shoal-acls.json"


class AclStore:
    def __init__(self, data_dir: Path):
        self.path = data_dir / FILE_NAME
        # Insertion-ordered, so DescribeAcls lists bindings in the order they were created.
        self._bindings: dict[AclBinding, None] = {}
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        for entry in json.loads(self.path.read_text())["acls"]:
            self._bindings[
                AclBinding(
                    ResourceType(entry["resource_type"]),
                    entry["resource_name"],
                    PatternType(entry["pattern_type"]),
                    entry["principal"],
                    entry["host"],
                    Operation(entry["operation"]),
                    Permission(entry["permission"]),
                )
            ] = None
        self._reindex()
        log.info("acls loaded", count=len(self._bindings))

    def _reindex(self) -> None:
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in self._bindings:
            by_type.setdefault(acl.resource_type, []).append(acl)
        # Swapped in whole: authorizer calls never see a half-built index.
        self._by_type = by_type

    def _save(self, bindings: dict[AclBinding, None]) -> None:
        doc = {
            "acls": [
                {
                    "resource_type": int(a.resource_type),
                    "resource_name": a.resource_name,
                    "pattern_type": int(a.pattern_type),
                    "principal": a.principal,
                    "host": a.host,
                    "operation": int(a.operation),
                    "permission": int(a.permission),
                }
                for a in bindings
            ]
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def for_resource_type(self, resource_type: ResourceType) -> list[AclBinding]:
        return self._by_type.get(resource_type, [])

    def __iter__(self) -> Iterator[AclBinding]:
        return iter(list(self._bindings))

    def __len__(self) -> int:
        return len(self._bindings)

    def add(self, bindings: Iterable[AclBinding]) -> None:
        updated = dict(self._bindings)
        updated.update((acl, None) for acl in bindings)
        self._replace(updated)

    def remove(self, bindings: Iterable[AclBinding]) -> None:
        updated = dict(self._bindings)
        for acl in bindings:
            updated.pop(acl, None)
        self._replace(updated)

    def _replace(self, updated: dict[AclBinding, None]) -> None:
        if list(updated) == list(self._bindings):
            return
        # Durable first: if the write fails the in-memory view (and so the authorizer) is unchanged.
        self._save(updated)
        self._bindings = updated
        self._reindex()


def build_authorizer(config: BrokerConfig, data_dir: Path) -> AllowAllAuthorizer | AclAuthorizer:
    """The authorizer `authorizer.class.name` asks for; ACLs live in the data directory."""
    class_name = str(config["authorizer.class.name"]).strip()
    if not class_name:
        return AllowAllAuthorizer()
    if class_name not in STANDARD_AUTHORIZER_CLASSES:
        raise ConfigError(
            f"authorizer.class.name {class_name!r} is not supported (use {STANDARD_AUTHORIZER_CLASSES[0]})"
        )
    return AclAuthorizer(
        AclStore(data_dir),
        parse_super_users(str(config["super.users"])),
        bool(config["allow.everyone.if.no.acl.found"]),
    )
