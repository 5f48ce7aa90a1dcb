"""The message-spec model: Kafka's JSON message specs parsed into typed descriptions.

Nothing here encodes bytes; `codec.py` compiles these descriptions into functions.

`specs/` holds Kafka's specs and nothing of Shoal's. Shoal's own additions, tagged fields a Kafka peer
skips, live in `extensions/`, one file per message they extend, and are merged in when the specs are
loaded (by the codec at start-up and by `generate.py` alike); each merged field is marked `extension`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

SPEC_DIR = Path(__file__).parent / "specs"
EXTENSION_DIR = Path(__file__).parent / "extensions"
# Tags of Shoal's own fields start here, far above any tag Kafka gives out.
MIN_EXTENSION_TAG = 10000

PRIMITIVES = frozenset(
    {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string", "bytes", "records", "uuid"}
)


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; `high` None means open-ended ("3+")."""

    low: int
    high: int | None

    @staticmethod
    def parse(text: str | None) -> Versions:
        if text is None or text == "none" or text == "":
            return NO_VERSIONS
        if text.endswith("+"):
            return Versions(int(text[:-1]), None)
        if "-" in text:
            lo, hi = text.split("-")
            return Versions(int(lo), int(hi))
        return Versions(int(text), int(text))

    def __contains__(self, version: int) -> bool:
        if self.low < 0:
            return False
        return self.low <= version and (self.high is None or version <= self.high)


NO_VERSIONS = Versions(-1, -1)

