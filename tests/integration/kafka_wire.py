"""A minimal blocking Kafka client over a raw socket, for tests that need exact requests.

It uses Shoal's protocol package only to build and parse frames; the broker on the other side is the
real process.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from shoal.protocol import messages
from shoal.protocol.api_keys import ApiKey


class WireClient:
    def __init__(self, host: str, port: int, client_id: str = "shoal-tests", timeout: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self._correlation = 0

    @classmethod
    def connect(cls, bootstrap: str, **kwargs: Any) -> WireClient:
        host, port = bootstrap.rsplit(":", 1)
        return cls(host, int(port), **kwargs)

    def send(self, api_key: int, version: int, body: Any) -> int:
        self._correlation += 1
        frame = messages.encode_request(body, api_key, version, self._correlation, self.client_id)
        self.sock.sendall(struct.pack(">i", len(frame)) + bytes(frame))
        return self._correlation

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        size = struct.unpack(">i", self._read(4))[0]
        return messages.decode_response(self._read(size), api_key, version)

    def request(self, api_key: int, version: int, body: Any) -> Any:
        correlation = self.send(api_key, version, body)
        got, response = self.receive(api_key, version)
        assert got == correlation, (got, correlation)
        return response

    def _read(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def alter_client_quota(wire: WireClient, ops: list[tuple[str, float, bool]], **names: str | None) -> Any:
    """AlterClientQuotas for one entity named by keyword (`user=`, `client_id=`, `ip=`; None is the default
    entity) with (key, value, remove) ops; the entity's result."""
    acq = messages.AlterClientQuotasRequest
    entity = [acq.EntityData(entity_type=t.replace("_", "-"), entity_name=n)  # type: ignore[attr-defined]
              for t, n in names.items()]
    entry = acq.EntryData(entity=entity, ops=[acq.OpData(key=k, value=v, remove=r)  # type: ignore[attr-defined]
                                              for k, v, r in ops])
    [res] = wire.request(ApiKey.ALTER_CLIENT_QUOTAS, 1, acq(entries=[entry], validate_only=False)).entries
    return res


def produce(wire: WireClient, topic: str, batch: bytes, *, transactional_id: str | None = None, version: int = 9,
            acks: int = -1, partition: int = 0) -> Any:
    """One Produce of `batch` to one partition of `topic` (by name: versions up to 12); the response."""
    req = messages.ProduceRequest
    data = req.TopicProduceData(name=topic, partition_data=[req.PartitionProduceData(index=partition, records=batch)])
    return wire.request(ApiKey.PRODUCE, version, req(transactional_id=transactional_id, acks=acks, timeout_ms=10_000,
                                                     topic_data=[data]))


def write_txn_marker(wire: WireClient, topic: str, pid: int, epoch: int, coordinator_epoch: int, *,
                     commit: bool = False, version: int = 1, transaction_version: int = 0) -> int:
    """WriteTxnMarkers as the admin path sends it: one marker on partition 0 of `topic`; its error code."""
    wm = messages.WriteTxnMarkersRequest
    resp = wire.request(ApiKey.WRITE_TXN_MARKERS, version, wm(markers=[wm.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
        transaction_version=transaction_version, topics=[wm.WritableTxnMarkerTopic(name=topic, partition_indexes=[0])])]))
    return int(resp.markers[0].topics[0].partitions[0].error_code)


def lso_and_end(wire: WireClient, topic: str) -> tuple[int, int]:
    """Partition 0's last stable offset (read_committed ListOffsets LATEST) and its end offset."""
    lo = messages.ListOffsetsRequest
    out = []
    for isolation in (1, 0):
        topic_req = lo.ListOffsetsTopic(name=topic, partitions=[lo.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])
        resp = wire.request(ApiKey.LIST_OFFSETS, 7, lo(replica_id=-1, isolation_level=isolation, topics=[topic_req]))
        out.append(int(resp.topics[0].partitions[0].offset))
    return out[0], out[1]
