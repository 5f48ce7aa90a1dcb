"""Builds each API family's services from the broker's parts and registers its handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from shoal.broker.apis import (
    acl_apis,
    alter_configs,
    classic_group_apis,
    cluster_admin,
    consumer_group_apis,
    fetch,
    leader_epochs,
    metadata,
    produce,
    sasl_apis,
    scram_apis,
    share_fetch,
    share_group_admin,
    share_group_apis,
    share_state_apis,
    sidecar_group_apis,
    topic_admin,
    txn_apis,
    upstream_apis,
)
from shoal.broker.apis.services import (
    AclServices,
    AlterConfigsServices,
    ClassicGroupServices,
    ClusterAdminServices,
    ConsumerGroupServices,
    DiscoveryServices,
    FetchServices,
    LeaderEpochServices,
    ProduceServices,
    SaslServices,
    ScramServices,
    ShareFetchServices,
    ShareGroupAdminServices,
    ShareGroupServices,
    ShareStateServices,
    SidecarGroupServices,
    TopicAdminServices,
    TransactionServices,
    UpstreamServices,
)
from shoal.broker.security.client_quota_manager import ClientQuotas
from shoal.broker.storage.partition_budget import PartitionBudget
from shoal.protocol.api_keys import ApiKey

if TYPE_CHECKING:
    from .broker_view import (
        Broker,  # what wiring reads of the server's Broker (importing that would be a cycle)
    )


def register_all(b: Broker) -> None:
    """Runs once the share-group parts exist (start() wires them first)."""
    budget = PartitionBudget(b.config, b.topics)
    metadata.register(b, DiscoveryServices(b.config, b.node_id, b.cluster_id, b.topics, budget,
                                           b.api_version_entries, b.advertised_listener, b.on_topic_created))
    coordinator = b.transaction_coordinator
    verify = (lambda txn_id, pid, epoch, tp: coordinator.verify_partitions(txn_id, pid, epoch, [tp])[tp]) if (
        b.config["transaction.partition.verification.enable"]) else None
    quotas = ClientQuotas(b.client_quotas, b.config["quota.window.num"], b.config["quota.window.size.seconds"],
                          metrics=b.metrics)
    def add_txn_partitions(ctx: Any, req: Any) -> Awaitable[dict[tuple[str, int], int]]:
        return txn_apis.add_produce_partitions(coordinator, b.topics, ctx, req)

    produce.register(b, ProduceServices(b.config, b.topics, b.purgatory, b.metrics, quotas, verify,
                                        add_txn_partitions))
    fetch.register(b, FetchServices(b.config, b.topics, b.purgatory, quotas))
    topic_admin.register(b, TopicAdminServices(b.config, b.node_id, b.topics, b.group_configs, budget,
                                               b.on_topic_created, b.delete_topic, b.on_log_start_moved))
    cluster_admin.register(b, ClusterAdminServices(b.config, b.node_id, b.topics, b.client_quotas, b.advertised_listener,
                                                   b.finalized_features))
    alter_configs.register(b, AlterConfigsServices(b.config, b.node_id, b.topics, b.group_configs, b.on_group_config_changed))
    share_fetch.register(b, ShareFetchServices(b.config, b.node_id, b.share_topics, b.purgatory, b.group_configs,
                                               b.metrics, b.share_partitions, b.connection_listeners, quotas))
    share_group_apis.register(b, ShareGroupServices(b.config, b.share_groups, b.classic_groups, b.consumer_groups))
    classic_group_apis.register(b, ClassicGroupServices(b.topics, b.classic_groups, b.group_coordinator))
    consumer_group_apis.register(b, ConsumerGroupServices(b.consumer_groups))
    leader_epochs.register(b, LeaderEpochServices(b.topics))
    share_group_admin.register(b, ShareGroupAdminServices(b.config, b.share_groups, b.classic_groups, b.consumer_groups,
                                                          b.share_topics,
                                                          b.group_configs, b.persister, b.share_partitions,
                                                          b.group_coordinator))
    share_state_apis.register(b, ShareStateServices(b.share_coordinator))
    sasl_apis.register(b, SaslServices(b.config, b.scram_credentials))
    scram_apis.register(b, ScramServices(b.scram_credentials))
    acl_apis.register(b, AclServices(b.authorizer))
    txn_apis.register(b, TransactionServices(b.topics, b.transaction_coordinator, b.group_coordinator, b.producer_ids,
                                             b.transaction_markers))
    if b.upstream_forwarder is not None:
        # Sidecar mode: these handlers replace the standalone ones for the APIs the upstream serves.
        local: dict[int, Callable[..., Any]] = {key: b.apis[key].handler for key in (
            ApiKey.DESCRIBE_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ALTER_CONFIGS, ApiKey.LIST_GROUPS,
            ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS)}
        share_groups = b.share_groups
        group = b.sidecar_group
        upstream_apis.register(b, UpstreamServices(b.node_id, b.cluster_id, b.upstream_forwarder,
                                                   b.advertised_listener, b.connection_listeners, local,
                                                   b.purgatory, lambda group_id: group_id in share_groups.groups,
                                                   ownership=None if group is None else group.ownership))
        # An API the upstream does not serve at all is not advertised, as a Kafka broker advertises only what
        # it serves: clients then do without it (librdkafka skips offset validation without
        # OffsetForLeaderEpoch; a KIP-848 consumer reports the missing ConsumerGroupHeartbeat) instead of
        # retrying against an upstream that can never answer (Tansu serves neither).
        for key in b.upstream_forwarder.cluster.unserved(upstream_apis.UPSTREAM_ONLY_APIS):
            del b.apis[key]
        if group is not None:
            # Several sidecars: answers naming an owner, and requests only the owner serves.
            wrapped = sidecar_group_apis.wrapped_keys()
            sidecar_group_apis.register(b, SidecarGroupServices(
                b.node_id, b.cluster_id, group.ownership, group.group_unit, group.state_unit,
                {key: b.apis[key].handler for key in wrapped if key in b.apis}),
                {key: (b.apis[key].min_version, b.apis[key].max_version) for key in wrapped if key in b.apis})
