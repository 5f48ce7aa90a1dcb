"""The five share-group-state RPCs of KIP-932 under short names, and the shape they share.

The share coordinator serves them and the default persister sends them. Both see a request as a group,
its topics and their partitions, and a response as results per topic with their partitions, whatever
else each RPC carries per partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from . import messages

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
