"""Apache Kafka broker keys that have no meaning for a single Shoal broker, each with the reason.

A Kafka `server.properties` carries them (KRaft roles, thread pools, replication); Shoal accepts the
file, logs each such key once as ignored, and starts.
"""

from __future__ import annotations

_CONTROLLER = "Shoal is one broker with no KRaft controller quorum; its metadata lives in its log directory"
_THREADS = "Shoal serves every connection and disk write from one asyncio event loop; there is no thread pool to size"
_REPLICATION = "Shoal is a single broker that holds the only replica of every partition"
_ZOOKEEPER = "ZooKeeper mode was removed in Kafka 4.0 and Shoal never used ZooKeeper"
_LEADERSHIP = "the one broker leads every partition; there is no leadership to balance"
_SOCKET_BUFFERS = "socket buffer sizes are left to the operating system"
_TRANSACTIONS = "a transaction coordinator setting this single broker does not use"
_QUOTAS = "client quotas follow Kafka's default quota rules; no custom quota callback is loaded"

# Exact keys.
IGNORED_KEYS: dict[str, str] = {
    "process.roles": _CONTROLLER,
    "metadata.log.dir": _CONTROLLER,
    "initial.broker.registration.timeout.ms": _CONTROLLER,
    "broker.heartbeat.interval.ms": _CONTROLLER,
    "broker.session.timeout.ms": _CONTROLLER,
    "num.network.threads": _THREADS,
    "num.io.threads": _THREADS,
    "num.recovery.threads.per.data.dir": _THREADS,
    "num.replica.fetchers": _THREADS,
    "num.replica.alter.log.dirs.threads": _THREADS,
    "background.threads": _THREADS,
    "queued.max.request.bytes": _THREADS,
    "min.insync.replicas": _REPLICATION,
    "unclean.leader.election.enable": _REPLICATION,
    "offsets.topic.min.isr": _REPLICATION,
    "broker.rack": _REPLICATION,
    "auto.leader.rebalance.enable": _LEADERSHIP,
    "socket.listen.backlog.size": _SOCKET_BUFFERS,
    "transactional.id.expiration.ms": _TRANSACTIONS,
    "producer.id.expiration.ms": _TRANSACTIONS,
    "group.coordinator.rebalance.protocols": "classic, consumer and share groups are always served",
}

# Key prefixes (checked after the exact keys).
IGNORED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("controller.", _CONTROLLER),
    ("metadata.log.", _CONTROLLER),
    ("metadata.max.", _CONTROLLER),
    ("replica.", _REPLICATION),
    ("zookeeper.", _ZOOKEEPER),
    ("leader.imbalance.", _LEADERSHIP),
    ("transaction.", _TRANSACTIONS),
    ("quota.", _QUOTAS),
    ("client.quota.", _QUOTAS),
)


def ignored_reason(key: str) -> str | None:
    """Why Shoal ignores a Kafka key, or None when the key is not one Kafka knows but Shoal ignores."""
    reason = IGNORED_KEYS.get(key)
    if reason is not None:
        return reason
    for prefix, why in IGNORED_PREFIXES:
        if key.startswith(prefix):
            return why
    return None
