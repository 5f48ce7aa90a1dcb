"""IncrementalAlterConfigs for topics (TOPIC = 2), groups (GROUP = 32) and the broker's dynamic keys (BROKER = 4),
applied live and persisted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from shoal.broker.common.config import CLUSTER_DEFAULT, THIS_BROKER, BrokerConfig, ConfigError
from shoal.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from shoal.broker.share.group_configs import InvalidGroupConfig, validation_context
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


class AlterConfigs:
    def __init__(self, services: AlterConfigsServices):
        self.services = services

    def incremental_alter_configs(self, ctx: RequestContext, req: messages.IncrementalAlterConfigsRequest) -> messages.IncrementalAlterConfigsResponse:
        out = []
        for r in req.resources:
            res = ResourceResponse(error_code=ErrorCode.NONE, error_message=None,
                                   resource_type=r.resource_type, resource_name=r.resource_name)
            out.append(res)
            changes: list[tuple[str, str | None]] = []
            bad = None
            for c in r.configs:
                if c.config_operation == OP_SET:
                    changes.append((c.name, c.value))
                elif c.config_operation == OP_DELETE:
                    changes.append((c.name, None))
                else:
                    bad = f"operation {c.config_operation} is not supported for {shorten(c.name)} (not a list config)"
            if bad is not None:
                res.error_code, res.error_message = ErrorCode.INVALID_CONFIG, bad
                continue
            if r.resource_type == RESOURCE_GROUP:
                self._alter_group(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_TOPIC:
                self._alter_topic(ctx, r.resource_name, changes, req.validate_only, res)
            elif r.resource_type == RESOURCE_BROKER:
                self._alter_broker(ctx, r.resource_name, changes, req.validate_only, res)
            else:
                res.error_code = ErrorCode.INVALID_REQUEST
                res.error_message = f"resource type {r.resource_type} cannot be altered on this broker"
        return Response(responses=out)

    def _alter_group(self, ctx: RequestContext, group: str, changes: list[tuple[str, str | None]],
                     validate_only: bool, res: ResourceResponse) -> None:
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
            configs.apply(group, changes, check)
        except InvalidGroupConfig as exc:
            res.error_code, res.error_message = ErrorCode.INVALID_CONFIG, str(exc)
            log.info("group config refused", group=group, reason=res.error_message)
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
                return
        if validate_only:
            return
        self.services.topics.alter_configs(topic, changes)

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
            return
        if validate_only:
            return
        self.services.config.apply_dynamic(THIS_BROKER if name else CLUSTER_DEFAULT, changes)
        log.info("dynamic broker config changed", resource=name or "<cluster default>", changes=dict(changes))


def register(table: ApiTable, services: AlterConfigsServices) -> AlterConfigs:
    h = AlterConfigs(services)
    table.register(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, h.incremental_alter_configs)
    return h
