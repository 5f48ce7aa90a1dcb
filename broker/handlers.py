"""The table of APIs this broker serves: each module registers its handlers and version ranges."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import alter_configs, fetch, metadata, produce, topic_admin

if TYPE_CHECKING:
    from .server import Broker


def register_all(broker: Broker) -> None:
    metadata.register(broker)
    produce.register(broker)
    fetch.register(broker)
    topic_admin.register(broker)
    alter_configs.register(broker)
