"""The import graph of Shoal's own modules: no cycles, and dependencies point one way.

Built from the source with `ast`, counting every import, including those under `if TYPE_CHECKING:` and
inside functions: a cycle through a type-only import still means the modules cannot be read apart.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "shoal"

# Lower number = lower layer; a module may import its own layer or lower ones only.
# server -> apis -> network -> share/coordinator -> security, persister/storage -> common -> protocol
LAYERS: dict[str, int] = {
    "shoal.protocol": 0,
    "shoal.broker.common": 1,
    "shoal.broker.storage": 2,
    "shoal.persister": 2,
    "shoal.broker.security": 3,
    "shoal.broker.upstream": 3,
    "shoal.broker.share": 4,
    "shoal.coordinator": 4,
    "shoal.broker.network": 5,
    "shoal.broker.apis": 6,
    "shoal.broker.server": 7,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    # os.walk, because the subpackages under shoal/ are symlinks to the top-level folders
    found = {}
    for folder, _dirs, files in os.walk(ROOT, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                path = Path(folder) / file
                found[_module_name(path)] = path
    return found


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                # `from pkg import mod` imports the module pkg.mod when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("shoal") and target != name and target != "shoal":
                    deps.add(target)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer(module: str) -> int | None:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def test_the_graph_sees_the_packages() -> None:
    graph = import_graph()
    # A sanity floor so a broken walk cannot pass vacuously.
    assert "shoal.broker.server.server" in graph
    assert "shoal.broker.storage.partition_log" in graph["shoal.broker.share.share_partition_leader"]


def test_no_import_cycles() -> None:
    cycles = _cycles(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_protocol_imports_nothing_else_of_shoal() -> None:
    bad = {
        (m, d)
        for m, deps in import_graph().items()
        if m.startswith("shoal.protocol")
        for d in deps
        if not d.startswith("shoal.protocol")
    }
    assert bad == set()


def test_dependencies_point_down_the_layers() -> None:
    bad = []
    for module, deps in import_graph().items():
        rank = _layer(module)
        if rank is None:
            continue
        for dep in deps:
            dep_rank = _layer(dep)
            if dep_rank is not None and dep_rank > rank:
                bad.append(f"{module} -> {dep}")
    assert bad == [], "imports against the layer order:\n" + "\n".join(sorted(bad))
