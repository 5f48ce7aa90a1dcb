"""Fetch (consumer side): stored batches served as they are on disk, with MaxWaitMs/MinBytes long polling.

Byte limits as Kafka's ReplicaManager.readFromLog: the first partition with records gets at least one whole
batch, past PartitionMaxBytes and MaxBytes; every later one gets whole batches within its PartitionMaxBytes and
what is left of MaxBytes, or none. (Kafka may end a partition's records with a cut batch the client drops;
Shoal stops before it.)

With isolation_level=1 (read_committed) reads stop at the last stable offset and the response lists the
aborted transactions in the range read, so the client drops their records (Kafka's FetchIsolation.TXN_COMMITTED).

Shoal does not create incremental fetch sessions: every response is a full one with SessionId 0,
which Kafka's protocol allows (a broker may always decline to create a session).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from shoal.broker.common.purgatory import LogKey
from shoal.broker.security.authorizer import Operation, ResourceType
from shoal.broker.storage.partition_log import OffsetOutOfRange
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, FetchServices
    from shoal.broker.network.connection import RequestContext

FetchResponse = messages.FetchResponse
TopicData = FetchResponse.FetchableTopicResponse
PartitionData = FetchResponse.PartitionData
AbortedTransaction = FetchResponse.AbortedTransaction
READ_COMMITTED = 1


class FetchHandler:
    def __init__(self, services: FetchServices):
        self.services = services
        self.broker_max_bytes = int(services.config["fetch.max.bytes"])

    async def handle(self, ctx: RequestContext, req: messages.FetchRequest) -> messages.FetchResponse:
        version = ctx.api_version
        if req.session_epoch > 0 or req.session_id != 0:
            # We never hand out fetch sessions, so an incremental request names one we do not have.
            return FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        await self._load_producer_states(req, version)
        while True:
            response, total, keys = self._read_all(ctx, req, version)
            remaining = deadline - time.monotonic()
            if total >= req.min_bytes or remaining <= 0 or not keys or ctx.connection.closed:
                throttle_ms = self.services.quotas.throttle_fetch(ctx, response, ApiKey.FETCH, version)
                if throttle_ms > 0:
                    # Over quota: Kafka answers with no data at all and the throttle time.
                    return FetchResponse(throttle_time_ms=throttle_ms, error_code=ErrorCode.NONE, session_id=0,
                                         responses=[])
                return response
            await self.services.purgatory.wait([*keys, ctx.connection.wake_key], remaining)

    async def _load_producer_states(self, req: messages.FetchRequest, version: int) -> None:
        """The last stable offset every fetch reports needs a partition's producer state once it has seen a
        transaction; the first fetch after a restart builds it here, in slices, rather than in one stall
        of the event loop inside `_read_all`."""
        topics = self.services.topics
        for ft in req.topics:
            topic = topics.get_by_id(ft.topic_id) if version >= 13 else topics.get(ft.topic)
            if topic is None:
                continue
            for fp in ft.partitions:
                if 0 <= fp.partition < len(topic.partitions):
                    await topic.partitions[fp.partition].load_producer_state(only_for_transactions=True)

    def _read_all(
        self, ctx: RequestContext, req: messages.FetchRequest, version: int
    ) -> tuple[messages.FetchResponse, int, list[LogKey]]:
        topics = self.services.topics
        # As Kafka: never more than the consumer's quota allows in one window, which would throttle it for sure.
        budget = int(min(req.max_bytes if version >= 3 else 2**31 - 1, self.broker_max_bytes,
                         self.services.quotas.fetch_max_bytes(ctx)))
        total = 0
        keys: list[LogKey] = []
        out = []
        read_committed = req.isolation_level == READ_COMMITTED
        for ft in req.topics:
            topic = topics.get_by_id(ft.topic_id) if version >= 13 else topics.get(ft.topic)
            # Once per topic, as Kafka does, not once per partition.
            authorized = topic is not None and ctx.authorize(Operation.READ, ResourceType.TOPIC, topic.name)
            parts = []
            for fp in ft.partitions:
                pd = PartitionData(
                    partition_index=fp.partition,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=b"",
                )
                parts.append(pd)
                if topic is None:
                    pd.error_code = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not authorized:
                    pd.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                if not 0 <= fp.partition < len(topic.partitions):
                    pd.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                plog = topic.partitions[fp.partition]
                pd.high_watermark = plog.high_watermark
                lso = plog.last_stable_offset
                pd.last_stable_offset = lso
                pd.log_start_offset = plog.log_start_offset
                keys.append(LogKey(topic.topic_id, fp.partition))
                # As Kafka's readFromLog: until a partition returned data, one whole batch is returned past both
                # limits, so a huge batch cannot stall a consumer; after that each partition gets whole batches
                # within min(its PartitionMaxBytes, what is left of MaxBytes), and none when its next batch is larger.
                # A partition past the limits is still read with nothing to return, so its offset is checked.
                try:
                    data = plog.read(fp.fetch_offset, max(0, min(fp.partition_max_bytes, budget)),
                                     max_offset=lso if read_committed else None, min_one=total == 0)
                except OffsetOutOfRange:
                    pd.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                    continue
                if read_committed:
                    # A partition that never saw a transaction has none aborted; asking its producer state
                    # would build it first, reading up to 64 MiB of log inside this request.
                    pd.aborted_transactions = [
                        AbortedTransaction(producer_id=t.producer_id, first_offset=t.first_offset)
                        for t in plog.aborted_transactions(fp.fetch_offset, lso)
                    ] if data else []
                pd.records = data
                total += len(data)
                budget -= len(data)
            name = topic.name if topic is not None else ft.topic
            out.append(TopicData(topic=name, topic_id=ft.topic_id, partitions=parts))
        return FetchResponse(error_code=ErrorCode.NONE, session_id=0, responses=out), total, keys


def register(table: ApiTable, services: FetchServices) -> FetchHandler:
    handler = FetchHandler(services)
    table.register(ApiKey.FETCH, 4, 17, handler.handle)
    return handler


