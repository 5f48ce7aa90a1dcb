"""`kafka-broker-api-versions`: the API versions every broker of the cluster serves.

Follows Apache Kafka's `kafka-broker-api-versions.sh`: it asks the bootstrap server for the cluster's
brokers, then sends ApiVersions to each one at its advertised address and prints one block per broker.
`[usable: N]` is the highest version both the broker and this client speak. The exit code is 0 only if
every broker answered, so the command doubles as a readiness probe (the docker-compose healthcheck).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from shoal.client.cluster import Cluster
from shoal.client.connection import BrokerConnection
from shoal.client.errors import KafkaError
from shoal.client.security import ClientConfig
from shoal.client.tools.cli import ToolParser, UsageError, add_version, usage_failure
from shoal.client.tools.config import ToolConfigError, load_properties, split_settings, warn_ignored
from shoal.protocol import messages

PROG = "kafka-broker-api-versions"


def build_parser() -> ToolParser:
    p = ToolParser(prog=PROG, description="Print the API versions each broker of the cluster supports.")
    p.add_argument("--bootstrap-server", metavar="<server(s) to use for bootstrapping>",
                   help="REQUIRED: The server(s) to connect to.")
    p.add_argument("--command-config", metavar="<command config property file>",
                   help="Property file with client settings (security.protocol, sasl.*, ssl.*).")
    p.add_argument("--timeout", type=int, default=10_000, metavar="<ms>",
                   help="How long to wait for each broker, in milliseconds.")
    add_version(p)
    return p


def format_versions(api_versions: dict[int, tuple[int, int]]) -> list[str]:
    """One line per API in Kafka's format: `Produce(0): 3 to 12 [usable: 12]`."""
    lines = []
    for api_key in sorted(api_versions):
        low, high = api_versions[api_key]
        served = str(low) if low == high else f"{low} to {high}"
        codec = messages.REQUESTS.get(api_key)
        if codec is None:
            lines.append(f"UNKNOWN({api_key}): {served}")
            continue
        ours = codec.spec.valid
        our_high = high if ours.high is None else ours.high  # None: open-ended
        if high < ours.low:
            usable = "unusable: node too old"
        elif low > our_high:
            usable = "unusable: node too new"
        else:
            usable = f"usable: {min(high, our_high)}"
        lines.append(f"{messages.API_NAMES[api_key]}({api_key}): {served} [{usable}]")
    return lines


async def run(bootstrap: str, config: ClientConfig) -> int:
    cluster = Cluster(bootstrap, config)
    try:
        await cluster.start()
        for node_id, (host, port) in sorted(cluster.brokers.items()):
            # A connection of our own at the advertised address: this is what every client will dial.
            conn = await BrokerConnection(host, port, config, node_id=node_id).connect()
            try:
                body = ",\n\t".join(format_versions(conn.api_versions))
                print(f"{host}:{port} (id: {node_id} rack: null) -> (\n\t{body}\n)", flush=True)
            finally:
                await conn.close()
    finally:
        await cluster.close()
    return 0 if cluster.brokers else 1


def client_config(ns: argparse.Namespace) -> ClientConfig:
    settings = split_settings(load_properties(ns.command_config) if ns.command_config else {})
    warn_ignored(settings)
    return ClientConfig.from_dict(settings.connection, client_id=settings.client_id or PROG, request_timeout_ms=ns.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        if not ns.bootstrap_server:
            raise UsageError('Missing required argument "[bootstrap-server]"')
    except UsageError as exc:
        return usage_failure(parser, str(exc))
    try:
        return asyncio.run(run(ns.bootstrap_server, client_config(ns)))
    except KeyboardInterrupt:
        return 130
    # ValueError: client settings the bundled client refuses.
    except (ToolConfigError, ValueError, KafkaError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
