"""The share coordinator as the default persister reaches it inside one broker process."""

from __future__ import annotations

from shoal.protocol.share_state_rpcs import (
    DeleteRequest,
    DeleteResponse,
    InitializeRequest,
    InitializeResponse,
    ReadRequest,
    ReadResponse,
    SummaryRequest,
    SummaryResponse,
    WriteRequest,
    WriteResponse,
)

from .share_coordinator import ShareCoordinator


class InProcessShareCoordinatorClient:
    """Hands requests straight to this process's share coordinator (no encoding: nothing crosses a wire,
    so the version does not matter)."""

    def __init__(self, coordinator: ShareCoordinator):
        self.coordinator = coordinator

    async def initialize_state(self, request: InitializeRequest, version: int) -> InitializeResponse:
        return await self.coordinator.initialize_state(request)

    async def read_state(self, request: ReadRequest, version: int) -> ReadResponse:
        return await self.coordinator.read_state(request)

    async def write_state(self, request: WriteRequest, version: int) -> WriteResponse:
        return await self.coordinator.write_state(request)

    async def delete_state(self, request: DeleteRequest, version: int) -> DeleteResponse:
        return await self.coordinator.delete_state(request)

    async def read_state_summary(self, request: SummaryRequest, version: int) -> SummaryResponse:
        return await self.coordinator.read_state_summary(request)
