"""The default persister: each persister call becomes one share-group-state RPC to the share coordinator.

Requests are the real wire messages (InitializeShareGroupState etc.), so the same persister works over
an in-process client (a single broker hosting its own share coordinator) or a client that sends the
bytes to another broker. Error codes come back untranslated; mapping them to client-visible errors is
the share-partition leader's job.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, TypeVar

from shoal.protocol.errors import ErrorCode
from shoal.protocol.share_state_rpcs import (
    DeleteRequest,
    DeleteResponse,
    InitializeRequest,
    InitializeResponse,
    ReadRequest,
    ReadResponse,
    StatePartition,
    StateResponse,
    SummaryRequest,
    SummaryResponse,
    WriteRequest,
    WriteResponse,
)

from .persister import (
    PersistedStateBatch,
    ReadStateResult,
    SharePartitionKey,
    StateSummary,
    WriteStateRequest,
)


class ShareCoordinatorClient(Protocol):
    """The five state RPCs, each sent at `version` to the share coordinator owning the request's key."""

    async def initialize_state(self, request: InitializeRequest, version: int) -> InitializeResponse: ...

    async def read_state(self, request: ReadRequest, version: int) -> ReadResponse: ...

    async def write_state(self, request: WriteRequest, version: int) -> WriteResponse: ...

    async def delete_state(self, request: DeleteRequest, version: int) -> DeleteResponse: ...

    async def read_state_summary(self, request: SummaryRequest, version: int) -> SummaryResponse: ...


PR = TypeVar("PR", bound=StatePartition)


class DefaultStatePersister:
    """Implements the `Persister` protocol over a `ShareCoordinatorClient`."""

    def __init__(self, client: ShareCoordinatorClient, *, write_version: int = 1, summary_version: int = 1):
        # v1 of Write / ReadSummary carries DeliveryCompleteCount (KIP-1226); a peer that only speaks v0
        # can be served by passing 0.
        self.client = client
        self.write_version = write_version
        self.summary_version = summary_version

    @staticmethod
    async def _answer(call: Awaitable[StateResponse[PR]], key: SharePartitionKey) -> PR | int:
        """The response's entry for `key`, or an int error code if the call itself failed."""
        try:
            response = await call
        except (ConnectionError, TimeoutError, OSError):
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        for result in response.results:
            if result.topic_id != key.topic_id:
                continue
            for p in result.partitions:
                if p.partition == key.partition:
                    return p
        return int(ErrorCode.UNKNOWN_SERVER_ERROR)  # the coordinator did not answer for our key

    async def initialize_state(self, key: SharePartitionKey, state_epoch: int, start_offset: int) -> int:
        req = InitializeRequest(group_id=key.group_id, topics=[InitializeRequest.InitializeStateData(
            topic_id=key.topic_id,
            partitions=[InitializeRequest.PartitionData(
                partition=key.partition, state_epoch=state_epoch, start_offset=start_offset)],
        )])
        p = await self._answer(self.client.initialize_state(req, 0), key)
        return p if isinstance(p, int) else int(p.error_code)

    async def read_state(self, key: SharePartitionKey, leader_epoch: int) -> ReadStateResult:
        req = ReadRequest(group_id=key.group_id, topics=[ReadRequest.ReadStateData(
            topic_id=key.topic_id,
            partitions=[ReadRequest.PartitionData(partition=key.partition, leader_epoch=leader_epoch)],
        )])
        p = await self._answer(self.client.read_state(req, 0), key)
        if isinstance(p, int):
            return ReadStateResult(error_code=p)
        if p.error_code != ErrorCode.NONE:
            return ReadStateResult(error_code=p.error_code, error_message=p.error_message)
        return ReadStateResult(
            error_code=p.error_code,
            error_message=p.error_message,
            state_epoch=p.state_epoch,
            start_offset=p.start_offset,
            state_batches=[
                PersistedStateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                for b in p.state_batches
            ],
        )

    async def write_state(self, request: WriteStateRequest) -> int:
        key = request.key
        req = WriteRequest(group_id=key.group_id, topics=[WriteRequest.WriteStateData(
            topic_id=key.topic_id,
            partitions=[WriteRequest.PartitionData(
                partition=key.partition,
                state_epoch=request.state_epoch,
                leader_epoch=request.leader_epoch,
                start_offset=request.start_offset,
                delivery_complete_count=request.delivery_complete_count,
                state_batches=[
                    WriteRequest.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                            delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                    for b in request.state_batches
                ],
            )],
        )])
        p = await self._answer(self.client.write_state(req, self.write_version), key)
        return p if isinstance(p, int) else int(p.error_code)

    async def delete_state(self, key: SharePartitionKey) -> int:
        req = DeleteRequest(group_id=key.group_id, topics=[DeleteRequest.DeleteStateData(
            topic_id=key.topic_id, partitions=[DeleteRequest.PartitionData(partition=key.partition)],
        )])
        p = await self._answer(self.client.delete_state(req, 0), key)
        return p if isinstance(p, int) else int(p.error_code)

    async def read_state_summary(self, key: SharePartitionKey, leader_epoch: int) -> StateSummary:
        req = SummaryRequest(group_id=key.group_id, topics=[SummaryRequest.ReadStateSummaryData(
            topic_id=key.topic_id,
            partitions=[SummaryRequest.PartitionData(partition=key.partition, leader_epoch=leader_epoch)],
        )])
        p = await self._answer(self.client.read_state_summary(req, self.summary_version), key)
        if isinstance(p, int):
            return StateSummary(error_code=p)
        if p.error_code != ErrorCode.NONE:
            return StateSummary(error_code=p.error_code, error_message=p.error_message)
        return StateSummary(
            error_code=p.error_code,
            error_message=p.error_message,
            state_epoch=p.state_epoch,
            leader_epoch=p.leader_epoch,
            start_offset=p.start_offset,
            # v0 has no such field; the decoder's default (-1) then means "unknown".
            delivery_complete_count=p.delivery_complete_count,
        )
