"""What the network layer sees of the broker: the dispatch entries it routes requests to and the few parts a
connection uses (settings, metrics, the authorizer, TLS contexts, the purgatory and its lifecycle hooks).

The server's `Broker` satisfies `RequestChannel`; API handlers register `Api` entries into it. Defining the
view here, below the handlers, keeps the import direction server -> apis -> network.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shoal.broker.common.config import BrokerConfig
    from shoal.broker.common.metrics import BrokerMetrics
    from shoal.broker.common.purgatory import Purgatory
    from shoal.broker.security.authorizer import Authorizer
    from shoal.protocol.messages import ApiVersionsResponse, RequestHeader


@dataclass(frozen=True, slots=True)
class Api:
    """A handler for one API key over a version range; `handler(ctx, body)` returns the response body."""

    key: int
    name: str
    min_version: int
    max_version: int
    handler: Callable[..., Any]
    is_async: bool


class RequestChannel(Protocol):
    config: BrokerConfig
    metrics: BrokerMetrics
    authorizer: Authorizer
    ssl_contexts: dict[str, ssl.SSLContext]
    purgatory: Purgatory
    apis: dict[int, Api]

    def api_versions_fallback(self, header: RequestHeader) -> ApiVersionsResponse: ...

    # Connections are typed loosely: the server keeps them without knowing this layer's class.
    def on_connection_opened(self, conn: Any) -> None: ...

    def on_connection_closed(self, conn: Any) -> None: ...

    def track_request(self, task: asyncio.Task[Any]) -> None:
        """A request handler started; it runs to completion even if its connection closes."""
        ...
