"""The broker: wires config, storage, handlers and listeners together, and owns their lifecycle."""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from shoal.broker.common.config import DYNAMIC_CONFIG_FILE, BrokerConfig, Listener
from shoal.broker.common.metrics import BrokerMetrics
from shoal.broker.common.purgatory import LogKey, Purgatory
from shoal.broker.common.share_metrics import ShareGroupCollector
from shoal.broker.network.connection import KafkaConnection
from shoal.broker.network.request_channel import Api
from shoal.broker.security.acl_store import build_authorizer
from shoal.broker.security.authorizer import Authorizer
from shoal.broker.security.scram import ScramCredentialStore
from shoal.broker.share.group_configs import GroupConfigs
from shoal.broker.storage.client_quotas import ClientQuotaStore
from shoal.broker.storage.log_cleaner_manager import CleanerConfig, LogCleanerManager
from shoal.broker.storage.producer_state import ProducerIdAllocator
from shoal.broker.storage.topic_registry import (
    CONSUMER_OFFSETS,
    INTERNAL_TOPIC_PARTITIONS_KEYS,
    SHARE_GROUP_STATE,
    TRANSACTION_STATE,
    Topic,
    TopicRegistry,
)
from shoal.coordinator.transaction_coordinator import TRANSACTION_VERSION
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

from .adapters import BrokerTopicMetadata

if TYPE_CHECKING:
    from shoal.broker.share.share_partition_leader import SharePartitionLeaders
    from shoal.broker.share.share_topics import ShareTopicView
    from shoal.broker.storage.transaction_markers import TransactionMarkerWriter
    from shoal.broker.upstream.cluster import UpstreamCluster
    from shoal.broker.upstream.forwarder import Forwarder
    from shoal.broker.upstream.group_config_log import UpstreamGroupConfigLog
    from shoal.broker.upstream.state_log import UpstreamStateLog
    from shoal.broker.upstream.topics import UpstreamTopics
    from shoal.coordinator.classic_coordinator import ClassicGroupCoordinator
    from shoal.coordinator.consumer_coordinator import ConsumerGroupCoordinator
    from shoal.coordinator.group_coordinator import GroupCoordinator
    from shoal.coordinator.placement import Placement
    from shoal.coordinator.record_log import CoordinatorRecordLog, TransactionalRecordLog
    from shoal.coordinator.share_coordinator import ShareCoordinator
    from shoal.coordinator.share_group_coordinator import ShareGroupCoordinator
    from shoal.coordinator.transaction_coordinator import TransactionCoordinator
    from shoal.persister.persister import Persister

    from .sidecar_group import SidecarGroup

log = structlog.get_logger("shoal.broker")

_REQUEST_DRAIN_S = 10.0  # how long stop() waits for running requests
# Sidecar mode: recent upstream batches kept for share partitions' reads (shared by all of them).
UPSTREAM_BATCH_CACHE_BYTES = 64 << 20


