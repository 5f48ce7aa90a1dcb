"""protocol/specs/ is a byte-for-byte copy of Kafka's message specs, as recorded in specs/SOURCE."""

from __future__ import annotations

import hashlib
import json

import pytest

from shoal.protocol.schema import SPEC_DIR, parse_spec, read_spec_json
from shoal.protocol.vendor_specs import MANIFEST, Entry, git_blob_id, read_manifest

HEADER, ENTRIES = read_manifest()
SPEC_FILES = sorted(SPEC_DIR.glob("*.json"))
# The first lines of every spec file in Kafka's tree; a normalised copy drops them.
LICENCE = (
    "// Licensed to the Apache Software Foundation (ASF) under one or more\n"
    "// contributor license agreements.  See the NOTICE file distributed with\n"
)


def problems(data: bytes, entry: Entry) -> list[str]:
    """How `data` differs from the Kafka file `entry` records; empty when it is that file."""
    out = []
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        out.append("sha256 differs")
    if git_blob_id(data) != entry.blob:
        out.append("git blob id differs")
    if not data.startswith(LICENCE.encode()):
        out.append("no licence header")
    return out


def test_manifest_names_its_source_and_every_spec_file() -> None:
    assert MANIFEST.parent == SPEC_DIR
    assert HEADER["repository"] == "https://github.com/apache/kafka"
    assert len(HEADER["commit"]) == 40 and int(HEADER["commit"], 16) >= 0
    assert HEADER["version"]
    assert sorted(e.name for e in ENTRIES) == [p.name for p in SPEC_FILES]
    assert all("/src/main/resources/common/message/" in e.upstream_path for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name.removesuffix(".json"))
def test_spec_file_is_kafkas_bytes(entry: Entry) -> None:
    data = (SPEC_DIR / entry.name).read_bytes()
    assert problems(data, entry) == []
    # Kafka's own spec parses as is, comments and all, before any Shoal extension is merged in.
    spec = parse_spec(read_spec_json(data.decode("utf-8")))
    assert f"{spec.name}.json" == entry.name


def test_a_normalised_copy_is_refused() -> None:
    entry = next(e for e in ENTRIES if e.name == "ShareFetchRequest.json")
    text = (SPEC_DIR / entry.name).read_text()
    normalised = json.dumps(read_spec_json(text), indent=2).encode()
    assert problems(normalised, entry) == ["sha256 differs", "git blob id differs", "no licence header"]
    reformatted = text.replace("\n  ", "\n    ").encode()  # licence kept, layout changed
    assert problems(reformatted, entry) == ["sha256 differs", "git blob id differs"]


def test_git_blob_id_is_gits() -> None:
    # `printf 'hello\n' | git hash-object --stdin`
    assert git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
