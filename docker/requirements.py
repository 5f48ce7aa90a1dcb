"""Write the images' pip requirements from pyproject.toml, so the Dockerfiles install dependencies in a layer
of their own, before the sources are copied in: a source edit then rebuilds only the last layers.

    python3 docker/requirements.py OUT_DIR

OUT_DIR/broker.txt: the build backend (the package is then installed with --no-build-isolation) and the
runtime dependencies; OUT_DIR/test.txt: the [test] extra. Docker caches `COPY --from` by the files' content,
so an edit of pyproject.toml that changes neither list rebuilds nothing.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def main(out: Path, pyproject: Path = Path("pyproject.toml")) -> None:
    with open(pyproject, "rb") as f:
        doc = tomllib.load(f)
    out.mkdir(parents=True, exist_ok=True)
    broker = [*doc["build-system"]["requires"], *doc["project"]["dependencies"]]
    (out / "broker.txt").write_text("\n".join(broker) + "\n")
    (out / "test.txt").write_text("\n".join(doc["project"]["optional-dependencies"]["test"]) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