class Broker:
    # Wired in start() (see __init__).
    share_coordinator: ShareCoordinator
    # The group coordinator: every group type and committed offsets on __consumer_offsets; its parts for
    # share, classic and KIP-848 consumer groups.
    group_coordinator: GroupCoordinator
    persister: Persister
    share_partitions: SharePartitionLeaders
    transaction_coordinator: TransactionCoordinator
    transaction_markers: TransactionMarkerWriter
    offsets_placement: Placement  # where each group id lives on __consumer_offsets

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.node_id = int(config["node.id"])
        self.cluster_id = str(config["cluster.id"])
        self.metrics = BrokerMetrics()
        self.authorizer: Authorizer = build_authorizer(config, Path(config["log.dirs"]))
        self.scram_credentials = ScramCredentialStore(Path(config["log.dirs"]))
        # TLS server contexts of the SSL / SASL_SSL listeners, by listener name (built in start()).
        self.ssl_contexts: dict[str, ssl.SSLContext] = {}
        self.purgatory = Purgatory()
        # Every partition log reports its appends here: long polls woken, records and bytes counted.
        self.topics = TopicRegistry(Path(config["log.dirs"]), config, purgatory=self.purgatory, metrics=self.metrics)
        self.log_cleaner = LogCleanerManager(
            CleanerConfig(
                enable=bool(config["log.cleaner.enable"]),
                threads=int(config["log.cleaner.threads"]),
                backoff_ms=int(config["log.cleaner.backoff.ms"]),
                dedupe_buffer_size=int(config["log.cleaner.dedupe.buffer.size"]),
                io_buffer_load_factor=float(config["log.cleaner.io.buffer.load.factor"]),
                io_max_bytes_per_second=float(config["log.cleaner.io.max.bytes.per.second"]),
            ),
            lambda: [plog for topic in list(self.topics.by_name.values()) for plog in topic.partitions],
        )
        self.apis: dict[int, Api] = {}
        self.connections: set[KafkaConnection] = set()
        self.connection_listeners: list[Callable[[KafkaConnection], None]] = []
        self.topic_listeners: list[Callable[..., None]] = []
        self.bound: list[Listener] = []
        self.advertised: list[Listener] = []
        self.metrics_port: int | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._background: list[asyncio.Task[Any]] = []
        # Request handlers running on any connection, including closed ones: stop() lets them finish.
        self._requests: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()
        config.load_dynamic(Path(config["log.dirs"]) / DYNAMIC_CONFIG_FILE)
        self.group_configs = GroupConfigs(Path(config["log.dirs"]), config)
        self.client_quotas = ClientQuotaStore(Path(config["log.dirs"]))
        # The coordinators and share-group parts are wired in start(), once the internal topics exist; no
        # request is served before. `stop` stops only what was started.
        self._coordinators_started = False
        self.producer_ids = ProducerIdAllocator(Path(config["log.dirs"]) / "shoal-producer-ids")
        # Sidecar mode: the upstream cluster and the forwarding to it, set up in start().
        self.upstream_cluster: UpstreamCluster | None = None
        self.upstream_forwarder: Forwarder | None = None
        self.upstream_topics: UpstreamTopics | None = None
        # Sidecar mode: where the group configs are kept (set up in start()).
        self.group_config_log: UpstreamGroupConfigLog | None = None
        # Sidecar mode: this instance's part in the group of sidecars on the upstream (set up in start()).
        self.sidecar_group: SidecarGroup | None = None
        # Sidecar mode: the coordinators' record logs on the upstream, by local internal topic name.
        self.state_logs: dict[str, UpstreamStateLog] = {}
        # Whether this instance is to own a state partition (internal topic name, partition): a partition
        # lost without being fenced is taken again only while this says so. One sidecar owns them all;
        # several set it to their assignment.
        self.state_partition_assigned: Callable[[str, int], bool] = lambda _topic, _partition: True
        self._loop: asyncio.AbstractEventLoop | None = None

    # The group coordinator's parts, one per group type.
    @property
    def share_groups(self) -> ShareGroupCoordinator:
        return self.group_coordinator.share

    @property
    def classic_groups(self) -> ClassicGroupCoordinator:
        return self.group_coordinator.classic

    @property
    def consumer_groups(self) -> ConsumerGroupCoordinator:
        return self.group_coordinator.consumer

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    # ---- handlers ------------------------------------------------------------------------------

    def register(self, key: int, min_version: int, max_version: int, handler: Callable[..., Any]) -> None:
        spec_versions = messages.REQUESTS[key].spec.valid
        assert min_version in spec_versions and max_version in spec_versions, (key, min_version, max_version)
        self.apis[key] = Api(
            key, messages.API_NAMES[key], min_version, max_version, handler, inspect.iscoroutinefunction(handler)
        )

    def api_versions_fallback(self, header: messages.RequestHeader) -> messages.ApiVersionsResponse:
        """ApiVersions v0 body with UNSUPPORTED_VERSION and our ranges, for a version we do not know."""
        cls = messages.ApiVersionsResponse
        return cls(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=self.api_version_entries())

    def api_version_entries(self) -> list[messages.ApiVersionsResponse.ApiVersion]:
        entry = messages.ApiVersionsResponse.ApiVersion
        return [
            entry(api_key=api.key, min_version=api.min_version, max_version=api.max_version)
            for api in sorted(self.apis.values(), key=lambda a: a.key)
        ]

    # ---- connections ---------------------------------------------------------------------------

    def on_connection_opened(self, conn: KafkaConnection) -> None:
        self.connections.add(conn)
        self.metrics.connections.set(len(self.connections))

    def track_request(self, task: asyncio.Task[Any]) -> None:
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    def on_connection_closed(self, conn: KafkaConnection) -> None:
        self.connections.discard(conn)
        self.metrics.connections.set(len(self.connections))
        for callback in self.connection_listeners:
            try:
                callback(conn)
            except Exception:
                log.exception("connection-close listener failed")

    # ---- lifecycle ----------------------------------------------------------------------------

    def internal_topic_configs(self, name: str) -> dict[str, str]:
        """The topic configs Kafka gives its internal topics. Group state is never aged out:
        `__consumer_offsets` is compacted, and `__share_group_state` keeps everything until the share
        coordinator prunes it past every key's latest snapshot."""
        if name == CONSUMER_OFFSETS:
            return {"cleanup.policy": "compact", "compression.type": "producer",
                    "segment.bytes": str(self.config["offsets.topic.segment.bytes"])}
        if name == TRANSACTION_STATE:
            return {"cleanup.policy": "compact", "compression.type": "producer",
                    "segment.bytes": str(self.config["transaction.state.log.segment.bytes"])}
        return {"cleanup.policy": "delete", "compression.type": "producer", "retention.ms": "-1",
                "retention.bytes": "-1",
                "segment.bytes": str(self.config["share.coordinator.state.topic.segment.bytes"])}

    def ensure_internal_topics(self) -> None:
        for name in (CONSUMER_OFFSETS, SHARE_GROUP_STATE, TRANSACTION_STATE):
            topic = self.topics.get(name)
            if topic is not None and topic.created_partitions is None:
                self._record_created_partitions(topic)
        for name in (CONSUMER_OFFSETS, SHARE_GROUP_STATE):
            wanted = self.internal_topic_configs(name)
            topic = self.topics.get(name)
            if topic is None:
                self.topics.create(name, int(self.config[INTERNAL_TOPIC_PARTITIONS_KEYS[name]]), wanted)
                continue
            # A data directory from an older version may lack these: add what is missing, keep what is set.
            missing: list[tuple[str, str | None]] = [(k, v) for k, v in wanted.items() if k not in topic.configs]
            if missing:
                self.topics.alter_configs(topic, missing)

    def _record_created_partitions(self, topic: Topic) -> None:
        """A registry written before creation counts were kept: the count the topic was created with is
        its current one, unless partitions were added since (which only CreatePartitions did, before it was
        refused); the broker created it with its setting, so a larger current count means the setting's."""
        configured = int(self.config[INTERNAL_TOPIC_PARTITIONS_KEYS[topic.name]])
        created = min(len(topic.partitions), configured)
        if created < len(topic.partitions):
            log.warning("internal topic has more partitions than it was created with; its coordinator keeps "
                        "placing keys by the count it was created with", topic=topic.name,
                        partitions=len(topic.partitions), created_partitions=created)
        self.topics.set_created_partitions(topic, created)

    def coordinator_partitions(self, name: str, default: int) -> int:
        """The partition count an internal topic's coordinator places keys by: the one it was created with."""
        topic = self.topics.get(name)
        if topic is None:
            return default
        created = topic.created_partitions
        if created is None or not 1 <= created <= len(topic.partitions):
            log.warning("internal topic's creation partition count is unusable; using its current count",
                        topic=name, created_partitions=created, partitions=len(topic.partitions))
            return len(topic.partitions)
        return created

    async def start(self) -> None:
        from shoal.broker.security.tls import server_context

        from .wiring import register_all

        self._loop = loop = asyncio.get_running_loop()
        if self.config.upstream:
            await self._start_upstream()
        self.topics.data_dir.mkdir(parents=True, exist_ok=True)
        self.topics.load()
        self.ensure_internal_topics()
        await self._start_share_groups()
        await self._start_transactions()
        self._coordinators_started = True
        register_all(self)
        for listener in self.config.listeners():
            if listener.security_protocol in ("SSL", "SASL_SSL"):
                self.ssl_contexts[listener.name] = server_context(self.config, listener.name)
        for listener in self.config.listeners():
            server = await loop.create_server(
                functools.partial(KafkaConnection, self, listener),
                host=listener.host,
                port=listener.port,
                reuse_address=True,
                backlog=1024,
            )
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.bound.append(Listener(listener.name, listener.security_protocol, listener.host, port))
        self.advertised = self.config.advertised(self.bound)
        if self.sidecar_group is not None:
            await self.sidecar_group.start()  # members advertise their bound listeners
        if int(self.config["metrics.port"]) >= 0:
            self.metrics_port = self.metrics.serve(str(self.config["metrics.host"]), int(self.config["metrics.port"]))
        self._background.append(loop.create_task(self._retention_loop()))
        self.log_cleaner.start()
        for topic in self.topics.by_name.values():
            for plog in topic.partitions:
                plog.start_background(loop)

    async def _start_upstream(self) -> None:
        """Sidecar mode: reach the upstream before serving anyone; raises UpstreamStartError (or
        UpstreamConfigError) with the reason when it cannot, and the broker does not start."""
        from shoal.broker.upstream.cluster import UpstreamCluster
        from shoal.broker.upstream.forwarder import Forwarder
        from shoal.broker.upstream.metrics import UpstreamMetrics
        from shoal.broker.upstream.settings import parse_upstream

        cluster = UpstreamCluster(parse_upstream(self.config.upstream), UpstreamMetrics(self.metrics.registry))
        try:
            await cluster.start()
        except BaseException:
            await cluster.close()
            raise
        self.upstream_cluster = cluster
        self.upstream_forwarder = Forwarder(cluster)
        await self._claim_state_topics()
        await self._start_group_config_log()

    async def _claim_state_topics(self) -> None:
        """Sidecar mode: before reading or writing any state topic, make sure this deployment owns them
        (another deployment's prefix is a start-up error, UpstreamStartError)."""
        from shoal.broker.upstream.state_topics import claim_state_topics

        assert self.upstream_cluster is not None and self.upstream_forwarder is not None
        settings = self.upstream_cluster.settings
        await claim_state_topics(self.upstream_cluster, self.upstream_forwarder, settings.state_topics,
                                 settings.membership_group_id, settings.state_topic_replication_factor)

    async def _start_group_config_log(self) -> None:
        """Sidecar mode: group configs live on the upstream (`<prefix>_group_configs`), read whole before
        anything is served, and followed from then on."""
        from shoal.broker.storage.partition_source import SourceUnavailable
        from shoal.broker.upstream.cluster import UpstreamStartError
        from shoal.broker.upstream.group_config_log import UpstreamGroupConfigLog

        assert self.upstream_cluster is not None and self.upstream_forwarder is not None

        def changed(group_id: str, configs: Mapping[str, str] | None) -> None:
            self.group_configs.replace(group_id, configs)
            self.on_group_config_changed(group_id)

        group_config_log = UpstreamGroupConfigLog(
            self.upstream_cluster, self.upstream_forwarder, changed,
            topic=self.upstream_cluster.settings.state_topics.group_configs)
        self.group_configs.use_store(group_config_log)
        try:
            await group_config_log.start(self.upstream_cluster.settings.state_topic_replication_factor)
        except SourceUnavailable as exc:
            raise UpstreamStartError(f"cannot read the upstream group configs: {exc}") from exc
        self.group_config_log = group_config_log

    async def _retention_loop(self) -> None:
        interval = int(self.config["log.retention.check.interval.ms"]) / 1000
        while True:
            await asyncio.sleep(interval)
            now_ms = int(time.time() * 1000)
            for topic in list(self.topics.by_name.values()):
                for plog in topic.partitions:
                    try:
                        plog.enforce_retention(now_ms)
                    except Exception:
                        log.exception("retention failed", topic=topic.name)

    async def stop(self) -> None:
        if self.sidecar_group is not None:
            await self.sidecar_group.stop()  # the others take over at once
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
        for task in self._background:
            task.cancel()
        if self._coordinators_started:
            self.group_coordinator.classic.unload()
        await asyncio.sleep(0)  # let the closed connections' callbacks run (they wake long polls, release)
        running = set(self._requests)
        if self._coordinators_started:
            running |= self.share_partitions.changes_in_progress()
        if running:
            # Work that started (a state write, an fsync) finishes before the logs close. Closing the
            # connections woke their long polls; a handler stuck longer than this is cut off.
            _done, stuck = await asyncio.wait(running, timeout=_REQUEST_DRAIN_S)
            for task in stuck:
                task.cancel()
            if stuck:
                log.warning("requests still running at shutdown were cancelled", count=len(stuck))
        if self._coordinators_started:
            await self.group_coordinator.stop()
            await self.share_coordinator.stop()
            await self.transaction_coordinator.stop()
        for server in self._servers:
            await server.wait_closed()
        await self.log_cleaner.stop()
        for topic in self.topics.by_name.values():
            for plog in topic.partitions:
                try:
                    await plog.flush()
                except Exception:
                    log.exception("final flush failed", topic=topic.name)
                await plog.stop_background()
        self.topics.close()
        if self.group_config_log is not None:
            await self.group_config_log.stop()
        if self.upstream_topics is not None:
            await self.upstream_topics.stop()
        if self.upstream_cluster is not None:
            await self.upstream_cluster.close()
        self.metrics.stop()

    async def _start_share_groups(self) -> None:
        from shoal.broker.share.share_partition_leader import SharePartitionLeaders
        from shoal.coordinator.classic_coordinator import ClassicGroupConfig
        from shoal.coordinator.consumer_assignors import parse_assignors
        from shoal.coordinator.consumer_coordinator import ConsumerGroupConfig
        from shoal.coordinator.group_coordinator import GroupCoordinator, OffsetConfig
        from shoal.coordinator.placement import Placement
        from shoal.coordinator.share_coordinator import ShareCoordinator
        from shoal.coordinator.share_coordinator_client import InProcessShareCoordinatorClient
        from shoal.coordinator.share_group_coordinator import ShareGroupConfig
        from shoal.coordinator.share_state import state_key_string
        from shoal.persister.default_persister import DefaultStatePersister

        state_topic = self.topics.get(SHARE_GROUP_STATE)
        offsets_topic = self.topics.get(CONSUMER_OFFSETS)
        assert state_topic is not None and offsets_topic is not None
        cfg = self.config
        # One placement per internal topic, shared by everything that writes or looks up its keys.
        offsets_log, state_log = await self._coordinator_logs()
        self.offsets_placement = Placement(self.coordinator_partitions(CONSUMER_OFFSETS, len(offsets_topic.partitions))
                                           if not self.state_logs else offsets_log.num_partitions,
                                           topic=CONSUMER_OFFSETS)
        # One code path for share groups in both modes: only where topics and records come from differs.
        topic_metadata: BrokerTopicMetadata | UpstreamTopics
        if self.upstream_cluster is not None:
            from shoal.broker.upstream.partition_reader import BatchCache
            from shoal.broker.upstream.topics import UpstreamTopics

            upstream_topics = UpstreamTopics(self.upstream_cluster,
                                             BatchCache(UPSTREAM_BATCH_CACHE_BYTES, self.upstream_cluster.metrics))
            upstream_topics.start()
            upstream_topics.follow(self.purgatory)
            self.upstream_topics = upstream_topics
            self.share_topics: ShareTopicView = upstream_topics
            topic_metadata = upstream_topics
        else:
            from shoal.broker.share.share_topics import LocalShareTopics

            self.share_topics = LocalShareTopics(self.topics)
            topic_metadata = BrokerTopicMetadata(self.topics)
        self.share_coordinator = ShareCoordinator(
            state_log,
            # On a compacted upstream topic only the latest record of a key is sure to stay: every write is a
            # snapshot there (an update would be lost once a later one of the key replaced it).
            snapshot_update_records_per_snapshot=0 if self.state_logs else int(
                cfg["share.coordinator.snapshot.update.records.per.snapshot"]),
            cold_snapshot_interval_ms=int(cfg["share.coordinator.cold.partition.snapshot.interval.ms"]),
            partition_count=self._partition_count,
            placement=Placement(self.coordinator_partitions(SHARE_GROUP_STATE, len(state_topic.partitions))
                                if not self.state_logs else state_log.num_partitions,
                                state_key_string, topic=SHARE_GROUP_STATE),
        )
        if self.upstream_cluster is not None:
            from shoal.broker.upstream.peer_state_client import (
                PeerShareCoordinatorClient,
                inter_broker_settings,
            )

            from .sidecar_group import SidecarGroup

            # Each state partition's RPCs go to the sidecar instance that owns it.
            self.sidecar_group = SidecarGroup(self)
            self.persister = DefaultStatePersister(PeerShareCoordinatorClient(
                InProcessShareCoordinatorClient(self.share_coordinator), self.sidecar_group.ownership,
                self.sidecar_group.state_unit, inter_broker_settings(cfg)))
        else:
            self.persister = DefaultStatePersister(InProcessShareCoordinatorClient(self.share_coordinator))
        from shoal.broker.share.dead_letter import DeadLetterWriter
        from shoal.broker.storage.partition_budget import PartitionBudget

        upstream_dead_letters = None
        if self.upstream_forwarder is not None and self.upstream_topics is not None:
            from shoal.broker.share.dead_letter import UpstreamDeadLetters

            upstream_dead_letters = UpstreamDeadLetters(self.upstream_forwarder, self.upstream_topics, self.config)
        dead_letters = DeadLetterWriter(self.topics, self.config, self.group_configs, self.on_topic_created,
                                        partition_budget=PartitionBudget(self.config, self.topics).problem,
                                        upstream=upstream_dead_letters)
        self.share_partitions = SharePartitionLeaders(self.persister, self.group_configs, self.purgatory,
                                                      dead_letters=dead_letters)
        self._wire_share_metrics()
        if self.sidecar_group is not None:
            self.sidecar_group.wire()
        coordinator = self.group_coordinator = GroupCoordinator(
            offsets_log,
            topic_metadata,
            self.persister,
            share_config=ShareGroupConfig(
                session_timeout_ms=int(cfg["group.share.session.timeout.ms"]),
                heartbeat_interval_ms=int(cfg["group.share.heartbeat.interval.ms"]),
                max_size=int(cfg["group.share.max.size"]),
                initialize_retry_interval_ms=int(cfg["group.share.initialize.retry.interval.ms"]),
                assignment_interval_ms=int(cfg["group.share.assignment.interval.ms"]),
                assign_after_initialization=self.upstream_cluster is not None,
            ),
            classic_config=ClassicGroupConfig(
                min_session_timeout_ms=int(cfg["group.min.session.timeout.ms"]),
                max_session_timeout_ms=int(cfg["group.max.session.timeout.ms"]),
                initial_rebalance_delay_ms=int(cfg["group.initial.rebalance.delay.ms"]),
                max_size=int(cfg["group.max.size"]),
            ),
            consumer_config=ConsumerGroupConfig(
                session_timeout_ms=int(cfg["group.consumer.session.timeout.ms"]),
                heartbeat_interval_ms=int(cfg["group.consumer.heartbeat.interval.ms"]),
                max_size=int(cfg["group.consumer.max.size"]),
                group_override=self._consumer_group_override,
            ),
            offset_config=OffsetConfig(
                metadata_max_bytes=int(cfg["offset.metadata.max.bytes"]),
                retention_ms=int(cfg["offsets.retention.minutes"]) * 60_000,
                retention_check_interval_ms=int(cfg["offsets.retention.check.interval.ms"]),
            ),
            assignors=parse_assignors(str(cfg["group.consumer.assignors"])),
            group_configs=self.group_configs,
            placement=self.offsets_placement,
        )
        # The scrape-time collector reads every part above, from prometheus_client's thread.
        self.metrics.registry.register(ShareGroupCollector(self, self.metrics.share))
        started = time.monotonic()
        if self.sidecar_group is None:
            await self._take_state_partitions()
        await self.share_coordinator.load()
        if self.upstream_cluster is None:
            # Sidecar mode keeps the state of topics its upstream metadata does not name (yet): a topic missed
            # in one metadata read must not lose its share groups' state.
            await self.share_coordinator.delete_orphaned_state()
        await coordinator.load()
        if self.sidecar_group is not None:
            self.sidecar_group.unload_untaken()  # the sidecar group's assignment says which to take
        log.info("coordinators loaded", seconds=round(time.monotonic() - started, 3))
        coordinator.start()
        self.topic_listeners.append(self._share_groups_on_topic_event)
        if self.upstream_cluster is not None:
            # Topics created, deleted or grown on the upstream re-balance the share groups subscribed to them.
            self.upstream_cluster.topic_listeners.append(coordinator.share.on_upstream_topics_changed)
        self._background.append(self.loop.create_task(self._share_coordinator_housekeeping()))

    # ==== sidecar mode: the coordinators' records on the upstream ==================================
    # Everything that wires the state topics on the upstream (broker/upstream/state_*.py) is here.

    async def _coordinator_logs(self) -> tuple[TransactionalRecordLog, CoordinatorRecordLog]:
        """The record logs of `__consumer_offsets` and `__share_group_state`: the local topics standalone; in
        sidecar mode this deployment's `<prefix>_*` topics on the upstream (created when missing; raises
        UpstreamStartError when they cannot be created or written with acks=all)."""
        from shoal.broker.storage.internal_topic_log import InternalTopicLog

        if self.upstream_cluster is None:
            offsets_topic, state_topic = self.topics.get(CONSUMER_OFFSETS), self.topics.get(SHARE_GROUP_STATE)
            assert offsets_topic is not None and state_topic is not None
            return InternalTopicLog(offsets_topic), InternalTopicLog(state_topic)
        from shoal.broker.storage.partition_source import SourceUnavailable
        from shoal.broker.upstream.cluster import UpstreamStartError
        from shoal.broker.upstream.state_log import UpstreamStateLog
        from shoal.broker.upstream.state_topics import ensure_state_topics

        settings = self.upstream_cluster.settings
        names = settings.state_topics
        wanted = {names.for_internal(name): int(self.config[INTERNAL_TOPIC_PARTITIONS_KEYS[name]])
                  for name in (CONSUMER_OFFSETS, SHARE_GROUP_STATE)}
        try:
            created = await ensure_state_topics(self.upstream_cluster, wanted,
                                                settings.state_topic_replication_factor)
        except SourceUnavailable as exc:
            raise UpstreamStartError(f"cannot set up the upstream state topics: {exc}") from exc
        for name in (CONSUMER_OFFSETS, SHARE_GROUP_STATE):
            upstream_name = names.for_internal(name)
            self.state_logs[name] = UpstreamStateLog(
                self.upstream_cluster, upstream_name, name, created[upstream_name].partitions,
                settings.membership_group_id,
                on_lost=functools.partial(self._on_state_partition_lost, name),
                max_transaction_version=settings.state_transaction_version)
        return self.state_logs[CONSUMER_OFFSETS], self.state_logs[SHARE_GROUP_STATE]

    async def _take_state_partitions(self) -> None:
        """Sidecar mode, at start-up: this instance takes every state partition (fencing any earlier
        writer) and reads it, before the coordinators load. Several sidecars divide them instead through
        `take_state_partition` / `release_state_partition`."""
        if not self.state_logs:
            return
        from shoal.broker.storage.internal_topic_log import CoordinatorLogError
        from shoal.broker.storage.partition_source import SourceUnavailable
        from shoal.broker.upstream.cluster import UpstreamStartError

        limit = asyncio.Semaphore(8)

        async def take(state_log: UpstreamStateLog, partition: int) -> None:
            async with limit:
                await state_log.take(partition)

        try:
            await asyncio.gather(*(take(state_log, p) for state_log in self.state_logs.values()
                                   for p in range(state_log.num_partitions)))
        except (CoordinatorLogError, SourceUnavailable) as exc:
            raise UpstreamStartError(f"cannot take the upstream state topics: {exc}") from exc
        except Exception as exc:  # an answer Shoal cannot use: the reason goes on stderr, not a traceback alone
            log.exception("taking the upstream state topics failed")
            raise UpstreamStartError(f"cannot take the upstream state topics: {exc!r}") from exc

    async def take_state_partition(self, internal_topic: str, partition: int) -> None:
        """Own one state partition (`internal_topic` is `__consumer_offsets` or `__share_group_state`):
        fence its previous owner on the upstream, read what committed there, and serve its keys."""
        await self.state_logs[internal_topic].take(partition)
        if internal_topic == SHARE_GROUP_STATE:
            await self.share_coordinator.runtime.load(partition)
        else:
            await self.group_coordinator.load_partition(partition)
        log.info("state partition serving", topic=internal_topic, partition=partition)

    def release_state_partition(self, internal_topic: str, partition: int) -> None:
        """Stop owning one state partition: its writes stop, its keys answer NOT_COORDINATOR, and the share
        partitions whose state it holds hand out nothing more."""
        self.state_logs[internal_topic].release(partition)
        self._unload_state_partition(internal_topic, partition)

    def _unload_state_partition(self, internal_topic: str, partition: int) -> None:
        if internal_topic == SHARE_GROUP_STATE:
            self.share_coordinator.runtime.unload(partition)
            dropped = self.share_partitions.drop_where(
                lambda key: self.share_coordinator.partition_for(key) == partition)
            log.info("share partitions dropped with their state partition", partition=partition, count=dropped)
        else:
            self.group_coordinator.runtime.unload(partition)

    def _on_state_partition_lost(self, internal_topic: str, partition: int, fenced: bool) -> None:
        """A state write failed for good: fenced by another instance (which now owns the partition), or the
        upstream left it unknown whether a transaction committed. Either way memory may not match the log."""
        log.warning("state partition lost", topic=internal_topic, partition=partition, fenced=fenced)
        self._unload_state_partition(internal_topic, partition)
        if not fenced and self.state_partition_assigned(internal_topic, partition):
            # Nobody else has it: take it again, which re-reads what did commit.
            task = self.loop.create_task(self._retake_state_partition(internal_topic, partition))
            self._background.append(task)
            task.add_done_callback(self._background.remove)

    async def _retake_state_partition(self, internal_topic: str, partition: int) -> None:
        delay = 0.1
        while True:
            await asyncio.sleep(delay)
            if not self.state_partition_assigned(internal_topic, partition):
                return  # assigned elsewhere meanwhile: taking it would fence its new owner
            try:
                await self.take_state_partition(internal_topic, partition)
                return
            except Exception as exc:
                log.warning("taking a state partition again failed; retrying", topic=internal_topic,
                            partition=partition, error=str(exc))
                delay = min(delay * 2, 5.0)

    # ==== end of sidecar state ====================================================================

    def _on_marker_durable(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        if topic == CONSUMER_OFFSETS:
            # The transaction's offset commits on this partition are now final (or dropped).
            self.group_coordinator.on_transaction_completed(partition, producer_id, commit)

    async def _start_transactions(self) -> None:
        from shoal.broker.storage.internal_topic_log import LazyInternalTopicLog
        from shoal.broker.storage.transaction_markers import TransactionMarkerWriter
        from shoal.coordinator.placement import Placement
        from shoal.coordinator.transaction_coordinator import TransactionCoordinator

        num_partitions = int(self.config["transaction.state.log.num.partitions"])
        txn_log = LazyInternalTopicLog(lambda: self.topics.get(TRANSACTION_STATE), self._create_transaction_state,
                                       num_partitions)
        self.transaction_markers = TransactionMarkerWriter(self.topics, self._on_marker_durable)
        self.transaction_coordinator = TransactionCoordinator(
            txn_log, self.transaction_markers, self.producer_ids.allocate,
            max_timeout_ms=int(self.config["transaction.max.timeout.ms"]),
            offsets_placement=self.offsets_placement,
            placement=Placement(self.coordinator_partitions(TRANSACTION_STATE, num_partitions), topic=TRANSACTION_STATE),
            transactional_id_expiration_ms=int(self.config["transactional.id.expiration.ms"]),
        )
        await self.transaction_coordinator.load()
        self.transaction_coordinator.start()
        self._background.append(self.loop.create_task(self._abort_timed_out_transactions()))
        self._background.append(self.loop.create_task(self._expire_transactional_ids()))
        self._background.append(self.loop.create_task(self._expire_producer_ids()))

    def _create_transaction_state(self) -> Topic:
        topic = self.topics.create(TRANSACTION_STATE, int(self.config["transaction.state.log.num.partitions"]),
                                   self.internal_topic_configs(TRANSACTION_STATE))
        log.info("transaction state topic created", partitions=len(topic.partitions))
        self.on_topic_created(topic)
        return topic

    async def _abort_timed_out_transactions(self) -> None:
        interval = int(self.config["transaction.abort.timed.out.transaction.cleanup.interval.ms"]) / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.transaction_coordinator.abort_timed_out()
                await self.transaction_coordinator.prune()
            except Exception:
                log.exception("aborting timed-out transactions failed")

    async def _expire_transactional_ids(self) -> None:
        interval = int(self.config["transaction.remove.expired.transaction.cleanup.interval.ms"]) / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.transaction_coordinator.expire_transactional_ids()
            except Exception:
                log.exception("expiring transactional ids failed")

    async def _expire_producer_ids(self) -> None:
        interval = int(self.config["producer.id.expiration.check.interval.ms"]) / 1000
        expiration_ms = int(self.config["producer.id.expiration.ms"])
        while True:
            await asyncio.sleep(interval)
            now_ms = int(time.time() * 1000)
            expired = 0
            for topic in list(self.topics.by_name.values()):
                for plog in topic.partitions:
                    expired += plog.expire_producers(now_ms, expiration_ms)
            if expired:
                log.info("producer ids expired", count=expired)

    def _wire_share_metrics(self) -> None:
        """KIP-932 metrics: event hooks into the share coordinator and leaders (set before they load)."""
        events = self.metrics.share
        self.share_coordinator.on_partition_load = events.observe_state_partition_load
        self.share_coordinator.on_write = events.observe_state_write
        self.share_partitions.on_load = events.observe_partition_load
        if self.share_partitions.dead_letters is not None:
            self.share_partitions.dead_letters.on_written = events.record_dead_letters

    async def _share_coordinator_housekeeping(self) -> None:
        cold_ms = int(self.config["share.coordinator.cold.partition.snapshot.interval.ms"])
        prune_ms = int(self.config["share.coordinator.state.topic.prune.interval.ms"])
        interval = min(cold_ms, prune_ms) / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.share_coordinator.maybe_cold_snapshot(int(time.time() * 1000))
                await self.share_coordinator.prune()
            except Exception:
                log.exception("share coordinator housekeeping failed")

    def _share_groups_on_topic_event(self, event: str, topic: Topic, *args: Any) -> None:
        if topic.internal:
            return
        if event == "deleted":
            self.share_partitions.drop_topic(topic.topic_id)
            task = self.loop.create_task(self._delete_share_state(topic))
            self._background.append(task)
            task.add_done_callback(self._background.remove)
        if event == "deleted":
            # Committed offsets of the topic go, in every group (Kafka's onPartitionsDeleted).
            task = self.loop.create_task(self._delete_committed_offsets(topic))
            self._background.append(task)
            task.add_done_callback(self._background.remove)
        if event in ("created", "deleted"):
            self.share_groups.on_topics_changed()
        if event == "log_start_moved":
            self.purgatory.notify(LogKey(topic.topic_id, args[0]))

    async def _delete_committed_offsets(self, topic: Topic) -> None:
        try:
            await self.group_coordinator.on_topics_deleted([topic.name])
        except Exception:  # offsets left behind expire with offsets.retention.minutes
            log.exception("deleting the committed offsets of a deleted topic failed", topic=topic.name)

    async def _delete_share_state(self, topic: Topic) -> None:
        try:
            await self.share_coordinator.delete_topics({topic.topic_id})
        except Exception:  # what is left is tombstoned by the orphan sweep at the next start-up
            log.exception("deleting the share state of a deleted topic failed", topic=topic.name)

    def _partition_count(self, topic_id: bytes) -> int | None:
        topic = self.share_topics.topic_by_id(topic_id)  # the upstream's topics in sidecar mode
        return None if topic is None else topic[1]

    def on_group_config_changed(self, group_id: str) -> None:
        # The group coordinator reads session timeout and heartbeat interval afresh on every heartbeat.
        if self._coordinators_started:
            self.share_partitions.group_config_changed(group_id)

    # ---- topic lifecycle hooks (share groups subscribe to these) --------------------------------

    def on_topic_created(self, topic: Topic) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            for plog in topic.partitions:
                plog.start_background(loop)
        for callback in self.topic_listeners:
            callback("created", topic)

    def delete_topic(self, topic: Topic) -> None:
        self.topics.delete(topic)
        for index in range(len(topic.partitions)):
            self.purgatory.notify(LogKey(topic.topic_id, index))
        for callback in self.topic_listeners:
            callback("deleted", topic)

    def on_log_start_moved(self, topic: Topic, partition: int) -> None:
        for callback in self.topic_listeners:
            callback("log_start_moved", topic, partition)

    def _consumer_group_override(self, group_id: str, key: str) -> int | None:
        value = self.group_configs.explicit(group_id).get(key)
        return None if value is None else int(value)

    def finalized_features(self) -> dict[str, int]:
        # share.version 2 (Kafka 4.4) adds dead-letter topics for share groups (KIP-1191); ApiVersions agrees.
        return {"share.version": 2 if self.config["group.share.enable"] else 0, "transaction.version": 0 if self.config.upstream else TRANSACTION_VERSION}

    def advertised_listener(self, name: str) -> Listener:
        for lst in self.advertised:
            if lst.name == name:
                return lst
        return self.advertised[0]
