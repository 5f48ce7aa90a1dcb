"""`shoal-broker [server.properties] [--override key=value ...]`: start the broker and serve until signalled."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import structlog

from shoal.broker.common.config import BrokerConfig, ConfigError
from shoal.broker.storage.fsync_worker import compiled_worker_loaded
from shoal.protocol.records import compiled_walk_loaded

from .collector import settle_after_start
from .logging_setup import configure_logging
from .server import Broker

READY_PREFIX = "SHOAL_READY "


def log_config_notes(config: BrokerConfig) -> None:
    """Each key the broker accepted without applying it, once: Kafka's own with the reason, others as Kafka warns."""
    log = structlog.get_logger("shoal.config")
    for note in config.notes:
        if note.known:
            log.info("ignoring configuration key", key=note.key, reason=note.reason)
        else:
            log.warning(f"The configuration '{note.key}' was supplied but isn't a known config.", key=note.key)
    controllers = [n for n in config["controller.listener.names"]]
    if controllers:
        log.info("ignoring controller listeners", listeners=controllers,
                 reason="Shoal is one broker with no KRaft controller quorum")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shoal-broker", description="Shoal: a Kafka-protocol broker with share groups.")
    parser.add_argument("config", nargs="?", help="server.properties file (Kafka's keys)")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a config key, after the file"
    )
    parser.add_argument("--strict", action="store_true", help="refuse keys that are not known configuration keys")
    return parser.parse_args(argv)


async def serve(config: BrokerConfig) -> int:
    from shoal.broker.upstream.cluster import UpstreamStartError
    from shoal.broker.upstream.settings import UpstreamConfigError

    try:
        broker = Broker(config)
        await broker.start()
    except (UpstreamStartError, UpstreamConfigError, ConfigError) as exc:
        # Sidecar mode without a usable upstream: say why and exit, rather than serve clients nothing.
        structlog.get_logger("shoal").error("cannot start in sidecar mode", error=str(exc))
        print(f"shoal-broker: {exc}", file=sys.stderr)
        return 1
    ready = {
        "node_id": broker.node_id,
        "listeners": [{"name": lst.name, "host": lst.host, "port": lst.port} for lst in broker.bound],
        "metrics_port": broker.metrics_port,
        "log_dirs": str(config["log.dirs"]),
    }
    settle_after_start()
    # One machine-readable line so tests and scripts can find the port chosen for `:0`.
    print(READY_PREFIX + json.dumps(ready), flush=True)
    # Whether the optional C extensions were built: without a compiler the broker runs, slower.
    structlog.get_logger("shoal").info("broker started", **ready, compiled_record_walk=compiled_walk_loaded(),
                                       compiled_fsync_worker=compiled_worker_loaded())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    structlog.get_logger("shoal").info("broker stopping")
    await broker.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BrokerConfig.load(args.config, args.override, strict=args.strict)
    except (ConfigError, OSError) as exc:
        print(f"shoal-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config["log.format"], config["log.level"])
    log_config_notes(config)
    try:
        import uvloop

        return uvloop.run(serve(config))
    except ImportError:
        return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
