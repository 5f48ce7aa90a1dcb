"""Handlers and coordinators say what they take and return: no `Any` in their signatures.

Built from the source with `ast`, like the import-graph test. Every function and method in `broker/apis/`
and `coordinator/` is checked: each parameter (`*args` and `**kwargs` included) and the return annotation,
with `Any` anywhere inside them (`list[Any]`, `Callable[..., Any]`, a quoted annotation) counting too.
Handlers take the generated request classes (`shoal.protocol.messages`); a value of several wire shapes is
a union or a Protocol, a generic helper a TypeVar.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("broker/apis", "coordinator")


def _names_any(annotation: ast.expr) -> bool:
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":  # typing.Any, t.Any
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            try:
                quoted = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if _names_any(quoted):
                return True
    return False


def _annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    args = fn.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    found = [(a.arg, a.annotation) for a in named if a.annotation is not None]
    if args.vararg is not None and args.vararg.annotation is not None:
        found.append(("*" + args.vararg.arg, args.vararg.annotation))
    if args.kwarg is not None and args.kwarg.annotation is not None:
        found.append(("**" + args.kwarg.arg, args.kwarg.annotation))
    if fn.returns is not None:
        found.append(("return", fn.returns))
    return found


def any_in_signatures(source: str, filename: str = "<source>") -> list[str]:
    """`name(param)` for every parameter or return of a function in `source` annotated with `Any`."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [f"{filename}:{node.lineno} {node.name}({what})"
                    for what, annotation in _annotations(node) if _names_any(annotation)]
    return out


def _checked_files() -> list[Path]:
    return [p for folder in CHECKED for p in sorted((ROOT / folder).glob("*.py"))]


def test_the_check_finds_any_wherever_it_hides() -> None:
    source = '''
from typing import Any
import typing
def a(x: Any) -> int: ...
async def b(x: int) -> list[Any]: ...
def c(*args: Any, **kwargs: int) -> None: ...
def d(**kwargs: "dict[str, Any]") -> None: ...
class K:
    def e(self, f: typing.Callable[..., Any]) -> None: ...
    def ok(self, x: int, y: "list[str]", *rest: object) -> "str | None": ...
def also_ok(anything: object, *, many: Anyhow) -> None: ...
'''
    assert any_in_signatures(source) == [
        "<source>:4 a(x)", "<source>:5 b(return)", "<source>:6 c(*args)", "<source>:7 d(**kwargs)",
        "<source>:9 e(f)",
    ]


def test_checked_folders_exist() -> None:
    for folder in CHECKED:
        assert len(list((ROOT / folder).glob("*.py"))) > 5, folder


@pytest.mark.parametrize("path", _checked_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_any_in_handler_or_coordinator_signatures(path: Path) -> None:
    found = any_in_signatures(path.read_text(), path.relative_to(ROOT).as_posix())
    assert not found, "Any in signatures (use the generated message classes, a union, a Protocol or a TypeVar):\n" \
        + "\n".join(found)
