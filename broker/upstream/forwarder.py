"""Forwarding a client's request to the upstream: the routing below the sidecar's handlers.

Per-partition requests (Produce, Fetch, ListOffsets, DeleteRecords) are split by the upstream leader of
each partition, sent to every leader at once and merged back in the client's order; the record batches
inside stay the bytes the client sent or the upstream returned. Group and transaction requests go to the
upstream coordinator of their key. The upstream's error codes reach the client unchanged; leadership
errors also make Shoal re-read the upstream's metadata, so the client's retry goes to the new leader.
Anything that names an upstream broker (current leader hints, node endpoints, preferred read replicas)
is cleared: clients only ever see Shoal.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import structlog

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.codec import MessageBase
from shoal.protocol.errors import ErrorCode

from .cluster import (
    COORDINATOR_ERRORS,
    KEY_TYPE_GROUP,
    KEY_TYPE_TRANSACTION,
    LEADERSHIP_ERRORS,
    SHARED_LANE,
    CoordinatorLookupFailed,
    Lane,
    UpstreamCluster,
    UpstreamUnavailable,
)

log = structlog.get_logger("shoal.upstream")

# What a client gets for a partition whose upstream leader could not be reached: retriable, and it makes
# the client refresh its metadata before retrying.
UNREACHABLE = ErrorCode.NOT_LEADER_OR_FOLLOWER


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where a per-partition API keeps its topics and partitions, in its request and its response."""

    req_topics: str
    req_name: str
    req_parts: str
    req_index: str
    resp_topics: str
    resp_name: str
    resp_parts: str
    resp_index: str
    topic_cls: type[MessageBase]
    error_partition: Callable[[int, int], MessageBase]


_Produce = messages.ProduceResponse
_Fetch = messages.FetchResponse
_ListOffsets = messages.ListOffsetsResponse
_DeleteRecords = messages.DeleteRecordsResponse

PRODUCE = _Shape("topic_data", "name", "partition_data", "index",
                 "responses", "name", "partition_responses", "index", _Produce.TopicProduceResponse,
                 lambda i, code: _Produce.PartitionProduceResponse(index=i, error_code=code, base_offset=-1))
FETCH = _Shape("topics", "topic", "partitions", "partition",
               "responses", "topic", "partitions", "partition_index", _Fetch.FetchableTopicResponse,
               lambda i, code: _Fetch.PartitionData(partition_index=i, error_code=code, high_watermark=-1,
                                                    last_stable_offset=-1, log_start_offset=-1, records=None))
LIST_OFFSETS = _Shape("topics", "name", "partitions", "partition_index",
                      "topics", "name", "partitions", "partition_index", _ListOffsets.ListOffsetsTopicResponse,
                      lambda i, code: _ListOffsets.ListOffsetsPartitionResponse(
                          partition_index=i, error_code=code, timestamp=-1, offset=-1, leader_epoch=-1))
DELETE_RECORDS = _Shape("topics", "name", "partitions", "partition_index",
                        "topics", "name", "partitions", "partition_index", _DeleteRecords.DeleteRecordsTopicResult,
                        lambda i, code: _DeleteRecords.DeleteRecordsPartitionResult(
                            partition_index=i, error_code=code, low_watermark=-1))
_Epochs = messages.OffsetForLeaderEpochResponse
OFFSET_FOR_LEADER_EPOCH = _Shape("topics", "topic", "partitions", "partition",
                                 "topics", "topic", "partitions", "partition", _Epochs.OffsetForLeaderTopicResult,
                                 lambda i, code: _Epochs.EpochEndOffset(partition=i, error_code=code, leader_epoch=-1,
                                                                        end_offset=-1))


