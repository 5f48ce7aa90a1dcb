"""Java .properties text, as Kafka's broker configs and client `--command-config` files are written.

Shared by the broker (server.properties) and the command-line tools; pure text in, dict out.
"""

from __future__ import annotations

import re

_KEY_VALUE = re.compile(r"((?:[^\s=:\\]|\\.)+)\s*[=:\s]\s*(.*)$")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """`key=value`, `key: value` or `key value`; `#`/`!` comments; backslash line continuations."""
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.strip() if not pending else raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the logical line on the next one.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        key, value = _split(line)
        out[key] = value
    if pending:
        key, value = _split(pending)
        out[key] = value
    return out


def _split(line: str) -> tuple[str, str]:
    match = _KEY_VALUE.match(line)
    if match is None:
        return unescape(line.strip()), ""
    return unescape(match.group(1)), unescape(match.group(2).strip())


def unescape(text: str) -> str:
    """Undo Java backslash escapes, as in property values and JAAS option strings."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)
