"""Only the coordinator runtime appends to an internal topic.

A coordinator operation plans: it returns (`write_result`) or yields (`write_steps`) the records to write,
and the runtime appends them, waits for the fsync and replays them before the operation goes on or is
answered. Built with `ast` over every module of `coordinator/` (as the import-graph test reads imports), so
an operation that starts appending by itself again fails here.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

COORDINATOR = Path(__file__).resolve().parents[2] / "shoal" / "coordinator"
# The runtime and the record log it appends through: the only places an append may be written.
RUNTIME_MODULES = {"runtime.py", "record_log.py"}
# Names a receiver of `.append` has when it is a log or the runtime rather than a list.
LOG_LIKE = ("runtime", "log")
# Runtime internals that append on an operation's behalf; calling them from outside is appending too.
RUNTIME_INTERNALS = {"_append_result", "_drive", "_drive_async", "_run_steps", "_run_async_steps"}


def _names(node: ast.expr) -> list[str]:
    """The names along a receiver chain: `self.runtime.record_log` -> [self, runtime, record_log]."""
    out: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            if isinstance(node, ast.Name):
                out.append(node.id)
            return out


def appends_in(source: str, filename: str = "<source>") -> list[str]:
    """Every call in `source` that appends to a log (or drives the runtime's append) by itself."""
    tree = ast.parse(source, filename)
    awaited = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Await)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        receiver = _names(node.func.value)
        log_like = any(name.lower().endswith(LOG_LIKE) or name.lower().startswith(LOG_LIKE) for name in receiver)
        if attr in RUNTIME_INTERNALS or (attr.startswith("append") and (
                attr != "append" or id(node) in awaited or log_like or len(node.args) != 1)):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def _coordinator_modules() -> list[Path]:
    paths = []
    for folder, _dirs, files in os.walk(COORDINATOR, followlinks=True):
        paths += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(paths)


def test_no_coordinator_module_appends_outside_the_runtime() -> None:
    modules = _coordinator_modules()
    assert len(modules) > 10  # the walk found the package (a symlink under shoal/)
    found = [hit for path in modules if path.name not in RUNTIME_MODULES
             for hit in appends_in(path.read_text(), f"coordinator/{path.relative_to(COORDINATOR)}")]
    assert found == [], "operations must hand their records to the runtime:\n" + "\n".join(found)


def test_the_runtime_modules_do_append() -> None:
    # The check looks at the right calls: the runtime's own appends are what it would flag elsewhere.
    source = (COORDINATOR / "runtime.py").read_text()
    assert any("record_log.append_nowait" in hit for hit in appends_in(source))


def test_the_check_tells_log_appends_from_list_appends() -> None:
    bad = '''
async def op(self, records):
    await self.runtime.append(self.partition_for(gid), records)
    await self._write(gid, records)
    self.runtime.record_log.append_nowait(0, records)
    await runtime.append_transactional(0, records, 1, 0)
    await self.runtime._append_result(0, result)
    await self.log.append(0, records)
'''
    good = '''
def op(self, group, records, out):
    records.append(group.member_record(m))
    out.append((a, b))
    by_topic.setdefault(topic, []).append(partition)
    yield records
'''
    assert len(appends_in(bad)) == 5
    assert appends_in(good) == []
