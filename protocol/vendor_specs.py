"""Copies Kafka's JSON message specs into `specs/`, byte for byte, and records where they came from in
`specs/SOURCE`.

    python -m shoal.protocol.vendor_specs KAFKA_GIT_DIR COMMIT [--add Name ...]

KAFKA_GIT_DIR is a clone of apache/kafka (bare or not). Every spec already in `specs/` is refreshed from
COMMIT, plus the `--add` ones; then run `make generate`. The manifest lists each file's sha256 and git blob
id (so `git cat-file -p <blob>` in any Kafka clone shows the same bytes) and its path in Kafka's tree.
`tests/unit/test_vendored_specs.py` checks the files against it.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .schema import SPEC_DIR

MANIFEST = SPEC_DIR / "SOURCE"
# Kafka keeps message specs in several modules (clients, group-coordinator, share-coordinator, ...).
_SPEC_FOLDER = "/src/main/resources/common/message/"


@dataclass(frozen=True, slots=True)
class Entry:
    sha256: str
    blob: str
    upstream_path: str

    @property
    def name(self) -> str:
        return self.upstream_path.rsplit("/", 1)[1]


def git_blob_id(data: bytes) -> str:
    """The id git gives `data` as a blob, to match a file against any Kafka clone."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def read_manifest(path: Path = MANIFEST) -> tuple[dict[str, str], list[Entry]]:
    """The manifest's `key: value` header and its entries (`sha256 blob upstream-path` lines)."""
    header: dict[str, str] = {}
    entries: list[Entry] = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if ": " in line:
            key, value = line.split(": ", 1)
            header[key] = value
        else:
            sha256, blob, upstream = line.split()
            entries.append(Entry(sha256, blob, upstream))
    return header, entries


def _git(kafka: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(kafka), *args], check=True, capture_output=True).stdout


def vendor(kafka: Path, commit: str, add: list[str]) -> list[Entry]:
    names = {p.name for p in SPEC_DIR.glob("*.json")} | {f"{n.removesuffix('.json')}.json" for n in add}
    tree = _git(kafka, "ls-tree", "-r", "--name-only", commit).decode().splitlines()
    found: dict[str, list[str]] = {}
    for path in tree:
        if _SPEC_FOLDER in path and path.endswith(".json"):
            found.setdefault(path.rsplit("/", 1)[1], []).append(path)
    entries = []
    for name in sorted(names):
        paths = found.get(name, [])
        if len(paths) != 1:
            raise SystemExit(f"{name}: {len(paths)} files of that name in {commit}: {paths}")
        data = _git(kafka, "show", f"{commit}:{paths[0]}")
        (SPEC_DIR / name).write_bytes(data)
        entries.append(Entry(hashlib.sha256(data).hexdigest(), git_blob_id(data), paths[0]))
    return entries


def write_manifest(header: dict[str, str], entries: list[Entry]) -> None:
    lines = ["# Kafka's message specs in this folder, byte for byte: sha256, git blob id, path in Kafka's tree.",
             "# Refresh with `python -m shoal.protocol.vendor_specs`; Shoal's own fields live in ../extensions/."]
    lines += [f"{key}: {value}" for key, value in header.items()]
    lines.append("")
    lines += [f"{e.sha256} {e.blob} {e.upstream_path}" for e in entries]
    MANIFEST.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kafka", type=Path, help="a git clone of apache/kafka")
    parser.add_argument("commit", help="the commit to copy the specs from")
    parser.add_argument("--add", action="append", default=[], help="a spec not yet in specs/, e.g. FooRequest")
    parser.add_argument("--repository", default="https://github.com/apache/kafka")
    parser.add_argument("--version", required=True, help="Kafka's version at that commit (gradle.properties)")
    parser.add_argument("--note", help="anything else worth knowing about the source, one line")
    args = parser.parse_args(argv)
    full = _git(args.kafka, "rev-parse", f"{args.commit}^{{commit}}").decode().strip()
    entries = vendor(args.kafka, full, args.add)
    header = {"repository": args.repository, "commit": full, "version": args.version}
    if args.note:
        header["note"] = args.note
    write_manifest(header, entries)
    print(f"copied {len(entries)} specs from {full}; now run `make generate`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
