"""What each API family is given: the services its handlers use, listed explicitly.

A handler module declares one frozen dataclass here naming the registry, config, coordinators, persister,
share-partition manager and metrics it reads; the server builds it (`shoal.broker.server.wiring`) and
passes it to the module's `register(table, services)`. Handlers never see the whole broker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig, Listener
    from shoal.broker.common.metrics import BrokerMetrics
    from shoal.broker.common.purgatory import Purgatory
    from shoal.broker.security.authorizer import Authorizer
    from shoal.broker.security.client_quota_manager import ClientQuotas
    from shoal.broker.security.scram import ScramCredentialStore
    from shoal.broker.share.group_configs import GroupConfigs
    from shoal.broker.share.share_partition_leader import SharePartitionLeaders
    from shoal.broker.share.share_topics import ShareTopicView
    from shoal.broker.storage.client_quotas import ClientQuotaStore
    from shoal.broker.storage.partition_budget import PartitionBudget
    from shoal.broker.storage.producer_state import ProducerIdAllocator
    from shoal.broker.storage.topic_registry import Topic, TopicRegistry
    from shoal.broker.storage.transaction_markers import TransactionMarkerWriter
    from shoal.broker.upstream.assignment import Unit
    from shoal.broker.upstream.forwarder import Forwarder
    from shoal.broker.upstream.ownership import Ownership
    from shoal.coordinator.classic_coordinator import ClassicGroupCoordinator
    from shoal.coordinator.consumer_coordinator import ConsumerGroupCoordinator
    from shoal.coordinator.group_coordinator import GroupCoordinator
    from shoal.coordinator.share_coordinator import ShareCoordinator
    from shoal.coordinator.share_group_coordinator import ShareGroupCoordinator
    from shoal.coordinator.transaction_coordinator import TransactionCoordinator
    from shoal.persister.persister import Persister
    from shoal.protocol.codec import MessageBase
    from shoal.protocol.messages import ApiVersionsResponse


# A handler answers `(ctx, request)` with the response body (None: no response, as for acks=0), awaited or
# not. Its parameters are left open because each API takes its own generated request class.
Handler = Callable[..., "Awaitable[MessageBase | None] | MessageBase | None"]


class ApiTable(Protocol):
    """The dispatch table handlers are registered in (the server's `Broker.register`)."""

    def register(self, key: int, min_version: int, max_version: int, handler: Handler) -> None: ...


@dataclass(frozen=True, slots=True)
class DiscoveryServices:
    config: BrokerConfig
    node_id: int
    cluster_id: str
    topics: TopicRegistry
    budget: PartitionBudget
    api_version_entries: Callable[[], list[ApiVersionsResponse.ApiVersion]]
    advertised_listener: Callable[[str], Listener]
    on_topic_created: Callable[[Topic], None]


@dataclass(frozen=True, slots=True)
class ProduceServices:
    config: BrokerConfig
    topics: TopicRegistry
    purgatory: Purgatory
    metrics: BrokerMetrics
    quotas: ClientQuotas
    # KIP-890 part 1: (transactional id, producer id, epoch, (topic, partition)) -> the coordinator's
    # answer to "is this partition in the producer's open transaction?"; None when verification is off.
    verify_txn_partition: Callable[[str, int, int, tuple[str, int]], int] | None = None
    # KIP-890 part 2: Produce v12+ adds its transactional partitions to the producer's transaction; the
    # partitions refused, with their error codes.
    add_txn_partitions: Callable[[Any, Any], Awaitable[dict[tuple[str, int], int]]] | None = None


@dataclass(frozen=True, slots=True)
class FetchServices:
    config: BrokerConfig
    topics: TopicRegistry
    purgatory: Purgatory
    quotas: ClientQuotas


@dataclass(frozen=True, slots=True)
class TopicAdminServices:
    config: BrokerConfig
    node_id: int
    topics: TopicRegistry
    group_configs: GroupConfigs
    budget: PartitionBudget
    on_topic_created: Callable[[Topic], None]
    delete_topic: Callable[[Topic], None]
    on_log_start_moved: Callable[[Topic, int], None]


@dataclass(frozen=True, slots=True)
class ClusterAdminServices:
    config: BrokerConfig
    node_id: int
    topics: TopicRegistry
    client_quotas: ClientQuotaStore
    advertised_listener: Callable[[str], Listener]
    # Finalized feature levels by name, as ApiVersions reports them.
    finalized_features: Callable[[], dict[str, int]]


@dataclass(frozen=True, slots=True)
class AlterConfigsServices:
    config: BrokerConfig
    node_id: int
    topics: TopicRegistry
    group_configs: GroupConfigs
    on_group_config_changed: Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ShareFetchServices:
    config: BrokerConfig
    node_id: int
    # Where share partitions' topics and records come from: the local logs, or the upstream's (sidecar mode).
    topics: ShareTopicView
    purgatory: Purgatory
    group_configs: GroupConfigs
    metrics: BrokerMetrics
    share_partitions: SharePartitionLeaders
    # Called with each connection that closes (its share sessions end with it).
    connection_listeners: list[Callable[[Any], None]]
    # consumer_byte_rate applies to ShareFetch as to Fetch.
    quotas: ClientQuotas


@dataclass(frozen=True, slots=True)
class ShareGroupServices:
    config: BrokerConfig
    share_groups: ShareGroupCoordinator | None
    # Classic and KIP-848 consumer groups share the group-id space, ListGroups, DescribeGroups and DeleteGroups.
    classic_groups: ClassicGroupCoordinator | None
    consumer_groups: ConsumerGroupCoordinator | None


@dataclass(frozen=True, slots=True)
class ShareGroupAdminServices(ShareGroupServices):
    # The topics share groups read: the local registry's, or the upstream's in sidecar mode.
    topics: ShareTopicView
    group_configs: GroupConfigs
    persister: Persister
    share_partitions: SharePartitionLeaders
    # DeleteGroups of every group type.
    group_coordinator: GroupCoordinator | None


@dataclass(frozen=True, slots=True)
class ShareStateServices:
    # None until the share coordinator runs: the RPCs answer COORDINATOR_NOT_AVAILABLE.
    share_coordinator: ShareCoordinator | None


@dataclass(frozen=True, slots=True)
class SaslServices:
    config: BrokerConfig
    scram_credentials: ScramCredentialStore


@dataclass(frozen=True, slots=True)
class ScramServices:
    scram_credentials: ScramCredentialStore


@dataclass(frozen=True, slots=True)
class TransactionServices:
    topics: TopicRegistry
    transaction_coordinator: TransactionCoordinator
    # TxnOffsetCommit goes to the group coordinator, which keeps every committed offset.
    group_coordinator: GroupCoordinator
    producer_ids: ProducerIdAllocator
    markers: TransactionMarkerWriter


@dataclass(frozen=True, slots=True)
class AclServices:
    authorizer: Authorizer


@dataclass(frozen=True, slots=True)
class ClassicGroupServices:
    topics: TopicRegistry
    classic_groups: ClassicGroupCoordinator
    # OffsetCommit/OffsetFetch/OffsetDelete for every group type, and offsets pending in transactions.
    group_coordinator: GroupCoordinator


@dataclass(frozen=True, slots=True)
class ConsumerGroupServices:
    # None only in tests that wire share groups alone: the APIs answer COORDINATOR_NOT_AVAILABLE.
    consumer_groups: ConsumerGroupCoordinator | None


@dataclass(frozen=True, slots=True)
class LeaderEpochServices:
    topics: TopicRegistry


@dataclass(frozen=True, slots=True)
class UpstreamServices:
    """Sidecar mode: what the forwarding handlers use (only built when upstream.bootstrap.servers is set)."""

    node_id: int
    cluster_id: str
    forwarder: Forwarder
    advertised_listener: Callable[[str], Listener]
    # The sidecar's handlers close a client connection's upstream fetch connections with it.
    connection_listeners: list[Callable[[Any], None]]
    # Standalone handlers by API key: share groups are the sidecar's own, so their GROUP configs
    # (DescribeConfigs, IncrementalAlterConfigs) and ListGroups, DescribeGroups and DeleteGroups for them are
    # answered here, not by the upstream.
    local_handlers: dict[int, Callable[..., object]] = field(default_factory=dict)
    # Where share fetches park: a produce through the sidecar wakes those waiting on its partitions.
    purgatory: Purgatory | None = None
    # Whether a group id names one of the sidecar's share groups.
    share_group_exists: Callable[[str], bool] = lambda _group_id: False
    # Several sidecars: who leads each upstream partition and where every sidecar is (None: this one alone).
    ownership: Ownership | None = None


@dataclass(frozen=True, slots=True)
class SidecarGroupServices:
    """Several sidecars: the answers that name an owner (coordinators, the cluster's brokers) and the
    requests served only by the owner of their unit (share groups, share-state RPCs)."""

    node_id: int
    cluster_id: str
    ownership: Ownership
    # Kafka's placement of a key on a state topic: a group id, and a share partition's state.
    group_unit: Callable[[str], Unit]
    state_unit: Callable[[str, bytes, int], Unit]
    # The standalone handlers these answers start from, by API key.
    local_handlers: dict[int, Callable[..., object]]
