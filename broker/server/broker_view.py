"""What the wiring reads of the broker, as a Protocol: `server.Broker` implements it.

The wiring builds each API family's services from these parts; typing it against this view rather than
the server's class keeps `server -> wiring -> server` from being a cycle.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig, Listener
    from shoal.broker.common.metrics import BrokerMetrics
    from shoal.broker.common.purgatory import Purgatory
    from shoal.broker.network.request_channel import Api
    from shoal.broker.security.authorizer import Authorizer
    from shoal.broker.security.scram import ScramCredentialStore
    from shoal.broker.share.group_configs import GroupConfigs
    from shoal.broker.share.share_partition_leader import SharePartitionLeaders
    from shoal.broker.share.share_topics import ShareTopicView
    from shoal.broker.storage.client_quotas import ClientQuotaStore
    from shoal.broker.storage.producer_state import ProducerIdAllocator
    from shoal.broker.storage.topic_registry import Topic, TopicRegistry
    from shoal.broker.storage.transaction_markers import TransactionMarkerWriter
    from shoal.broker.upstream.forwarder import Forwarder
    from shoal.coordinator.classic_coordinator import ClassicGroupCoordinator
    from shoal.coordinator.consumer_coordinator import ConsumerGroupCoordinator
    from shoal.coordinator.group_coordinator import GroupCoordinator
    from shoal.coordinator.share_coordinator import ShareCoordinator
    from shoal.coordinator.share_group_coordinator import ShareGroupCoordinator
    from shoal.coordinator.transaction_coordinator import TransactionCoordinator
    from shoal.persister.persister import Persister
    from shoal.protocol.messages import ApiVersionsResponse, RequestHeader

    from .sidecar_group import SidecarGroup


class Broker(Protocol):
    config: BrokerConfig
    node_id: int
    cluster_id: str
    metrics: BrokerMetrics
    authorizer: Authorizer
    scram_credentials: ScramCredentialStore
    ssl_contexts: dict[str, ssl.SSLContext]
    topics: TopicRegistry
    purgatory: Purgatory
    group_configs: GroupConfigs
    client_quotas: ClientQuotaStore
    apis: dict[int, Api]
    # Connections are typed loosely here: the network layer imports this module.
    connection_listeners: list[Callable[[Any], None]]
    # Share-group parts, wired in start() once the internal topics exist (before any request is served).
    share_coordinator: ShareCoordinator
    # Every group type and every committed offset on __consumer_offsets; share_groups, classic_groups and
    # consumer_groups are its parts for each group type.
    group_coordinator: GroupCoordinator
    persister: Persister
    share_partitions: SharePartitionLeaders
    # Where share groups find topics and read records: the local logs, or the upstream's in sidecar mode.
    share_topics: ShareTopicView
    transaction_coordinator: TransactionCoordinator
    transaction_markers: TransactionMarkerWriter
    producer_ids: ProducerIdAllocator

    @property
    def share_groups(self) -> ShareGroupCoordinator: ...

    @property
    def classic_groups(self) -> ClassicGroupCoordinator: ...

    @property
    def consumer_groups(self) -> ConsumerGroupCoordinator: ...

    # Sidecar mode (upstream.bootstrap.servers set): the forwarding to the upstream; None when standalone.
    upstream_forwarder: Forwarder | None
    # Several sidecars: the sidecar group and its ownership view (None standalone).
    sidecar_group: SidecarGroup | None

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def register(self, key: int, min_version: int, max_version: int, handler: Callable[..., Any]) -> None: ...

    def api_versions_fallback(self, header: RequestHeader) -> ApiVersionsResponse: ...

    def api_version_entries(self) -> list[ApiVersionsResponse.ApiVersion]: ...

    def on_connection_opened(self, conn: Any) -> None: ...

    def on_connection_closed(self, conn: Any) -> None: ...

    def track_request(self, task: asyncio.Task[Any]) -> None:
        """A request handler started; it runs to completion even if its connection closes."""
        ...

    def on_group_config_changed(self, group_id: str) -> None: ...

    def on_topic_created(self, topic: Topic) -> None: ...

    def delete_topic(self, topic: Topic) -> None: ...

    def on_log_start_moved(self, topic: Topic, partition: int) -> None: ...

    def advertised_listener(self, name: str) -> Listener: ...

    def finalized_features(self) -> dict[str, int]: ...
