"""OffsetForLeaderEpoch: where a leader epoch ended, which consumers use to validate their positions.

This broker has led every partition since its creation in one epoch, 0 (what Metadata reports), so
epoch 0 ends at the log end; any other epoch is unknown to the partition's epoch history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, LeaderEpochServices
    from shoal.broker.network.connection import RequestContext

LEADER_EPOCH = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

Response = messages.OffsetForLeaderEpochResponse
_Topic = Response.OffsetForLeaderTopicResult
_Partition = Response.EpochEndOffset


class LeaderEpochHandlers:
    def __init__(self, services: LeaderEpochServices):
        self.services = services

    def offset_for_leader_epoch(self, ctx: RequestContext, req: messages.OffsetForLeaderEpochRequest) -> messages.OffsetForLeaderEpochResponse:
        topics = []
        for t in req.topics or ():
            topic = self.services.topics.get(t.topic)
            allowed = ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t.topic)
            parts = []
            for p in t.partitions or ():
                if not allowed:
                    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif topic is None or not 0 <= p.partition < len(topic.partitions):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif p.current_leader_epoch >= 0 and p.current_leader_epoch < LEADER_EPOCH:
                    code = ErrorCode.FENCED_LEADER_EPOCH
                elif p.current_leader_epoch > LEADER_EPOCH:
                    code = ErrorCode.UNKNOWN_LEADER_EPOCH
                else:
                    code = ErrorCode.NONE
                if code != ErrorCode.NONE or topic is None:
                    parts.append(_Partition(error_code=code, partition=p.partition, leader_epoch=UNDEFINED_EPOCH,
                                            end_offset=UNDEFINED_EPOCH_OFFSET))
                elif p.leader_epoch == LEADER_EPOCH:
                    parts.append(_Partition(error_code=ErrorCode.NONE, partition=p.partition, leader_epoch=LEADER_EPOCH,
                                            end_offset=topic.partitions[p.partition].log_end_offset))
                else:
                    parts.append(_Partition(error_code=ErrorCode.NONE, partition=p.partition,
                                            leader_epoch=UNDEFINED_EPOCH, end_offset=UNDEFINED_EPOCH_OFFSET))
            topics.append(_Topic(topic=t.topic, partitions=parts))
        return Response(topics=topics)


def register(table: ApiTable, services: LeaderEpochServices) -> LeaderEpochHandlers:
    h = LeaderEpochHandlers(services)
    table.register(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, h.offset_for_leader_epoch)
    return h
