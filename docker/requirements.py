"""Write the images' pip requirements from pyproject.toml, so the Dockerfiles install dependencies in a layer
of their own, before the sources are copied in: a source edit then rebuilds only the last layers.

    python3 docker/requirements.py OUT_DIR

OUT_DIR/broker.txt: the build backend (the package is then installed with --no-build-isolation) and the
runtime dependencies; OUT_DIR/test.txt: the [test] extra, with the extras of Shoal's own it names expanded. Docker caches `COPY --from` by the files' content,
so an edit of pyproject.toml that changes neither list rebuilds nothing.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any


def extra(doc: dict[str, Any], name: str) -> list[str]:
    """An extra's requirements, with the project's own extras it names (`shoal[spark]`) expanded in place:
    pip would look for the project itself on the index."""
    project = doc["project"]["name"]
    out: list[str] = []
    for requirement in doc["project"]["optional-dependencies"][name]:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*\[([^\]]*)\]\s*", requirement)
        if m and m.group(1).lower() == project.lower():
            for inner in m.group(2).split(","):
                out += [r for r in extra(doc, inner.strip()) if r not in out]
        elif requirement not in out:
            out.append(requirement)
    return out


def main(out: Path, pyproject: Path = Path("pyproject.toml")) -> None:
    with open(pyproject, "rb") as f:
        doc = tomllib.load(f)
    out.mkdir(parents=True, exist_ok=True)
    broker = [*doc["build-system"]["requires"], *doc["project"]["dependencies"]]
    (out / "broker.txt").write_text("\n".join(broker) + "\n")
    (out / "test.txt").write_text("\n".join(extra(doc, "test")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
