"""The table of APIs this broker serves: each module registers its handlers and version ranges."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import (
    acl_apis,
    alter_configs,
    classic_group_apis,
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
    topic_admin,
)

if TYPE_CHECKING:
    from shoal.broker.apis.broker import Broker


def register_all(broker: Broker) -> None:
    metadata.register(broker)
    produce.register(broker)
    fetch.register(broker)
    leader_epochs.register(broker)
    topic_admin.register(broker)
    alter_configs.register(broker)
    share_fetch.register(broker)
    share_group_apis.register(broker)
    classic_group_apis.register(broker)
    consumer_group_apis.register(broker)
    share_group_admin.register(broker)
    share_state_apis.register(broker)
    sasl_apis.register(broker)
    scram_apis.register(broker)
    acl_apis.register(broker)
