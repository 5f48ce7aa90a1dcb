"""The five share-group-state RPCs of KIP-932 under short names, and the shape they share.

The share coordinator serves them and the default persister sends them. Both see a request as a group,
its topics and their partitions, and a response as results per topic with their partitions, whatever
else each RPC carries per partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from . import messages
from .codec import MessageBase

InitializeRequest = messages.InitializeShareGroupStateRequest
InitializeResponse = messages.InitializeShareGroupStateResponse
ReadRequest = messages.ReadShareGroupStateRequest
ReadResponse = messages.ReadShareGroupStateResponse
WriteRequest = messages.WriteShareGroupStateRequest
WriteResponse = messages.WriteShareGroupStateResponse
DeleteRequest = messages.DeleteShareGroupStateRequest
DeleteResponse = messages.DeleteShareGroupStateResponse
SummaryRequest = messages.ReadShareGroupStateSummaryRequest
SummaryResponse = messages.ReadShareGroupStateSummaryResponse


class StatePartition(Protocol):
    """One partition's entry, in a request or a response."""

    @property
    def partition(self) -> int: ...


P_co = TypeVar("P_co", bound=StatePartition, covariant=True)


class StateTopic(Protocol[P_co]):
    @property
    def topic_id(self) -> bytes: ...

    @property
    def partitions(self) -> Sequence[P_co]: ...


class StateRequest(Protocol[P_co]):
    @property
    def group_id(self) -> str: ...

    @property
    def topics(self) -> Sequence[StateTopic[P_co]]: ...


class StateResponse(Protocol[P_co]):
    @property
    def results(self) -> Sequence[StateTopic[P_co]]: ...


Error = tuple[int, str | None]  # (error code, error message)

# Each response class with the class of its per-topic result.
_RESULT_CLASSES: dict[type[MessageBase], Any] = {
    InitializeResponse: InitializeResponse.InitializeStateResult,
    ReadResponse: ReadResponse.ReadStateResult,
    WriteResponse: WriteResponse.WriteStateResult,
    DeleteResponse: DeleteResponse.DeleteStateResult,
    SummaryResponse: SummaryResponse.ReadStateSummaryResult,
}

StateResponseT = TypeVar(
    "StateResponseT", InitializeResponse, ReadResponse, WriteResponse, DeleteResponse, SummaryResponse
)


def error_response(
    response_cls: type[StateResponseT], request: StateRequest[StatePartition], errors: Sequence[Sequence[Error]]
) -> StateResponseT:
    """The response answering each partition of `request` with just an error code and message
    (`errors[topic][partition]`, in request order)."""
    result_cls = _RESULT_CLASSES[response_cls]
    partition_cls: Any = response_cls.PartitionResult
    return response_cls(results=[
        result_cls(topic_id=t.topic_id, partitions=[
            partition_cls(partition=p.partition, error_code=code, error_message=message)
            for p, (code, message) in zip(t.partitions, topic_errors, strict=True)
        ])
        for t, topic_errors in zip(request.topics, errors, strict=True)
    ])


def same_error(request: StateRequest[StatePartition], code: int, message: str | None = None) -> list[list[Error]]:
    """One error for every partition of `request`, shaped for `error_response`."""
    return [[(code, message)] * len(t.partitions) for t in request.topics]
