"""protocol/specs/ is a byte-for-byte copy of Kafka's message specs, as recorded in specs/SOURCE."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from shoal.protocol.messages import CODECS
from shoal.protocol.schema import SPEC_DIR, Versions, load_all, parse_spec, read_spec_json
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


# ---- rules of Kafka's generator the loader follows ---------------------------------------------------


def test_a_field_without_versions_exists_in_its_tagged_versions() -> None:
    value = load_all()["TransactionLogValue"]
    fields = {f.name: f for f in value.root.fields}
    for name in ("PreviousProducerId", "NextProducerId", "NextProducerEpoch", "ClientTransactionVersion"):
        assert (fields[name].versions, fields[name].tagged) == (Versions(1, None), Versions(1, None)), name
    # A record as Kafka's transaction coordinator writes it (value version 1), tagged fields included.
    body = (struct.pack(">qhibB", 7, 3, 60000, 2, 0)  # producer id, epoch, timeout, status, null partitions
            + struct.pack(">qq", 1000, 900)
            + bytes([4])  # four tagged fields, by tag
            + bytes([0, 8]) + struct.pack(">q", 6) + bytes([1, 8]) + struct.pack(">q", 8)
            + bytes([2, 2]) + struct.pack(">h", 2) + bytes([3, 2]) + struct.pack(">h", 0))
    got, end = CODECS["TransactionLogValue"].decode(body, 1)
    assert end == len(body)
    assert (got.previous_producer_id, got.next_producer_id, got.client_transaction_version,
            got.next_producer_epoch) == (6, 8, 2, 0)
    assert bytes(CODECS["TransactionLogValue"].encode(got, 1)) == body


def test_a_field_with_neither_versions_nor_tagged_versions_is_refused() -> None:
    doc = {"name": "ThingRequest", "type": "request", "apiKey": 9999, "validVersions": "0", "flexibleVersions": "0+",
           "fields": [{"name": "Nothing", "type": "int32"}]}
    with pytest.raises(ValueError, match="Nothing"):
        parse_spec(doc)


def test_a_tagged_array_is_written_unless_it_equals_its_default() -> None:
    codec = CODECS["ConsumerGroupCurrentMemberAssignmentValue"]
    tp = codec.cls.TopicPartitions
    written = {}
    for epochs in (None, [], [5]):
        obj = codec.cls(assigned_partitions=[tp(topic_id=bytes(16), partitions=[1], assignment_epochs=epochs)])
        data = bytes(codec.encode(obj, 0))
        assert codec.decode(data, 0)[0] == obj
        written[repr(epochs)] = len(data)
    # The default (JSON null in Kafka's spec: an empty array) is left out; null and [5] are written.
    assert written["None"] > written["[]"] and written["[5]"] > written["None"]
