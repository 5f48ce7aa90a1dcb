"""request.timeout.ms in a tool's properties reaches the bundled client through its config, as every other
connection key does; a value that is not a number is the tool's own error."""

from __future__ import annotations

import pytest

from shoal.client.consumer.share_consumer import AsyncShareConsumer
from shoal.client.tools.config import ToolConfigError, split_settings


def test_request_timeout_reaches_the_client_through_its_config() -> None:
    settings = split_settings({"request.timeout.ms": "4321", "security.protocol": "PLAINTEXT"}, for_consumer=True)
    consumer = AsyncShareConsumer("127.0.0.1:1", "g", config=settings.connection)
    assert consumer.config.request_timeout_ms == 4321
    with pytest.raises(ToolConfigError):
        split_settings({"request.timeout.ms": "soon"})
