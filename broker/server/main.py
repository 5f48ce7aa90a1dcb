"""`shoal-broker [server.properties] [--override key=value ...]`: start the broker and serve until signalled."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

import structlog

from .config import BrokerConfig, ConfigError
from .server import Broker

READY_PREFIX = "SHOAL_READY "


def configure_logging(fmt: str, level: str) -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shoal-broker", description="Shoal: a Kafka-protocol broker with share groups.")
    parser.add_argument("config", nargs="?", help="server.properties file (Kafka's keys)")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a config key, after the file"
    )
    return parser.parse_args(argv)


async def serve(config: BrokerConfig) -> None:
    broker = Broker(config)
    await broker.start()
    ready = {
        "node_id": broker.node_id,
        "listeners": [{"name": lst.name, "host": lst.host, "port": lst.port} for lst in broker.bound],
        "metrics_port": broker.metrics_port,
        "log_dirs": str(config["log.dirs"]),
    }
    # One machine-readable line so tests and scripts can find the port chosen for `:0`.
    print(READY_PREFIX + json.dumps(ready), flush=True)
    structlog.get_logger("shoal").info("broker started", **ready)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    structlog.get_logger("shoal").info("broker stopping")
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BrokerConfig.load(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"shoal-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config["log.format"], config["log.level"])
    try:
        import uvloop

        uvloop.run(serve(config))
    except ImportError:
        asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
