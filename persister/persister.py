"""The persister: the seam between share-partition leaders (and the group coordinator) and durable share state.

Shapes are per share partition, as leaders use them; the default implementation batches nothing and
maps each call onto one state RPC to the share coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SharePartitionKey:
    group_id: str
    topic_id: bytes
    partition: int


@dataclass(frozen=True, slots=True)
class PersistedStateBatch:
    first_offset: int
    last_offset: int
    delivery_state: int  # 0 AVAILABLE, 2 ACKNOWLEDGED, 3 ARCHIVING, 4 ARCHIVED (ACQUIRED is never persisted)
    delivery_count: int


@dataclass(slots=True)
class ReadStateResult:
    error_code: int
    error_message: str | None = None
    state_epoch: int = 0
    start_offset: int = -1
    state_batches: list[PersistedStateBatch] = field(default_factory=list)


@dataclass(slots=True)
class StateSummary:
    error_code: int
    error_message: str | None = None
    state_epoch: int = 0
    leader_epoch: int = 0
    start_offset: int = -1
    delivery_complete_count: int = -1


@dataclass(slots=True)
class WriteStateRequest:
    key: SharePartitionKey
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    state_batches: list[PersistedStateBatch]


class Persister(Protocol):
    async def initialize_state(self, key: SharePartitionKey, state_epoch: int, start_offset: int) -> int:
        """Create (or reset) a share partition's state; returns an error code."""
        ...

    async def read_state(self, key: SharePartitionKey, leader_epoch: int) -> ReadStateResult: ...

    async def write_state(self, request: WriteStateRequest) -> int:
        """Durably record changed state batches and the start offset; returns an error code."""
        ...

    async def delete_state(self, key: SharePartitionKey) -> int: ...

    async def read_state_summary(self, key: SharePartitionKey, leader_epoch: int) -> StateSummary: ...
