"""A broker in this process and Fetch requests to it through the wire codec both ways, for unit tests of
the Fetch handler's answers (no socket: the handler is called as the connection would call it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from shoal.broker.common.config import BrokerConfig, Listener
from shoal.broker.network.connection import KafkaConnection, RequestContext
from shoal.broker.server.server import Broker
from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey

Req = messages.FetchRequest
FETCH_VERSION = 12  # topics by name


async def running_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """For a fixture: a started broker with one partition per internal topic, stopped afterwards."""
    b = Broker(BrokerConfig.from_strings({
        "log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0", "offsets.topic.num.partitions": "1",
        "share.coordinator.state.topic.num.partitions": "1",
    }))
    await b.start()
    yield b
    await b.stop()


def fetch_request(topic: str, partitions: list[tuple[int, int, int]], *, max_bytes: int = 1 << 20,
                  isolation_level: int = 0) -> messages.FetchRequest:
    """A sessionless Fetch of `topic` that answers at once; `partitions` are (partition, fetch offset,
    partition max bytes), in request order."""
    return Req(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=isolation_level,
               session_id=0, session_epoch=-1, topics=[Req.FetchTopic(topic=topic, partitions=[  # type: ignore[attr-defined]
                   Req.FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=limit)  # type: ignore[attr-defined]
                   for p, offset, limit in partitions])],
               forgotten_topics_data=[], rack_id="")


async def fetch(broker: Broker, req: messages.FetchRequest) -> messages.FetchResponse:
    """`req` encoded, decoded and handled as the connection would, its response encoded and decoded again."""
    _, decoded = messages.decode_request(messages.encode_request(req, ApiKey.FETCH, FETCH_VERSION, 3, "test"))
    conn = KafkaConnection(broker, Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0))
    ctx = RequestContext(messages.RequestHeader(ApiKey.FETCH, FETCH_VERSION, 3, "test"), conn)
    resp = await broker.apis[ApiKey.FETCH].handler(ctx, decoded)
    framed = messages.encode_response(resp, ApiKey.FETCH, FETCH_VERSION, 3)
    out: messages.FetchResponse = messages.decode_response(framed[4:], ApiKey.FETCH, FETCH_VERSION)[1]
    return out
