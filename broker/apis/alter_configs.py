"""IncrementalAlterConfigs for topics (TOPIC = 2), groups (GROUP = 32) and the broker's dynamic keys (BROKER = 4),
applied live and persisted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.config import (
    CLUSTER_DEFAULT,
    DYNAMIC_AT_RESTART,
    DYNAMIC_LOG_KEYS,
    DYNAMIC_NO_EFFECT,
    THIS_BROKER,
    BrokerConfig,
    ConfigError,
)
from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.share.group_configs import GroupConfigStoreError, InvalidGroupConfig, validation_context
from shoal.broker.storage.log_config import LIST_TYPED, apply_list_op
from shoal.broker.storage.topic_registry import validate_topic_config
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey
from shoal.protocol.errors import ErrorCode, shorten

if TYPE_CHECKING:
    from shoal.broker.apis.services import AlterConfigsServices, ApiTable
    from shoal.broker.network.connection import RequestContext

log = structlog.get_logger("shoal.configs")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

Response = messages.IncrementalAlterConfigsResponse
ResourceResponse = Response.AlterConfigsResourceResponse
LegacyResourceResponse = messages.AlterConfigsResponse.AlterConfigsResourceResponse


class AlterConfigs:
    def __init__(self, services: AlterConfigsServices):
        self.services = services

    async def incremental_alter_configs(self, ctx: RequestContext, req: messages.IncrementalAlterConfigsRequest) -> messages.IncrementalAlterConfigsResponse:
        out = []
        for r in req.resources:
            res = ResourceResponse(error_code=ErrorCode.NONE, error_message=None,
                                   resource_type=r.resource_type, resource_name=r.resource_name)
            out.append(res)
            changes: list[tuple[str, str | None]] = []
            bad = None
            topic = self.services.topics.get(r.resource_name) if r.resource_type == RESOURCE_TOPIC else None
            for c in r.configs:
                if c.config_operation == OP_SET:
                    changes.append((c.name, c.value))
                elif c.config_operation == OP_DELETE:
                    changes.append((c.name, None))
                elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
                    verb = "append" if c.config_operation == OP_APPEND else "subtract"
                    if r.resource_type != RESOURCE_TOPIC or c.name not in LIST_TYPED:
                        # Kafka allows APPEND and SUBTRACT on list-typed keys only.
                        bad = f"Config value {verb} is not allowed for config key: {shorten(c.name)}"
                    elif topic is not None:
                        current = dict(changes).get(c.name) or topic.configs.get(c.name) \
                            or self.services.topics.effective_config(topic)[c.name][0]
                        changes.append((c.name, apply_list_op(current, c.value or "", c.config_operation == OP_APPEND)))
                else:
                    bad = f"Unknown config operation {c.config_operation} for {shorten(c.name)}"
            if bad is not None:
                res.error_code, res.error_message = ErrorCode.INVALID_CONFIG, bad
                log.info("config change refused", resource_type=r.resource_type, resource=shorten(r.resource_name),
                         reason=bad)
                continue
            if r.resource_type == RESOURCE_GROUP:
                await self._alter_group(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_TOPIC:
                self._alter_topic(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_BROKER:
                self._alter_broker(ctx, r.resource_name, changes, req.validate_only, res)
            else:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"resource type {r.resource_type} cannot be altered on this broker"
        return Response(responses=out)

    async def alter_configs(self, ctx: RequestContext, req: messages.AlterConfigsRequest) -> messages.AlterConfigsResponse:
        """The legacy, non-incremental AlterConfigs: each resource's dynamic configs become exactly the ones
        given; any other set before returns to its default (as Kafka does)."""
        out = []
        for r in req.resources:
            res = ResourceResponse(error_code=ErrorCode.NONE, error_message=None,
                                   resource_type=r.resource_type, resource_name=r.resource_name)
            given = [(c.name, c.value) for c in r.configs]
            names = {name for name, _value in given}
            if r.resource_type == RESOURCE_TOPIC:
                topic = self.services.topics.get(r.resource_name)
                current = list(topic.configs) if topic is not None else []
                changes = given + [(k, None) for k in current if k not in names]
                self._alter_topic(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_BROKER:
                level = THIS_BROKER if r.resource_name else CLUSTER_DEFAULT
                current = list(self.services.config.dynamic_values(level))
                changes = given + [(k, None) for k in current if k not in names]
                self._alter_broker(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_GROUP:
                await self._alter_group(ctx, r.resource_name, given, req.validate_only, res, whole=True)
            else:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"resource type {r.resource_type} cannot be altered on this broker"
            out.append(LegacyResourceResponse(error_code=res.error_code, error_message=res.error_message,
                                              resource_type=r.resource_type, resource_name=r.resource_name))
        return messages.AlterConfigsResponse(responses=out)

    async def _alter_group(self, ctx: RequestContext, group: str, changes: list[tuple[str, str | None]],
                           validate_only: bool, res: ResourceResponse, *, whole: bool = False) -> None:
        """`whole`: AlterConfigs, the names not in `changes` are deleted."""
        if not ctx.authorize(Operation.ALTER_CONFIGS, ResourceType.GROUP, group):
            res.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            return
        configs = self.services.group_configs
        # The broker's current prefix and the topics as they are now: validateOnly checks the same way.
        check = validation_context(self.services.config, self.services.topics)
        try:
            if validate_only:
                configs.validate_all(changes, check)
                return
            # Sidecar mode: answered once the upstream has the change (acks=all).
            if whole:
                await configs.set_all(group, [(k, v) for k, v in changes if v is not None], check)
            else:
                await configs.alter(group, changes, check)
        except InvalidGroupConfig as exc:
            res.error_code, res.error_message = ErrorCode.INVALID_CONFIG, str(exc)
            log.info("group config refused", group=group, reason=res.error_message)
            return
        except GroupConfigStoreError as exc:
            res.error_code, res.error_message = exc.error_code, shorten(str(exc))
            log.warning("group config not stored", group=group, reason=res.error_message)
            return
        log.info("group config changed", group=group, changes=dict(changes))
        self.services.on_group_config_changed(group)

    def _alter_topic(self, ctx: RequestContext, name: str, changes: list[tuple[str, str | None]],
                     validate_only: bool, res: ResourceResponse) -> None:
        # Authorization first, as in Kafka: existence is not revealed to a client without the right.
        if not ctx.authorize(Operation.ALTER_CONFIGS, ResourceType.TOPIC, name):
            res.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            return
        topic = self.services.topics.get(name)
        if topic is None:
            res.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return
        for key, value in changes:
            bad = validate_topic_config(key, value)
            if bad is not None:
                res.error_code, res.error_message = ErrorCode.INVALID_CONFIG, bad
                log.info("topic config refused", topic=name, reason=bad)
                return
        if validate_only:
            return
        self.services.topics.alter_configs(topic, changes)
        log.info("topic config changed", topic=name, changes=dict(changes))

    def _alter_broker(self, ctx: RequestContext, name: str, changes: list[tuple[str, str | None]],
                      validate_only: bool, res: ResourceResponse) -> None:
        """Kafka's dynamic broker configs: "" is the cluster-wide default, the broker's id its own value."""
        if not ctx.authorize(Operation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
            res.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            return
        # Kafka answers INVALID_REQUEST for all of these (KAFKA-13609 keeps it so for compatibility).
        try:
            node_id = int(name) if name else None
        except ValueError:
            res.error_code = ErrorCode.INVALID_REQUEST
            res.error_message = f"Node id must be an integer, but it is: {shorten(name)}"
            return
        if node_id is not None and node_id != self.services.node_id:
            res.error_code = ErrorCode.INVALID_REQUEST
            res.error_message = f"Unexpected broker id, expected {self.services.node_id}, but received {shorten(name)}"
            return
        try:
            BrokerConfig.validate_dynamic(changes)
        except ConfigError as exc:
            res.error_code, res.error_message = ErrorCode.INVALID_REQUEST, shorten(str(exc))
            log.info("dynamic broker config refused", resource=name or "<cluster default>", reason=res.error_message)
            return
        if validate_only:
            return
        self.services.config.apply_dynamic(THIS_BROKER if name else CLUSTER_DEFAULT, changes)
        log.info("dynamic broker config changed", resource=name or "<cluster default>", changes=dict(changes))
        keys = {key for key, _value in changes}
        if keys & DYNAMIC_LOG_KEYS:
            self.services.topics.refresh_configs()
        for key in sorted(keys):
            if key in DYNAMIC_NO_EFFECT:
                log.info("dynamic broker config has no effect on this broker", key=key, reason=DYNAMIC_NO_EFFECT[key])
            elif key in DYNAMIC_AT_RESTART:
                log.info("dynamic broker config takes effect when the broker restarts", key=key)


def register(table: ApiTable, services: AlterConfigsServices) -> AlterConfigs:
    h = AlterConfigs(services)
    table.register(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, h.incremental_alter_configs)
    table.register(ApiKey.ALTER_CONFIGS, 0, 2, h.alter_configs)
    return h
