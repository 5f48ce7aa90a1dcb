"""The share coordinator as the default persister reaches it inside one broker process."""

from __future__ import annotations

from typing import Any

from shoal.protocol.api_keys import ApiKey

from .share_coordinator import ShareCoordinator


class InProcessShareCoordinatorClient:
    """Hands requests straight to this process's share coordinator (no encoding: nothing crosses a wire)."""

    def __init__(self, coordinator: ShareCoordinator):
        self.coordinator = coordinator

    async def send(self, api_key: int, version: int, request: Any) -> Any:
        c = self.coordinator
        if api_key == ApiKey.INITIALIZE_SHARE_GROUP_STATE:
            return await c.initialize_state(request)
        if api_key == ApiKey.READ_SHARE_GROUP_STATE:
            return await c.read_state(request)
        if api_key == ApiKey.WRITE_SHARE_GROUP_STATE:
            return await c.write_state(request)
        if api_key == ApiKey.DELETE_SHARE_GROUP_STATE:
            return await c.delete_state(request)
        if api_key == ApiKey.READ_SHARE_GROUP_STATE_SUMMARY:
            return await c.read_state_summary(request)
        raise ValueError(f"api key {api_key} is not a share-group-state RPC")
