"""One log stream for the broker: structlog events and stdlib records (asyncio, third-party libraries) rendered
alike, each line carrying the name of the logger that wrote it."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def _renderer(fmt: str) -> Any:
    if fmt == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=False)


def configure_logging(fmt: str, level: str) -> None:
    """Route structlog and the stdlib's logging through one renderer on stderr.

    structlog keeps its own level filter (a disabled call costs almost nothing on hot paths); the stdlib
    `logging` module carries the logger name and does the output, so asyncio's "Task exception was never
    retrieved" and a library's warnings come out in the same JSON or console form as the broker's own.
    """
    numeric = getattr(logging, level.upper(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _renderer(fmt),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
