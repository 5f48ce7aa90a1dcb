"""The broker's log stream: structlog events and stdlib records come out in one format, with logger names."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, structlog
from shoal.broker.server.logging_setup import configure_logging
configure_logging({fmt!r}, "info")
structlog.get_logger("shoal.example").info("from structlog", key=1)
structlog.get_logger("shoal.example").debug("below the level")
logging.getLogger("asyncio").error("from the stdlib")
try:
    raise ValueError("bad")
except ValueError:
    structlog.get_logger("shoal.example").exception("with a traceback")
"""


def run(fmt: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(fmt=fmt)], capture_output=True, text=True, check=True)
    return out.stderr.splitlines()


def test_json_lines_carry_the_logger_name_for_structlog_and_stdlib_records() -> None:
    events = [json.loads(line) for line in run("json") if line.startswith("{")]
    by_event = {e["event"]: e for e in events}
    assert set(by_event) == {"from structlog", "from the stdlib", "with a traceback"}
    assert by_event["from structlog"]["logger"] == "shoal.example"
    assert by_event["from structlog"]["key"] == 1
    assert by_event["from the stdlib"]["logger"] == "asyncio"
    assert by_event["from the stdlib"]["level"] == "error"
    assert "ValueError: bad" in by_event["with a traceback"]["exception"]


def test_console_lines_carry_the_logger_name() -> None:
    lines = run("console")
    assert any("from structlog" in line and "[shoal.example]" in line for line in lines)
    assert any("from the stdlib" in line and "[asyncio]" in line for line in lines)
    assert not any("below the level" in line for line in lines)