class Forwarder:
    def __init__(self, cluster: UpstreamCluster):
        self.cluster = cluster
        # The last high watermark, LSO and log start offset seen per partition, for the partitions a fetch
        # answers before their leader did (see _forward_partitions).
        self._watermarks: dict[tuple[str | None, int], tuple[int, int, int]] = {}

    # ---- per-partition requests ----------------------------------------------------------------

    async def _split(self, req: MessageBase, shape: _Shape) -> tuple[dict[int, list[Any]], set[tuple[str | None, int]]]:
        """The request's topics cut per upstream leader, and the partitions no leader is known for (after
        one metadata refresh for their topics)."""
        for attempt in range(2):
            by_node: dict[int, dict[int, MessageBase]] = {}
            unroutable: set[tuple[str | None, int]] = set()
            for t in getattr(req, shape.req_topics):
                name = self.cluster.topic_name(getattr(t, shape.req_name), getattr(t, "topic_id", None))
                for p in getattr(t, shape.req_parts):
                    index = getattr(p, shape.req_index)
                    node = self.cluster.leader(name, index)
                    if node < 0:
                        unroutable.add((name, index))
                        continue
                    topics = by_node.setdefault(node, {})
                    part_topic = topics.get(id(t))
                    if part_topic is None:
                        part_topic = topics[id(t)] = copy.copy(t)
                        setattr(part_topic, shape.req_parts, [])
                        # A topic the client named by id also gets its name, for an upstream older than ids.
                        if not getattr(part_topic, shape.req_name):
                            setattr(part_topic, shape.req_name, name)
                    getattr(part_topic, shape.req_parts).append(p)
            if not unroutable or attempt:
                break
            names = {n for n, _ in unroutable if n is not None}
            try:
                if names:
                    await self.cluster.refresh_metadata(names)
                elif any(n is None for n, _ in unroutable):
                    await self.cluster.refresh_metadata()  # a topic id Shoal has not seen yet
            except UpstreamUnavailable:
                break
        return {node: list(topics.values()) for node, topics in by_node.items()}, unroutable

    async def _forward_partitions(self, api_key: int, req: MessageBase, version: int, shape: _Shape,
                                  build: Callable[[list[Any]], MessageBase], lane: Hashable,
                                  unknown_code: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  enough: Callable[[Any], bool] | None = None,
                                  pending: Callable[[str | None, int], MessageBase] | None = None,
                                  ) -> tuple[MessageBase, list[Any]]:
        """Send each leader its part; returns (a template response, the merged response topics).

        With `enough`, the answer does not wait for every leader: once one leader's response satisfies it,
        the partitions of leaders still long-polling are answered by `pending` (no records). Their
        responses are dropped when they come; a fetch changes nothing upstream, so nothing is lost."""
        by_node, unroutable = await self._split(req, shape)
        nodes = list(by_node)
        tasks = [asyncio.ensure_future(self.cluster.send(node, api_key, build(by_node[node]), version, lane=lane))
                 for node in nodes]
        if not tasks:
            pass  # every partition unroutable: each gets its error below
        elif enough is None or len(tasks) < 2:
            await asyncio.wait(tasks)
        else:
            waiting = set(tasks)
            while waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if any(not t.exception() and enough(t.result()) for t in done):
                    break
            for t in waiting:
                t.add_done_callback(_drop_result)
        found: dict[tuple[str | None, int], MessageBase] = {}
        template: MessageBase | None = None
        refresh = False
        for node, task in zip(nodes, tasks, strict=True):
            if not task.done():
                assert pending is not None
                for t in by_node[node]:
                    name = self.cluster.topic_name(getattr(t, shape.req_name), getattr(t, "topic_id", None))
                    for p in getattr(t, shape.req_parts):
                        index = getattr(p, shape.req_index)
                        found[(name, index)] = pending(name, index)
                continue
            error = task.exception()
            if error is not None:
                if not isinstance(error, UpstreamUnavailable):
                    raise error
                if isinstance(lane, Lane) and lane.closed:
                    raise error  # the client went away and its upstream connections with it: nobody to answer
                log.warning("upstream leader unreachable", node=node, api=messages.API_NAMES.get(api_key),
                            error=str(error))
                code = ErrorCode.REQUEST_TIMED_OUT if error.timed_out else UNREACHABLE
                refresh = True
                for t in by_node[node]:
                    name = self.cluster.topic_name(getattr(t, shape.req_name), getattr(t, "topic_id", None))
                    for p in getattr(t, shape.req_parts):
                        index = getattr(p, shape.req_index)
                        found[(name, index)] = shape.error_partition(index, code)
                continue
            result = task.result()
            template = template or result
            top_code = getattr(result, "error_code", ErrorCode.NONE) or ErrorCode.NONE
            for rt in getattr(result, shape.resp_topics):
                name = self.cluster.topic_name(getattr(rt, shape.resp_name), getattr(rt, "topic_id", None))
                for rp in getattr(rt, shape.resp_parts):
                    if top_code and not rp.error_code:
                        rp.error_code = top_code
                    if rp.error_code in LEADERSHIP_ERRORS:
                        refresh = True
                        self.cluster.metrics.leadership_errors.inc()
                    found[(name, getattr(rp, shape.resp_index))] = rp
        if refresh:
            self.cluster.request_refresh()
        topics_out: list[Any] = []
        has_id = "topic_id" in shape.topic_cls._fields
        for t in getattr(req, shape.req_topics):
            topic_id = getattr(t, "topic_id", None)
            name = self.cluster.topic_name(getattr(t, shape.req_name), topic_id)
            parts = []
            for p in getattr(t, shape.req_parts):
                index = getattr(p, shape.req_index)
                part = found.get((name, index))
                if part is None:
                    missing: int = unknown_code if (name, index) in unroutable else UNREACHABLE
                    part = shape.error_partition(index, missing)
                parts.append(part)
            fields: dict[str, Any] = {shape.resp_name: getattr(t, shape.req_name), shape.resp_parts: parts}
            if has_id:
                fields["topic_id"] = topic_id
            topics_out.append(shape.topic_cls(**fields))
        return template or messages.RESPONSES[api_key].cls(), topics_out

    async def produce(self, req: messages.ProduceRequest, version: int) -> messages.ProduceResponse | None:
        def build(topics: list[Any]) -> MessageBase:
            return messages.ProduceRequest(transactional_id=req.transactional_id, acks=req.acks,
                                           timeout_ms=req.timeout_ms, topic_data=topics)

        if req.acks == 0:
            # No response is owed: hand each leader its part and do not wait for one (as the client would).
            by_node, _ = await self._split(req, PRODUCE)
            for node, topics in by_node.items():
                try:
                    await self.cluster.send(node, ApiKey.PRODUCE, build(topics), version, expect_response=False)
                except UpstreamUnavailable as exc:
                    log.warning("acks=0 produce dropped: upstream leader unreachable", node=node, error=str(exc))
                    self.cluster.request_refresh()
            return None
        template, topics = await self._forward_partitions(ApiKey.PRODUCE, req, version, PRODUCE, build, SHARED_LANE)
        for t in topics:
            for p in t.partition_responses:  # type: ignore[attr-defined]
                p.current_leader = _Produce.LeaderIdAndEpoch()
        return _Produce(responses=topics, throttle_time_ms=getattr(template, "throttle_time_ms", 0) or 0,
                        node_endpoints=[])

    async def fetch(self, req: messages.FetchRequest, version: int, lane: Hashable) -> messages.FetchResponse:
        """A full fetch upstream, and none of the client's fetch session: Shoal answers with session id 0, so
        the client keeps sending full fetches (a broker may always decline a session, KIP-227)."""
        # At least 1 ms: a Kafka broker with records answers at once either way, but some Kafka-protocol
        # brokers (Tansu) answer max_wait_ms=0 with no partitions at all, which the client would take for
        # a lost leader.
        max_wait_ms = max(1, req.max_wait_ms)

        def build(topics: list[Any]) -> MessageBase:
            return messages.FetchRequest(
                replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=req.min_bytes, max_bytes=req.max_bytes,
                isolation_level=req.isolation_level, session_id=0, session_epoch=-1, topics=topics,
                forgotten_topics_data=[], rack_id=req.rack_id or "")

        min_bytes = max(1, req.min_bytes)

        def enough(response: Any) -> bool:
            size = 0
            for t in response.responses:
                for p in t.partitions:
                    if p.error_code:
                        return True
                    size += len(p.records or b"")
            return response.error_code != ErrorCode.NONE or size >= min_bytes

        def still_polling(name: str | None, index: int) -> MessageBase:
            hw, lso, log_start = self._watermarks.get((name, index), (-1, -1, -1))
            return _Fetch.PartitionData(partition_index=index, error_code=ErrorCode.NONE, high_watermark=hw,
                                        last_stable_offset=lso, log_start_offset=log_start, records=None)

        unknown = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        template, topics = await self._forward_partitions(ApiKey.FETCH, req, version, FETCH, build, lane, unknown,
                                                          enough, still_polling)
        for t in topics:
            name = self.cluster.topic_name(t.topic, t.topic_id)  # type: ignore[attr-defined]
            passed = sum(len(p.records or b"") for p in t.partitions)  # type: ignore[attr-defined]
            if passed:
                self.cluster.metrics.forwarded_fetch_bytes.labels(topic=name or "").inc(passed)
            for p in t.partitions:  # type: ignore[attr-defined]
                p.current_leader = _Fetch.LeaderIdAndEpoch()
                p.preferred_read_replica = -1
                if p.error_code == ErrorCode.NONE and p.high_watermark >= 0:
                    self._watermarks[(name, p.partition_index)] = (p.high_watermark, p.last_stable_offset,
                                                                   p.log_start_offset)
        return _Fetch(throttle_time_ms=getattr(template, "throttle_time_ms", 0) or 0, error_code=ErrorCode.NONE,
                      session_id=0, responses=topics, node_endpoints=[])

    async def list_offsets(self, req: messages.ListOffsetsRequest, version: int) -> messages.ListOffsetsResponse:
        def build(topics: list[Any]) -> MessageBase:
            return messages.ListOffsetsRequest(replica_id=-1, isolation_level=req.isolation_level, topics=topics,
                                               timeout_ms=req.timeout_ms)

        template, topics = await self._forward_partitions(ApiKey.LIST_OFFSETS, req, version, LIST_OFFSETS, build,
                                                          SHARED_LANE)
        return _ListOffsets(throttle_time_ms=getattr(template, "throttle_time_ms", 0) or 0, topics=topics)

    async def delete_records(self, req: messages.DeleteRecordsRequest, version: int) -> messages.DeleteRecordsResponse:
        def build(topics: list[Any]) -> MessageBase:
            return messages.DeleteRecordsRequest(topics=topics, timeout_ms=req.timeout_ms)

        template, topics = await self._forward_partitions(ApiKey.DELETE_RECORDS, req, version, DELETE_RECORDS, build,
                                                          SHARED_LANE)
        return _DeleteRecords(throttle_time_ms=getattr(template, "throttle_time_ms", 0) or 0, topics=topics)

    async def offset_for_leader_epoch(self, req: messages.OffsetForLeaderEpochRequest,
                                      version: int) -> messages.OffsetForLeaderEpochResponse:
        """KIP-320: a consumer that saw the leader epoch change checks its position against the leader."""
        def build(topics: list[Any]) -> MessageBase:
            return messages.OffsetForLeaderEpochRequest(replica_id=-1, topics=topics)

        template, topics = await self._forward_partitions(ApiKey.OFFSET_FOR_LEADER_EPOCH, req, version,
                                                          OFFSET_FOR_LEADER_EPOCH, build, SHARED_LANE)
        return _Epochs(throttle_time_ms=getattr(template, "throttle_time_ms", 0) or 0, topics=topics)

    # ---- cluster-wide requests -------------------------------------------------------------------

    async def metadata(self, req: messages.MetadataRequest, version: int) -> messages.MetadataResponse:
        return await self.cluster.metadata(req, version)

    async def to_any_broker(self, api_key: int, req: MessageBase, version: int) -> Any:
        """Topic and config administration: any upstream broker forwards it to its controller."""
        response = await self.cluster.send(await self.cluster.any_node(), api_key, req, version)
        if api_key in (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS):
            self.cluster.request_refresh()
        return response

    # ---- coordinator requests --------------------------------------------------------------------

    async def to_coordinator(self, key_type: int, key: str, api_key: int, req: MessageBase, version: int,
                             lane: Hashable = SHARED_LANE) -> Any:
        """Send to the upstream coordinator of `key`; a NOT_COORDINATOR-like answer passes through to the
        client (which asks Shoal again and retries) and makes Shoal look the coordinator up afresh."""
        node = await self.cluster.coordinator(key_type, key)
        response = await self.cluster.send(node, api_key, req, version, lane=lane)
        if any(code in COORDINATOR_ERRORS for code in _error_codes(response)):
            self.cluster.forget_coordinator(key_type, key)
        return response

    async def group_request(self, group_id: str, api_key: int, req: MessageBase, version: int,
                            lane: Hashable = SHARED_LANE) -> Any:
        return await self.to_coordinator(KEY_TYPE_GROUP, group_id, api_key, req, version, lane)

    async def txn_request(self, transactional_id: str, api_key: int, req: MessageBase, version: int) -> Any:
        return await self.to_coordinator(KEY_TYPE_TRANSACTION, transactional_id, api_key, req, version)

    async def init_producer_id(self, req: messages.InitProducerIdRequest, version: int) -> Any:
        if req.transactional_id:
            return await self.txn_request(req.transactional_id, ApiKey.INIT_PRODUCER_ID, req, version)
        # An idempotent producer's id comes from any broker, and is then checked by every leader.
        return await self.cluster.send(await self.cluster.any_node(), ApiKey.INIT_PRODUCER_ID, req, version)

    async def offset_fetch(self, req: messages.OffsetFetchRequest, version: int) -> Any:
        if version < 8:
            return await self.group_request(req.group_id, ApiKey.OFFSET_FETCH, req, version)
        # Batched form (KIP-709): one request per group, each to its own coordinator.
        parts = await asyncio.gather(*(
            self._offset_fetch_group(req, group, version) for group in req.groups))
        return messages.OffsetFetchResponse(throttle_time_ms=0, groups=parts)

    async def _offset_fetch_group(self, req: messages.OffsetFetchRequest, group: Any, version: int) -> Any:
        one = messages.OffsetFetchRequest(groups=[group], require_stable=req.require_stable)
        try:
            response = await self.group_request(group.group_id, ApiKey.OFFSET_FETCH, one, version)
        except CoordinatorLookupFailed as exc:
            return messages.OffsetFetchResponse.OffsetFetchResponseGroup(group_id=group.group_id, topics=[],
                                                                         error_code=exc.error_code)
        return response.groups[0]

    async def list_groups(self, req: messages.ListGroupsRequest, version: int) -> messages.ListGroupsResponse:
        """Every upstream broker lists the groups it coordinates: ask them all and join the lists."""
        nodes = list(self.cluster.brokers) or [await self.cluster.any_node()]
        answers = await asyncio.gather(*(self.cluster.send(node, ApiKey.LIST_GROUPS, req, version) for node in nodes))
        error = next((a.error_code for a in answers if a.error_code), ErrorCode.NONE)
        return messages.ListGroupsResponse(error_code=error, groups=[g for a in answers for g in a.groups])

    async def describe_groups(self, req: messages.DescribeGroupsRequest, version: int) -> messages.DescribeGroupsResponse:
        async def one(group_id: str) -> Any:
            single = messages.DescribeGroupsRequest(
                groups=[group_id], include_authorized_operations=req.include_authorized_operations)
            try:
                response = await self.group_request(group_id, ApiKey.DESCRIBE_GROUPS, single, version)
            except CoordinatorLookupFailed as exc:
                return messages.DescribeGroupsResponse.DescribedGroup(
                    group_id=group_id, error_code=exc.error_code, group_state="", protocol_type="",
                    protocol_data="", members=[])
            return response.groups[0]

        return messages.DescribeGroupsResponse(groups=list(await asyncio.gather(*(one(g) for g in req.groups))))

    async def consumer_group_describe(self, req: messages.ConsumerGroupDescribeRequest,
                                      version: int) -> messages.ConsumerGroupDescribeResponse:
        async def one(group_id: str) -> Any:
            single = messages.ConsumerGroupDescribeRequest(
                group_ids=[group_id], include_authorized_operations=req.include_authorized_operations)
            try:
                response = await self.group_request(group_id, ApiKey.CONSUMER_GROUP_DESCRIBE, single, version)
            except CoordinatorLookupFailed as exc:
                return messages.ConsumerGroupDescribeResponse.DescribedGroup(
                    group_id=group_id, error_code=exc.error_code, group_state="", assignor_name="", members=[])
            return response.groups[0]

        return messages.ConsumerGroupDescribeResponse(
            groups=list(await asyncio.gather(*(one(g) for g in req.group_ids))))

    async def delete_groups(self, req: messages.DeleteGroupsRequest, version: int) -> messages.DeleteGroupsResponse:
        async def one(group_id: str) -> Any:
            try:
                response = await self.group_request(group_id, ApiKey.DELETE_GROUPS,
                                                    messages.DeleteGroupsRequest(groups_names=[group_id]), version)
            except CoordinatorLookupFailed as exc:
                return messages.DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=exc.error_code)
            return response.results[0]

        return messages.DeleteGroupsResponse(results=list(await asyncio.gather(*(one(g) for g in req.groups_names))))

    async def add_partitions_to_txn(self, req: messages.AddPartitionsToTxnRequest, version: int) -> Any:
        if version < 4:
            return await self.txn_request(req.v3_and_below_transactional_id, ApiKey.ADD_PARTITIONS_TO_TXN, req, version)
        parts = await asyncio.gather(*(self._add_partitions_one(t, version) for t in req.transactions))
        return messages.AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                                   results_by_transaction=[r for rs in parts for r in rs])

    async def _add_partitions_one(self, txn: Any, version: int) -> list[Any]:
        one = messages.AddPartitionsToTxnRequest(transactions=[txn])
        response = await self.txn_request(txn.transactional_id, ApiKey.ADD_PARTITIONS_TO_TXN, one, version)
        if response.error_code:
            raise CoordinatorLookupFailed(response.error_code)
        return list(response.results_by_transaction)


def _drop_result(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a sub-request nobody waits for any more (so asyncio does not warn)."""
    if not task.cancelled():
        task.exception()


def _error_codes(response: Any) -> list[int]:
    """The error codes at the top of a response and in its first-level lists (batched coordinator APIs)."""
    codes = []
    if isinstance(getattr(response, "error_code", None), int):
        codes.append(response.error_code)
    for name in getattr(response, "_fields", ()):
        value = getattr(response, name)
        if isinstance(value, list):
            codes.extend(item.error_code for item in value if isinstance(getattr(item, "error_code", None), int))
    return codes
