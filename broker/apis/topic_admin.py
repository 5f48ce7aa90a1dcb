"""Topic administration and offsets: CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
ListOffsets, DescribeConfigs and InitProducerId."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.config import CLUSTER_DEFAULT, DYNAMIC_KEYS, KEYS, THIS_BROKER
from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.storage.log_config import (
    TOPIC_CONFIGS,
    TYPE_BOOLEAN,
    TYPE_DOUBLE,
    TYPE_INT,
    TYPE_LIST,
    TYPE_LONG,
    TYPE_STRING,
)
from shoal.broker.storage.partition_log import OffsetOutOfRange, PartitionLog
from shoal.broker.storage.topic_registry import INTERNAL_TOPICS, validate_topic_config, validate_topic_name
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode, shorten
from shoal.protocol.record_batch import InvalidRecordBatch
from shoal.protocol.records import decode_batch
from shoal.protocol.uuids import ZERO_UUID

if TYPE_CHECKING:
    from shoal.broker.apis.services import ApiTable, TopicAdminServices
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.admin")

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
READ_COMMITTED = 1  # ListOffsets isolation_level: latest means the last stable offset

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32
SOURCE_GROUP = 8
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

CreateTopicsResponse = messages.CreateTopicsResponse
CreatableTopicResult = CreateTopicsResponse.CreatableTopicResult
CreatableTopicConfigs = CreateTopicsResponse.CreatableTopicConfigs
DeleteTopicsResponse = messages.DeleteTopicsResponse
DeletableTopicResult = DeleteTopicsResponse.DeletableTopicResult
ListOffsetsResponse = messages.ListOffsetsResponse
LoTopic = ListOffsetsResponse.ListOffsetsTopicResponse
LoPartition = ListOffsetsResponse.ListOffsetsPartitionResponse
DeleteRecordsResponse = messages.DeleteRecordsResponse
DrTopic = DeleteRecordsResponse.DeleteRecordsTopicResult
DrPartition = DeleteRecordsResponse.DeleteRecordsPartitionResult
CreatePartitionsResponse = messages.CreatePartitionsResponse
CpResult = CreatePartitionsResponse.CreatePartitionsTopicResult
DescribeConfigsResponse = messages.DescribeConfigsResponse
DcResult = DescribeConfigsResponse.DescribeConfigsResult
DcEntry = DescribeConfigsResponse.DescribeConfigsResourceResult
DcSynonym = DescribeConfigsResponse.DescribeConfigsSynonym


class TopicAdmin:
    def __init__(self, services: TopicAdminServices):
        self.services = services

    # ---- CreateTopics ---------------------------------------------------------------------------

    def create_topics(self, ctx: RequestContext, req: messages.CreateTopicsRequest) -> messages.CreateTopicsResponse:
        results = []
        seen: set[str] = set()
        added = 0  # partitions this request creates (or would, with validate_only)
        cluster_ok = ctx.authorize(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
        for ct in req.topics:
            result = CreatableTopicResult(name=ct.name, error_code=ErrorCode.NONE, num_partitions=-1,
                                          replication_factor=-1, configs=None)
            results.append(result)
            if ct.name in seen:
                result.error_code, result.error_message = ErrorCode.INVALID_REQUEST, "duplicate topic in request"
                continue
            seen.add(ct.name)
            if not cluster_ok and not ctx.authorize(Operation.CREATE, ResourceType.TOPIC, ct.name):
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            problem = validate_topic_name(ct.name)
            if problem is not None:
                result.error_code, result.error_message = ErrorCode.INVALID_TOPIC_EXCEPTION, problem
                continue
            if self.services.topics.get(ct.name) is not None:
                result.error_code = ErrorCode.TOPIC_ALREADY_EXISTS
                result.error_message = f"Topic '{ct.name}' already exists."
                continue
            if ct.name in INTERNAL_TOPICS:
                # `__transaction_state` is created on the first transactional producer, with
                # transaction.state.log.num.partitions; a count chosen here would not be the one the
                # running coordinator places keys by. Worded as Kafka refuses its metadata topic.
                log.warning("refused creation of an internal topic", topic=ct.name)
                result.error_code = ErrorCode.INVALID_REQUEST
                result.error_message = f"Creation of internal topic {ct.name} is prohibited."
                continue
            if ct.assignments:
                count = len(ct.assignments)
                if any(a.broker_ids != [self.services.node_id] for a in ct.assignments):
                    result.error_code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                    result.error_message = f"replicas must be exactly [{self.services.node_id}] on this single-node cluster"
                    continue
            else:
                count = ct.num_partitions if ct.num_partitions != -1 else int(self.services.config["num.partitions"])
            if count <= 0:
                result.error_code, result.error_message = ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0."
                continue
            too_many = self.services.budget.problem(count, added)
            if too_many is not None:
                log.warning("refused topic creation", topic=shorten(ct.name), partitions=count, reason=too_many)
                result.error_code, result.error_message = ErrorCode.POLICY_VIOLATION, too_many
                continue
            if ct.replication_factor not in (-1, 1):
                result.error_code = ErrorCode.INVALID_REPLICATION_FACTOR
                result.error_message = f"Replication factor {ct.replication_factor} is larger than the 1 available broker."
                continue
            configs: dict[str, str] = {}
            bad = None
            for c in ct.configs:
                bad = validate_topic_config(c.name, c.value)
                if bad is not None:
                    break
                if c.value is not None:
                    configs[c.name] = c.value
            if bad is not None:
                result.error_code, result.error_message = ErrorCode.INVALID_CONFIG, bad
                log.info("topic config refused", topic=shorten(ct.name), reason=bad)
                continue
            result.num_partitions = count
            result.replication_factor = 1
            added += count
            if req.validate_only:
                continue
            topic = self.services.topics.create(ct.name, count, configs)
            self.services.on_topic_created(topic)
            result.topic_id = topic.topic_id
            result.configs = [
                CreatableTopicConfigs(name=k, value=v, read_only=False, config_source=SOURCE_TOPIC if explicit else SOURCE_DEFAULT,
                                      is_sensitive=False)
                for k, (v, explicit) in self.services.topics.effective_config(topic).items()
            ]
        return CreateTopicsResponse(topics=results)

    # ---- DeleteTopics ---------------------------------------------------------------------------

    def delete_topics(self, ctx: RequestContext, req: messages.DeleteTopicsRequest) -> messages.DeleteTopicsResponse:
        version = ctx.api_version
        wanted: list[tuple[str | None, bytes]] = (
            [(t.name, t.topic_id) for t in req.topics] if version >= 6 else [(n, ZERO_UUID) for n in req.topic_names]
        )
        results = []
        for name, topic_id in wanted:
            topic = self.services.topics.get(name) if name is not None else self.services.topics.get_by_id(topic_id)
            res = DeletableTopicResult(name=name, topic_id=topic_id, error_code=ErrorCode.NONE)
            results.append(res)
            if topic is None:
                res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None else ErrorCode.UNKNOWN_TOPIC_ID
                continue
            res.name, res.topic_id = topic.name, topic.topic_id
            if not ctx.authorize(Operation.DELETE, ResourceType.TOPIC, topic.name):
                res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if topic.name in INTERNAL_TOPICS or not self.services.config["delete.topic.enable"]:
                res.error_code = ErrorCode.INVALID_REQUEST if topic.name not in INTERNAL_TOPICS else ErrorCode.TOPIC_AUTHORIZATION_FAILED
                res.error_message = "internal topics cannot be deleted" if topic.name in INTERNAL_TOPICS else "topic deletion is disabled"
                continue
            self.services.delete_topic(topic)
        return DeleteTopicsResponse(responses=results)

    # ---- CreatePartitions -----------------------------------------------------------------------

    def create_partitions(self, ctx: RequestContext, req: messages.CreatePartitionsRequest) -> messages.CreatePartitionsResponse:
        results = []
        added = 0
        for t in req.topics:
            res = CpResult(name=t.name, error_code=ErrorCode.NONE, error_message=None)
            results.append(res)
            topic = self.services.topics.get(t.name)
            if topic is None:
                res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if not ctx.authorize(Operation.ALTER, ResourceType.TOPIC, t.name):
                res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if topic.internal:
                # The coordinators place their keys by hash modulo this count: changing it would strand
                # every key already written. Kafka's controller accepts the request; Shoal refuses it.
                log.warning("refused partition creation on an internal topic", topic=t.name, count=t.count)
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = (f"The partition count of internal topic {t.name} cannot be changed: it is fixed "
                                     f"when the topic is created ({len(topic.partitions)} partitions).")
                continue
            if t.count <= len(topic.partitions):
                res.error_code = ErrorCode.INVALID_PARTITIONS
                res.error_message = f"Topic currently has {len(topic.partitions)} partitions, {t.count} would not be an increase."
                continue
            too_many = self.services.budget.problem(t.count - len(topic.partitions), added)
            if too_many is not None:
                log.warning("refused partition creation", topic=t.name, count=t.count, reason=too_many)
                res.error_code, res.error_message = ErrorCode.POLICY_VIOLATION, too_many
                continue
            added += t.count - len(topic.partitions)
            if not req.validate_only:
                self.services.topics.add_partitions(topic, t.count)
                self.services.on_topic_created(topic)
        return CreatePartitionsResponse(results=results)

    # ---- DeleteRecords --------------------------------------------------------------------------

    def delete_records(self, ctx: RequestContext, req: messages.DeleteRecordsRequest) -> messages.DeleteRecordsResponse:
        out = []
        for t in req.topics:
            topic = self.services.topics.get(t.name)
            parts = []
            for p in t.partitions:
                pr = DrPartition(partition_index=p.partition_index, low_watermark=-1, error_code=ErrorCode.NONE)
                parts.append(pr)
                if topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    pr.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not ctx.authorize(Operation.DELETE, ResourceType.TOPIC, t.name):
                    pr.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                plog = topic.partitions[p.partition_index]
                target = plog.high_watermark if p.offset == -1 else p.offset
                if target < 0 or target > plog.high_watermark:
                    pr.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                    continue
                pr.low_watermark = plog.delete_records_before(target)
                self.services.on_log_start_moved(topic, p.partition_index)
            out.append(DrTopic(name=t.name, partitions=parts))
        return DeleteRecordsResponse(topics=out)

    # ---- ListOffsets ----------------------------------------------------------------------------

    def list_offsets(self, ctx: RequestContext, req: messages.ListOffsetsRequest) -> messages.ListOffsetsResponse:
        out = []
        for t in req.topics:
            topic = self.services.topics.get(t.name)
            parts = []
            for p in t.partitions:
                pr = LoPartition(partition_index=p.partition_index, error_code=ErrorCode.NONE, timestamp=-1, offset=-1,
                                 leader_epoch=-1)
                parts.append(pr)
                if topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    pr.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not ctx.authorize(Operation.DESCRIBE, ResourceType.TOPIC, t.name):
                    pr.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                plog = topic.partitions[p.partition_index]
                pr.leader_epoch = 0
                ts = p.timestamp
                if ts in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
                    pr.offset = plog.log_start_offset
                elif ts == LATEST_TIMESTAMP or ts == LATEST_TIERED_TIMESTAMP:
                    if ts == LATEST_TIERED_TIMESTAMP:
                        pr.offset = -1
                    elif req.isolation_level == READ_COMMITTED:
                        pr.offset = plog.last_stable_offset
                    else:
                        pr.offset = plog.high_watermark
                elif ts == MAX_TIMESTAMP:
                    pr.offset, pr.timestamp = plog.max_timestamp()
                elif ts < 0:
                    pr.error_code = ErrorCode.INVALID_REQUEST
                else:
                    found = _record_at_or_after(plog, ts)
                    if found is not None:
                        pr.offset, pr.timestamp = found
            out.append(LoTopic(name=t.name, partitions=parts))
        return ListOffsetsResponse(topics=out)

    # ---- DescribeConfigs ------------------------------------------------------------------------

    def describe_configs(self, ctx: RequestContext, req: messages.DescribeConfigsRequest) -> messages.DescribeConfigsResponse:
        results = []
        for r in req.resources:
            res = DcResult(error_code=ErrorCode.NONE, error_message=None, resource_type=r.resource_type,
                           resource_name=r.resource_name, configs=[])
            results.append(res)
            entries: list[_Entry] = []
            if r.resource_type == RESOURCE_TOPIC:
                topic = self.services.topics.get(r.resource_name)
                if topic is None:
                    res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, r.resource_name):
                    res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                for key, cv in self.services.topics.configs_of(topic).items():
                    spec = TOPIC_CONFIGS[key]
                    entries.append(_Entry(key, cv.value, cv.source, False, spec.type, spec.doc, cv.synonyms))
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(self.services.node_id)):
                    res.error_code, res.error_message = ErrorCode.INVALID_REQUEST, f"unknown broker {shorten(r.resource_name)}"
                    continue
                if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
                    res.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                    continue
                entries.extend(self._broker_config_entries(bool(r.resource_name)))
            elif r.resource_type == RESOURCE_GROUP:
                if not ctx.authorize(Operation.DESCRIBE_CONFIGS, ResourceType.GROUP, r.resource_name):
                    res.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
                    continue
                for key, (value, explicit) in self.services.group_configs.effective(r.resource_name).items():
                    source = SOURCE_GROUP if explicit else SOURCE_DEFAULT
                    entries.append(_Entry(key, value, source, False, TYPE_INT if value.lstrip("-").isdigit() else TYPE_STRING,
                                          None, ((key, value, source),)))
            else:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"resource type {r.resource_type} is not supported"
                continue
            keys = set(r.configuration_keys) if r.configuration_keys else None
            res.configs = [
                DcEntry(name=e.name, value=e.value, read_only=e.read_only, config_source=e.source,
                        is_sensitive=False,
                        synonyms=[DcSynonym(name=n, value=v, source=src) for n, v, src in e.synonyms]
                        if req.include_synonyms else [],
                        config_type=e.type,
                        documentation=e.doc if req.include_documentation else None)
                for e in entries
                if keys is None or e.name in keys
            ]
        return DescribeConfigsResponse(results=results)

    def _broker_config_entries(self, this_broker: bool) -> list[_Entry]:
        """This broker's configs with their sources; the cluster-wide resource ("") holds only the
        dynamic cluster defaults, as in Kafka."""
        cfg = self.services.config
        if not this_broker:
            return [_Entry(key, text, SOURCE_DYNAMIC_DEFAULT_BROKER, False, _broker_type(key), _broker_doc(key),
                           ((key, text, SOURCE_DYNAMIC_DEFAULT_BROKER),))
                    for key, text in sorted(cfg.dynamic_values(CLUSTER_DEFAULT).items())]
        out: list[_Entry] = []
        for key, static in [*cfg.items(), *((k, None) for k in cfg.dynamic_only_keys())]:
            level = cfg.dynamic_source(key)
            synonyms: list[tuple[str, str | None, int]] = []
            for lvl, src in ((THIS_BROKER, SOURCE_DYNAMIC_BROKER), (CLUSTER_DEFAULT, SOURCE_DYNAMIC_DEFAULT_BROKER)):
                value = cfg.dynamic_values(lvl).get(key)
                if value is not None:
                    synonyms.append((key, value, src))
            if key in cfg.explicit:
                synonyms.append((key, _config_text(static), SOURCE_STATIC_BROKER))
            spec = KEYS.get(key)
            if spec is not None:
                synonyms.append((key, _config_text(spec.default), SOURCE_DEFAULT))
            if level == THIS_BROKER:
                source = SOURCE_DYNAMIC_BROKER
            elif level == CLUSTER_DEFAULT:
                source = SOURCE_DYNAMIC_DEFAULT_BROKER
            else:
                source = SOURCE_STATIC_BROKER if key in cfg.explicit else SOURCE_DEFAULT
            out.append(_Entry(key, _config_text(cfg[key]), source, key not in DYNAMIC_KEYS, _broker_type(key),
                              _broker_doc(key), tuple(synonyms)))
        return out


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    value: str | None
    source: int
    read_only: bool
    type: int
    doc: str | None
    synonyms: tuple[tuple[str, str | None, int], ...]


def _broker_type(key: str) -> int:
    spec = KEYS.get(key)
    if spec is None:
        return TYPE_STRING
    if spec.parse is int:
        # Kafka declares times and large sizes as LONG.
        big = isinstance(spec.default, int) and not -(1 << 31) <= spec.default < 1 << 31
        return TYPE_LONG if key.endswith((".ms", ".minutes")) or big else TYPE_INT
    if spec.parse is float:
        return TYPE_DOUBLE
    if isinstance(spec.default, bool):
        return TYPE_BOOLEAN
    if isinstance(spec.default, list):
        return TYPE_LIST
    return TYPE_STRING


def _broker_doc(key: str) -> str | None:
    spec = KEYS.get(key)
    return spec.doc if spec is not None else None


def _config_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return ",".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _record_at_or_after(plog: PartitionLog, timestamp_ms: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after `timestamp_ms`, as Kafka answers ListOffsets.

    The log finds the first batch whose max timestamp qualifies; the record itself is found by decoding it.
    """
    found = plog.offset_for_timestamp(timestamp_ms)
    if found is None:
        return None
    try:
        data = plog.read(found[0], 1)
        _header, records = decode_batch(data, 0, check_crc=False)
    except (OffsetOutOfRange, InvalidRecordBatch):
        return found
    for rec in records:
        # A record whose timestamp overflows int64 (accepted before produce checked timestamps) is skipped.
        if rec.offset >= plog.log_start_offset and timestamp_ms <= rec.timestamp < 1 << 63:
            return rec.offset, rec.timestamp
    return found


def register(table: ApiTable, services: TopicAdminServices) -> TopicAdmin:
    h = TopicAdmin(services)
    table.register(ApiKey.CREATE_TOPICS, 2, 7, h.create_topics)
    table.register(ApiKey.DELETE_TOPICS, 1, 6, h.delete_topics)
    table.register(ApiKey.CREATE_PARTITIONS, 0, 3, h.create_partitions)
    table.register(ApiKey.DELETE_RECORDS, 0, 2, h.delete_records)
    table.register(ApiKey.LIST_OFFSETS, 1, 11, h.list_offsets)
    table.register(ApiKey.DESCRIBE_CONFIGS, 1, 4, h.describe_configs)
    return h
