"""Shoal's own tagged fields live in protocol/extensions/ and are merged into Kafka's specs when they load;
protocol/specs/ holds nothing of Shoal's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shoal.protocol import messages
from shoal.protocol.schema import (
    EXTENSION_DIR,
    MIN_EXTENSION_TAG,
    SPEC_DIR,
    ExtensionError,
    load_all,
    merge_extension,
    read_spec_json,
)


def _fields(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for f in raw:
        out.append(f)
        out += _fields(f.get("fields", []))
    return out


@pytest.mark.parametrize("path", sorted(SPEC_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_kafka_specs_hold_no_shoal_field(path: Path) -> None:
    doc = read_spec_json(path.read_text())
    fields = _fields(doc.get("fields", [])) + [f for c in doc.get("commonStructs", []) for f in _fields(c["fields"])]
    ours = [f["name"] for f in fields if f.get("shoalExtension") or f.get("tag", -1) >= MIN_EXTENSION_TAG
            or f["name"].startswith("Shoal")]
    assert ours == []


def test_share_fetch_extensions_are_merged_where_they_belong() -> None:
    specs = load_all()
    request = {f.name: f for f in specs["ShareFetchRequest"].root.fields}
    assert (request["ShoalHeadersOnly"].extension, request["ShoalHeadersOnly"].tag) == (True, MIN_EXTENSION_TAG)
    assert [f.name for f in specs["ShareFetchRequest"].root.fields].index("ShoalHeadersOnly") == \
        [f.name for f in specs["ShareFetchRequest"].root.fields].index("IsRenewAck") + 1
    partition = {f.name: f for f in specs["ShareFetchResponse"].structs["PartitionData"].fields}
    assert (partition["ShoalBatchHeaders"].extension, partition["ShoalBatchHeaders"].tag) == (True, MIN_EXTENSION_TAG)
    assert not any(f.extension for s in specs.values() for f in s.root.fields if not f.name.startswith("Shoal"))
    assert {p.stem for p in EXTENSION_DIR.glob("*.json")} == {"ShareFetchRequest", "ShareFetchResponse"}


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_an_extension_field_travels_in_the_tagged_fields_a_kafka_peer_skips() -> None:
    fields: dict[str, Any] = {"group_id": "g", "member_id": "m", "share_session_epoch": 3, "max_wait_ms": 5, "min_bytes": 1,
              "max_bytes": 9, "max_records": 7, "batch_size": 2, "topics": [], "forgotten_topics_data": []}
    codec = messages.CODECS["ShareFetchRequest"]
    plain = bytes(codec.encode(messages.ShareFetchRequest(**fields), 1))
    extended = bytes(codec.encode(messages.ShareFetchRequest(shoal_headers_only=True, **fields), 1))
    # Kafka's encoding ends with an empty tagged-field section; ours has one field there: tag, size, value.
    assert plain.endswith(b"\x00")
    assert extended == plain[:-1] + b"\x01" + _uvarint(MIN_EXTENSION_TAG) + b"\x01\x01"
    decoded = codec.decode(extended, 1)[0]
    assert decoded.shoal_headers_only is True and decoded.max_records == 7


def _spec(fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "ThingRequest", "type": "request", "apiKey": 9999, "validVersions": "0-1", "flexibleVersions": "0+",
            "fields": fields}


def _extension(struct: str, field: dict[str, Any], after: str | None = None) -> dict[str, Any]:
    addition: dict[str, Any] = {"struct": struct, "field": field}
    if after is not None:
        addition["after"] = after
    return {"name": "ThingRequest", "fields": [addition]}


NESTED: list[dict[str, Any]] = [{"name": "A", "type": "int32", "versions": "0+"},
          {"name": "Items", "type": "[]Item", "versions": "0+", "fields": [
              {"name": "X", "type": "int32", "versions": "0+"},
              {"name": "Y", "type": "int32", "versions": "0+"}]}]
TAGGED: dict[str, Any] = {"name": "Extra", "type": "bool", "versions": "0+", "taggedVersions": "0+", "tag": MIN_EXTENSION_TAG}


def test_merge_places_the_field_after_the_named_one_in_a_nested_struct() -> None:
    doc = _spec(json.loads(json.dumps(NESTED)))
    merge_extension(doc, _extension("Item", dict(TAGGED), after="X"))
    item = doc["fields"][1]["fields"]
    assert [f["name"] for f in item] == ["X", "Extra", "Y"]
    assert item[1]["shoalExtension"] is True
    merge_extension(doc, _extension("ThingRequest", {**TAGGED, "tag": MIN_EXTENSION_TAG + 1}))
    assert [f["name"] for f in doc["fields"]] == ["A", "Items", "Extra"]


@pytest.mark.parametrize(("struct", "field", "after", "message"), [
    ("Nope", TAGGED, None, "no struct"),
    ("Item", {k: v for k, v in TAGGED.items() if k != "tag"}, None, "must be tagged"),
    ("Item", {k: v for k, v in TAGGED.items() if k != "taggedVersions"}, None, "must be tagged"),
    ("Item", {**TAGGED, "tag": 3}, None, "must be tagged"),
    ("Item", {**TAGGED, "name": "X"}, None, "already has a field"),
    ("Item", TAGGED, "Z", "no field 'Z'"),
])
def test_a_bad_extension_is_refused(struct: str, field: dict[str, Any], after: str | None, message: str) -> None:
    doc = _spec(json.loads(json.dumps(NESTED)))
    with pytest.raises(ExtensionError, match=message):
        merge_extension(doc, _extension(struct, dict(field), after))


def test_a_tag_already_in_use_is_refused() -> None:
    doc = _spec(json.loads(json.dumps(NESTED)))
    merge_extension(doc, _extension("Item", dict(TAGGED)))
    with pytest.raises(ExtensionError, match="already uses tag"):
        merge_extension(doc, _extension("Item", {**TAGGED, "name": "Other"}))


def test_an_extension_without_its_spec_is_refused(tmp_path: Path) -> None:
    specs, extensions = tmp_path / "specs", tmp_path / "extensions"
    specs.mkdir()
    extensions.mkdir()
    (specs / "ThingRequest.json").write_text(json.dumps(_spec(NESTED)))
    (extensions / "OtherRequest.json").write_text(json.dumps({"name": "OtherRequest", "fields": []}))
    with pytest.raises(ExtensionError, match="no spec OtherRequest"):
        load_all(specs, extensions)
    (extensions / "OtherRequest.json").unlink()
    (extensions / "ThingRequest.json").write_text(json.dumps(_extension("Item", dict(TAGGED))))
    loaded = load_all(specs, extensions)
    assert [(f.name, f.extension) for f in loaded["ThingRequest"].structs["Item"].fields] == \
        [("X", False), ("Y", False), ("Extra", True)]


def test_a_spec_file_with_kafka_s_comment_lines_loads(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    body = json.dumps(_spec(NESTED), indent=2).splitlines()
    # Comments as Kafka's files carry them: a header block, and notes between the lines of the object.
    text = "\n".join(["// a licence header", "//", "", body[0], "  // Version 1 adds nothing.", *body[1:]])
    (specs / "ThingRequest.json").write_text(text)
    loaded = load_all(specs, tmp_path / "none")
    assert [f.name for f in loaded["ThingRequest"].root.fields] == ["A", "Items"]
    assert read_spec_json('{"about": "see http://example.com // not a comment"}') == \
        {"about": "see http://example.com // not a comment"}
