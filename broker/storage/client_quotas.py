"""Client quotas (KIP-546): stored, validated and described as Kafka's controller does, persisted in one small
JSON file. `security/client_quota_manager.py` enforces producer_byte_rate and consumer_byte_rate from here;
the other keys are kept for the admin APIs only, which is logged once when the first of them is set.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import structlog

from shoal.protocol.errors import shorten

log = structlog.get_logger("shoal.quotas")

FILE_NAME = "shoal-client-quotas.json"
USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

# Quota keys and their Kafka types (QuotaConfig): integral types refuse fractions.
_USER_CLIENT_KEYS = {"producer_byte_rate": "LONG", "consumer_byte_rate": "LONG",
                     "request_percentage": "DOUBLE", "controller_mutation_rate": "DOUBLE"}
_IP_KEYS = {"connection_creation_rate": "INT"}
# The keys this broker enforces (security/client_quota_manager.py).
ENFORCED_KEYS = frozenset({"producer_byte_rate", "consumer_byte_rate"})
_LIMITS = {"LONG": float(2**63 - 1), "INT": float(2**31 - 1)}

# An entity: each of its types with a name, None naming the type's default entity.
Entity = tuple[tuple[str, str | None], ...]


class QuotaRequestError(ValueError):
    """A request Kafka refuses as a whole; `unsupported` answers UNSUPPORTED_VERSION, else INVALID_REQUEST."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True, slots=True)
class QuotaOp:
    key: str
    value: float
    remove: bool


def _entity_key(entity: Entity) -> str:
    return json.dumps(sorted(entity, key=lambda e: e[0]))


def _valid_ip(name: str | None) -> bool:
    if name is None:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(name)  # the short IPv4 forms Java's InetAddress also reads
        return True
    except (OSError, ValueError):
        return False  # a host name would need a DNS lookup on the request path: refused


def validate_entity(entity: Entity) -> str | None:
    """Kafka's checks of an AlterClientQuotas entity, with its messages; None when valid."""
    if not entity:
        return "Invalid empty client quota entity"
    seen: set[str] = set()
    for entity_type, name in entity:
        if entity_type in seen:
            return f"Invalid client quota entity, duplicate entity entry {shorten(entity_type)}"
        seen.add(entity_type)
        if entity_type not in ENTITY_TYPES:
            return f"Unhandled client quota entity type: {shorten(entity_type)}"
        if name is not None and not name:
            return f"Empty {shorten(entity_type)} not supported"
    if IP in seen:
        if seen & {USER, CLIENT_ID}:
            return "Invalid quota entity combination, IP entity should not be combined with User or ClientId"
        ip = dict(entity)[IP]
        if not _valid_ip(ip):
            return f"{shorten(str(ip))} is not a valid IP or resolvable host."
    return None


def validate_op(entity: Entity, op: QuotaOp) -> str | None:
    if op.remove:
        return None
    keys = _IP_KEYS if any(t == IP for t, _n in entity) else _USER_CLIENT_KEYS
    kind = keys.get(op.key)
    if kind is None:
        return f"Invalid configuration key {shorten(op.key)}"
    if op.value <= 0.0:
        return f"Quota {op.key} must be greater than 0"
    if kind in _LIMITS:
        if op.value > _LIMITS[kind]:
            return f"Proposed value for {op.key} is too large for {'a' if kind == 'LONG' else 'an'} {kind}."
        if abs(op.value % 1.0) > 1e-6:
            return f"{op.key} cannot be a fractional value."
    return None


class ClientQuotaStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._quotas: dict[str, tuple[Entity, dict[str, float]]] = {}
        self._noted = False
        # Bumped on every change, so enforcement knows when its cached quota lookups are stale.
        self.generation = 0
        self._keys: set[str] = set()
        self._keys_generation = -1
        if self.path.exists():
            for item in json.loads(self.path.read_text())["quotas"]:
                entity: Entity = tuple((str(t), None if n is None else str(n)) for t, n in item["entity"])
                self._quotas[_entity_key(entity)] = (entity, {str(k): float(v) for k, v in item["values"].items()})

    def alter(self, entity: Entity, ops: list[QuotaOp], validate_only: bool) -> str | None:
        """Apply one entity's changes (all or none); the refusal's message, or None."""
        problem = validate_entity(entity)
        if problem is not None:
            return problem
        for op in ops:
            problem = validate_op(entity, op)
            if problem is not None:
                return problem
        if validate_only:
            return None
        key = _entity_key(entity)
        _entity, values = self._quotas.get(key, (entity, {}))
        values = dict(values)
        for op in ops:
            if op.remove:
                values.pop(op.key, None)
            else:
                values[op.key] = op.value
        if values:
            self._quotas[key] = (entity, values)
        else:
            self._quotas.pop(key, None)
        self._save()
        self.generation += 1
        unenforced = sorted(set(values) - ENFORCED_KEYS)
        if unenforced and not self._noted:
            self._noted = True
            log.info("client quotas stored and described but not enforced", keys=unenforced,
                     reason="this broker throttles only producer_byte_rate and consumer_byte_rate")
        return None

    def value(self, entity: Entity, key: str) -> float | None:
        """The quota `key` set on exactly this entity, or None."""
        found = self._quotas.get(_entity_key(entity))
        return None if found is None else found[1].get(key)

    def has_quota_key(self, key: str) -> bool:
        """Whether any entity has a quota for `key` (no sensor is kept for a key nobody has a quota for)."""
        if self._keys_generation != self.generation:
            self._keys = {k for _entity, values in self._quotas.values() for k in values}
            self._keys_generation = self.generation
        return key in self._keys

    def describe(self, components: list[tuple[str, int, str | None]], strict: bool) -> list[tuple[Entity, dict[str, float]]]:
        """Entities matching the filter, as Kafka's ClientQuotasImage matches them; raises QuotaRequestError."""
        exact: dict[str, str | None] = {}
        typed: set[str] = set()
        for entity_type, match_type, match in components:
            if not entity_type:
                raise QuotaRequestError("Invalid empty entity type.")
            if entity_type in exact or entity_type in typed:
                raise QuotaRequestError(f"Entity type {shorten(entity_type)} cannot appear more than once in the filter.")
            if entity_type not in ENTITY_TYPES:
                raise QuotaRequestError(f"Unsupported entity type {shorten(entity_type)}", unsupported=True)
            if match_type == MATCH_EXACT:
                if match is None:
                    raise QuotaRequestError("Request specified MATCH_TYPE_EXACT, but set match string to null.")
                exact[entity_type] = match
            elif match_type == MATCH_DEFAULT:
                if match is not None:
                    raise QuotaRequestError("Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
                exact[entity_type] = None
            elif match_type == MATCH_SPECIFIED:
                if match is not None:
                    raise QuotaRequestError("Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
                typed.add(entity_type)
            else:
                raise QuotaRequestError(f"Unknown match type {match_type}")
        wanted = set(exact) | typed
        if IP in wanted and wanted & {USER, CLIENT_ID}:
            raise QuotaRequestError("Invalid entity filter component combination. IP filter component should not "
                                    "be used with user or clientId filter component.")
        out = []
        for entity, values in self._quotas.values():
            names = dict(entity)
            if strict and len(names) != len(wanted):
                continue
            if all(t in names and names[t] == n for t, n in exact.items()) and all(t in names for t in typed):
                out.append((entity, dict(values)))
        return out

    def _save(self) -> None:
        doc = {"quotas": [{"entity": [list(e) for e in entity], "values": values}
                          for entity, values in self._quotas.values()]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
