"""Sidecar mode: the broker's own records produced to an upstream partition with acks=all (dead letters,
group configs), retried while a leader moves or a just-created topic settles."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from shoal.broker.storage.partition_source import SourceUnavailable
from shoal.protocol import messages
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from .forwarder import Forwarder

PRODUCE_VERSION = 9
# Retried produce answers (leadership moving, a topic just created), and the waits between tries.
RETRIED = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                     ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT})
BACKOFF_S = (0.1, 0.5, 1.0, None)


class UpstreamProduceFailed(Exception):
    """The upstream did not take the records; `error_code` is its last answer (REQUEST_TIMED_OUT when it did
    not answer)."""

    def __init__(self, message: str, error_code: int):
        super().__init__(message)
        self.error_code = error_code


async def produce_acks_all(forwarder: Forwarder, topic: str, partition: int, batches: bytes, *,
                           timeout_ms: int, what: str = "records") -> int:
    """Produce `batches` with acks=all; the base offset the upstream gave them. Raises UpstreamProduceFailed
    once the retries are spent, on an answer no retry changes, or when the upstream does not answer."""
    part = messages.ProduceRequest.PartitionProduceData(index=partition, records=batches)
    request = messages.ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=timeout_ms,
        topic_data=[messages.ProduceRequest.TopicProduceData(name=topic, partition_data=[part])])
    for backoff_s in BACKOFF_S:
        try:
            response = await forwarder.produce(request, PRODUCE_VERSION)
        except SourceUnavailable as exc:
            raise UpstreamProduceFailed(f"the upstream did not take the {what} for {topic}-{partition}: {exc}",
                                        ErrorCode.REQUEST_TIMED_OUT) from exc
        assert response is not None  # acks=all is answered
        answers = [p for t in response.responses for p in t.partition_responses]
        code = next((p.error_code for p in answers if p.error_code != ErrorCode.NONE), ErrorCode.NONE)
        if code == ErrorCode.NONE and answers:
            return int(answers[0].base_offset)
        if code == ErrorCode.NONE:
            code = ErrorCode.UNKNOWN_SERVER_ERROR  # an answer without the partition
        if code not in RETRIED or backoff_s is None:
            raise UpstreamProduceFailed(f"the upstream refused the {what} for {topic}-{partition}: error {code}",
                                        code)
        await asyncio.sleep(backoff_s)
    raise AssertionError("unreachable: the last backoff is None")