_CAMEL_1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """Kafka's field names are CamelCase; Python attributes are snake_case (ThrottleTimeMs -> throttle_time_ms)."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()


@dataclass(slots=True)
class FieldSpec:
    name: str
    attr: str
    type: str  # element type for arrays, struct name for structs
    is_array: bool
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    default: Any
    flexible_override: Versions | None  # the header's ClientId stays a classic string in flexible versions
    struct: StructSpec | None = None
    # A tagged field of Shoal's own ("shoalExtension"): Kafka's spec lacks it, and its brokers skip it.
    extension: bool = False


@dataclass(slots=True)
class StructSpec:
    name: str
    fields: list[FieldSpec] = field(default_factory=list)


@dataclass(slots=True)
class MessageSpec:
    name: str
    api_key: int | None
    type: str
    valid: Versions
    flexible: Versions
    root: StructSpec
    structs: dict[str, StructSpec]
    latest_version_unstable: bool = False

    @property
    def versions(self) -> range:
        assert self.valid.high is not None
        return range(self.valid.low, self.valid.high + 1)


def _parse_default(raw: Any, type_name: str, is_array: bool) -> Any:
    if is_array:
        return None if raw == "null" else []
    if raw is None:
        if type_name == "bool":
            return False
        if type_name in ("string",):
            return ""
        if type_name in ("bytes", "records"):
            return b""
        if type_name == "uuid":
            return b"\x00" * 16
        if type_name == "float64":
            return 0.0
        if type_name in PRIMITIVES:
            return 0
        return None  # structs get a fresh instance at construction
    if raw == "null":
        return None
    if type_name == "bool":
        return raw in (True, "true")
    if type_name == "float64":
        return float(raw)
    if type_name in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return int(raw, 0) if isinstance(raw, str) else int(raw)
    if type_name == "string":
        return str(raw)
    return raw


def _parse_fields(raw_fields: list[dict[str, Any]], structs: dict[str, StructSpec], common: dict[str, Any]) -> list[FieldSpec]:
    out: list[FieldSpec] = []
    for raw in raw_fields:
        type_text: str = raw["type"]
        is_array = type_text.startswith("[]")
        elem = type_text[2:] if is_array else type_text
        struct: StructSpec | None = None
        if elem not in PRIMITIVES:
            struct = structs.get(elem)
            if struct is None:
                struct = StructSpec(elem)
                structs[elem] = struct
                sub = raw.get("fields")
                if sub is None:
                    sub = common[elem]["fields"]
                struct.fields = _parse_fields(sub, structs, common)
        flex = raw.get("flexibleVersions")
        tagged = Versions.parse(raw.get("taggedVersions"))
        # As in Kafka's generator, a field without "versions" exists in its tagged versions.
        versions = Versions.parse(raw["versions"]) if "versions" in raw else tagged
        if versions == NO_VERSIONS:
            raise ValueError(f"field {raw['name']!r} gives neither versions nor taggedVersions")
        out.append(
            FieldSpec(
                name=raw["name"],
                attr=snake_case(raw["name"]),
                type=elem,
                is_array=is_array,
                versions=versions,
                nullable=Versions.parse(raw.get("nullableVersions")),
                tagged=tagged,
                tag=raw.get("tag"),
                default=_parse_default(raw.get("default"), elem, is_array),
                flexible_override=Versions.parse(flex) if flex is not None else None,
                struct=struct,
                extension=bool(raw.get("shoalExtension", False)),
            )
        )
    return out


def parse_spec(doc: dict[str, Any]) -> MessageSpec:
    common = {c["name"]: c for c in doc.get("commonStructs", [])}
    structs: dict[str, StructSpec] = {}
    root = StructSpec(doc["name"])
    root.fields = _parse_fields(doc.get("fields", []), structs, common)
    return MessageSpec(
        name=doc["name"],
        api_key=doc.get("apiKey"),
        type=doc["type"],
        valid=Versions.parse(doc["validVersions"]),
        flexible=Versions.parse(doc.get("flexibleVersions")),
        root=root,
        structs=structs,
        latest_version_unstable=bool(doc.get("latestVersionUnstable", False)),
    )


# Kafka's spec files are JSON with whole-line `//` comments (the licence header, notes on versions).
_COMMENT_LINE = re.compile(r"^[ \t]*//.*$", re.M)


def read_spec_json(text: str) -> dict[str, Any]:
    """A spec document from a file as Kafka writes them, comments and all."""
    doc = json.loads(_COMMENT_LINE.sub("", text))
    if not isinstance(doc, dict):
        raise ValueError("a message spec is a JSON object")
    return doc


def read_spec_file(path: Path) -> dict[str, Any]:
    """`read_spec_json` of a file, naming the file when it is not a spec Shoal can read."""
    try:
        return read_spec_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError among them
        raise ValueError(f"{path.name}: {exc}") from exc


def load_spec(path: Path) -> MessageSpec:
    return parse_spec(read_spec_file(path))


class ExtensionError(ValueError):
    """An extension file that cannot be merged into its Kafka spec."""


def _struct_fields(doc: dict[str, Any], struct: str) -> list[dict[str, Any]] | None:
    """The field list of `struct` in a spec document: the message itself, a struct declared inline at any
    depth, or a common struct."""
    if struct == doc["name"]:
        return cast("list[dict[str, Any]]", doc.get("fields", []))
    pending = [doc.get("fields", [])]
    while pending:
        for raw in pending.pop():
            if raw["type"].removeprefix("[]") == struct and "fields" in raw:
                return cast("list[dict[str, Any]]", raw["fields"])
            pending.append(raw.get("fields", []))
    for common in doc.get("commonStructs", []):
        if common["name"] == struct:
            return cast("list[dict[str, Any]]", common["fields"])
    return None


def merge_extension(doc: dict[str, Any], extension: dict[str, Any]) -> None:
    """Add an extension document's fields to the spec document `doc`, in place.

    Every field must be tagged, with a tag of its own from MIN_EXTENSION_TAG on, and a name the struct
    does not have yet: an untagged or clashing field would break the wire format Kafka's peers expect.
    """
    where = f"extension of {doc['name']}"
    if extension.get("name") != doc["name"]:
        raise ExtensionError(f"{where}: names {extension.get('name')!r}")
    for addition in extension.get("fields", []):
        struct, raw = addition["struct"], dict(addition["field"])
        fields = _struct_fields(doc, struct)
        if fields is None:
            raise ExtensionError(f"{where}: no struct {struct!r}")
        tag = raw.get("tag")
        if not isinstance(tag, int) or tag < MIN_EXTENSION_TAG or "taggedVersions" not in raw:
            raise ExtensionError(f"{where}: {raw.get('name')!r} must be tagged, with a tag from {MIN_EXTENSION_TAG} on")
        if any(f["name"] == raw["name"] for f in fields):
            raise ExtensionError(f"{where}: {struct} already has a field {raw['name']!r}")
        if any(f.get("tag") == tag for f in fields):
            raise ExtensionError(f"{where}: {struct} already uses tag {tag}")
        after = addition.get("after")
        names = [f["name"] for f in fields]
        if after is not None and after not in names:
            raise ExtensionError(f"{where}: {struct} has no field {after!r} to follow")
        raw["shoalExtension"] = True
        fields.insert(len(fields) if after is None else names.index(after) + 1, raw)


def load_all(directory: Path = SPEC_DIR, extensions: Path = EXTENSION_DIR) -> dict[str, MessageSpec]:
    """Every spec in `directory`, with the extensions in `extensions` merged in."""
    docs = {p.stem: read_spec_file(p) for p in sorted(directory.glob("*.json"))}
    for p in sorted(extensions.glob("*.json")):
        if p.stem not in docs:
            raise ExtensionError(f"{p.name}: no spec {p.stem} to extend")
        merge_extension(docs[p.stem], read_spec_file(p))
    return {name: parse_spec(doc) for name, doc in docs.items()}
