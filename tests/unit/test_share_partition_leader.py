"""Share-partition leaders over real parts: a partition log on disk, the share coordinator on a state
topic on disk, the default persister between them. What the leader adds to the state machine: writes
that run while fetches acquire, roll-back when a write fails, and when SPSO follows the log start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.common.config import BrokerConfig
from shoal.broker.common.purgatory import Purgatory
from shoal.broker.share.group_configs import GroupConfigs
from shoal.broker.share.share_partition import AckBatch, AcquireMode, RecordState
from shoal.broker.share.share_partition_leader import Acquisition, SharePartitionLeader
from shoal.broker.storage.partition_log import PartitionLog
from shoal.broker.storage.partition_source import LocalPartitionSource
from shoal.broker.storage.topic_registry import Topic
from shoal.coordinator.share_coordinator_client import InProcessShareCoordinatorClient
from shoal.persister.default_persister import DefaultStatePersister
from shoal.persister.persister import Persister, SharePartitionKey, WriteStateRequest
from shoal.protocol.errors import ErrorCode
from shoal.protocol.record_batch import HEADER_SIZE, iter_packed_headers

from .test_partition_log import append, cfg, make_batch
from .test_share_coordinator import close_topic, make_coordinator, open_state_topic

RELEASE, ACCEPT = 2, 1
KEY = SharePartitionKey("g1", bytes(range(16)), 0)


@dataclass
class Parts:
    leader: SharePartitionLeader
    plog: PartitionLog
    state_topic: Topic


async def open_parts(tmp_path: Path, batches: list[list[bytes]], plog: PartitionLog | None = None) -> Parts:
    """A leader over a log holding `batches` (one log batch each) and a share coordinator on disk."""
    state_topic = open_state_topic(tmp_path / "state")
    coordinator = await make_coordinator(state_topic)
    persister = DefaultStatePersister(InProcessShareCoordinatorClient(coordinator))
    assert await persister.initialize_state(KEY, 0, 0) == ErrorCode.NONE
    plog = plog or PartitionLog.open(tmp_path / "orders-0", cfg())
    for values in batches:
        append(plog, make_batch(values))
    group_configs = GroupConfigs(tmp_path, BrokerConfig.from_strings({"log.dirs": str(tmp_path)}))
    return Parts(SharePartitionLeader(KEY, LocalPartitionSource(plog), persister, group_configs, Purgatory()), plog, state_topic)


def close_parts(parts: Parts) -> None:
    parts.leader.drop()
    parts.plog.close()
    close_topic(parts.state_topic)  # closing twice is fine


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    # Two log batches: offsets 0-4 and 5-9.
    opened = await open_parts(tmp_path, [[f"v{first + i}".encode() for i in range(5)] for first in (0, 5)])
    yield opened
    close_parts(opened)


async def acquire(leader: SharePartitionLeader, member: str, max_records: int = 500) -> list[tuple[int, int, int]]:
    got: Acquisition = await leader.acquire(member, max_records=max_records, batch_size=500, max_bytes=1 << 20,
                                            mode=AcquireMode.BATCH_OPTIMIZED)
    assert got.error_code == ErrorCode.NONE
    return [tuple(r) for r in got.acquired]  # type: ignore[misc]


async def test_a_release_is_not_acquirable_while_its_write_runs(parts: Parts) -> None:
    leader = parts.leader
    assert await acquire(leader, "m1", max_records=1) == [(0, 4, 1)]
    release = asyncio.ensure_future(leader.acknowledge("m1", [AckBatch(0, 4, [RELEASE])]))
    await asyncio.sleep(0)  # the acknowledgement is applied and its write (an fsync) is under way
    assert leader.writes_in_flight == 1
    # A fetch alongside gets the other records, not the ones being released.
    assert await acquire(leader, "m1") == [(5, 9, 1)]
    assert await release == ErrorCode.NONE
    assert await acquire(leader, "m2") == [(0, 4, 2)]


async def test_an_acknowledgement_is_applied_in_memory_before_its_write_completes(parts: Parts) -> None:
    leader = parts.leader
    assert await acquire(leader, "m1", max_records=1) == [(0, 4, 1)]
    pending = leader.start_acknowledge("m1", [AckBatch(0, 4, [ACCEPT])])
    await pending.applied
    sp = leader.state
    assert sp is not None and sp.start_offset == 5  # memory holds the ACCEPT
    assert not pending.done.done() and leader.writes_in_flight == 1  # while its write is under way
    assert await pending.done == ErrorCode.NONE


class CountingPersister:
    """The leader's own persister, counting its state writes."""

    def __init__(self, inner: Persister):
        self.inner = inner
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_state(self, request: WriteStateRequest) -> int:
        self.writes += 1
        return await self.inner.write_state(request)


async def test_acknowledgements_queued_behind_a_write_share_the_next_one(parts: Parts) -> None:
    leader = parts.leader
    counting = CountingPersister(leader.persister)
    leader.persister = counting
    assert await acquire(leader, "m1") == [(0, 9, 1)]
    # The first write is under way when the other two are applied: one write (one fsync) carries both.
    acks = [leader.acknowledge("m1", [AckBatch(first, last, [ACCEPT])]) for first, last in ((0, 3), (4, 6), (7, 9))]
    assert await asyncio.gather(*acks) == [ErrorCode.NONE] * 3
    assert counting.writes == 2
    # And what they share is durable: a leader loading the state afresh finds all ten acknowledged.
    reloaded = SharePartitionLeader(KEY, leader.source, counting.inner, leader.group_configs, Purgatory())
    append(parts.plog, make_batch([b"v10"]))
    assert await acquire(reloaded, "m2") == [(10, 10, 1)]
    reloaded.drop()


async def test_a_refused_acknowledgement_settles_applied_too(parts: Parts) -> None:
    leader = parts.leader
    assert await acquire(leader, "m1", max_records=1) == [(0, 4, 1)]
    pending = leader.start_acknowledge("m2", [AckBatch(0, 4, [ACCEPT])])  # not m2's records
    await pending.applied
    assert await pending.done == ErrorCode.INVALID_RECORD_STATE


async def test_a_failed_release_write_rolls_back_to_acquired(parts: Parts) -> None:
    leader = parts.leader
    assert await acquire(leader, "m1") == [(0, 9, 1)]
    close_topic(parts.state_topic)  # the state topic goes away: the release cannot be made durable
    await leader.release_member("m1")
    sp = leader.state
    assert sp is not None
    assert [sp.offset_state(o) for o in (0, 9)] == [(RecordState.ACQUIRED, "m1", 1)] * 2
    assert await acquire(leader, "m2") == []


async def test_spso_moves_to_the_log_start_only_when_the_fetch_offset_is_out_of_range(parts: Parts) -> None:
    leader, plog = parts.leader, parts.plog
    assert await acquire(leader, "m1", max_records=1) == [(0, 4, 1)]
    plog.delete_records_before(3)
    assert await acquire(leader, "m2") == [(5, 9, 1)]
    sp = leader.state
    assert sp is not None and sp.start_offset == 0  # the fetch offset (5) is in range: SPSO stays
    # So every acknowledgement of the records below the new log start still counts.
    assert await leader.acknowledge("m1", [AckBatch(0, 4, [ACCEPT])]) == ErrorCode.NONE
    assert sp.start_offset == 5
    assert await leader.acknowledge("m2", [AckBatch(5, 9, [RELEASE])]) == ErrorCode.NONE
    plog.delete_records_before(8)
    assert await acquire(leader, "m2") == []  # fetch offset 5 is gone: now SPSO follows the log start
    assert sp.start_offset == 8
    assert await acquire(leader, "m2") == [(8, 9, 2)]


class RecordingLog(PartitionLog):
    """The real partition log, noting the byte limit of every read."""

    reads: list[int]

    def read(self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        self.reads.append(max_bytes)
        return super().read(fetch_offset, max_bytes, max_offset=max_offset)


async def test_passes_read_what_they_acquire_and_still_take_every_offset_once(tmp_path: Path) -> None:
    plog = RecordingLog.open(tmp_path / "orders-0", cfg())
    assert isinstance(plog, RecordingLog)
    plog.reads = []
    # 400 batches of 10 records, about 130 KB in all.
    batches = [[f"value-{first + i:06d}".encode() * 3 for i in range(10)] for first in range(0, 4000, 10)]
    parts = await open_parts(tmp_path, batches, plog)
    try:
        taken: list[int] = []
        while True:
            got = await parts.leader.acquire("m1", max_records=25, batch_size=25, max_bytes=16 << 20,
                                             mode=AcquireMode.BATCH_OPTIMIZED)
            if not got.acquired:
                break
            for r in got.acquired:
                taken.extend(range(r.first_offset, r.last_offset + 1))
            assert await parts.leader.acknowledge("m1", [AckBatch(r.first_offset, r.last_offset, [ACCEPT])
                                                         for r in got.acquired]) == ErrorCode.NONE
        assert taken == list(range(4000))
        # The first pass reads a partition fetch's worth; later ones what 25 records take, not 16 MiB.
        assert plog.reads[0] < 16 << 20 and max(plog.reads[1:]) < 1 << 20
    finally:
        close_parts(parts)


async def test_a_headers_only_acquisition_carries_each_batchs_header_alone(parts: Parts) -> None:
    leader = parts.leader
    got = await leader.acquire("m1", max_records=1, batch_size=500, max_bytes=1 << 20,
                               mode=AcquireMode.BATCH_OPTIMIZED, headers_only=True)
    assert [tuple(r) for r in got.acquired] == [(0, 4, 1)]
    assert len(got.records) == HEADER_SIZE
    (header,) = iter_packed_headers(got.records)
    assert (header.base_offset, header.last_offset) == (0, 4)
    # The same acquisition without it sends the whole stored batch, which starts with that header.
    whole = await leader.acquire("m2", max_records=500, batch_size=500, max_bytes=1 << 20,
                                 mode=AcquireMode.BATCH_OPTIMIZED)
    assert [tuple(r) for r in whole.acquired] == [(5, 9, 1)]
    (rest,) = iter_packed_headers(whole.records[:HEADER_SIZE])
    assert (rest.base_offset, rest.last_offset, rest.size) == (5, 9, len(whole.records))


async def test_a_leader_drops_state_altered_or_deleted_under_it(parts: Parts) -> None:
    # Another sidecar's group coordinator alters or deletes the stored state while this leader holds it.
    leader, persister = parts.leader, parts.leader.persister
    assert await acquire(leader, "m1") == [(0, 9, 1)]
    assert await leader.acknowledge("m1", [AckBatch(0, 9, [ACCEPT])]) == ErrorCode.NONE
    assert not await leader.drop_if_state_changed()  # the stored state is the one in memory
    assert leader.state is not None and leader.state.start_offset == 10

    # AlterShareGroupOffsets: a higher state epoch, start offset 3. The next use loads it.
    assert await persister.initialize_state(KEY, 1, 3) == ErrorCode.NONE
    assert await leader.drop_if_state_changed() and leader.state is None
    assert await acquire(leader, "m2") == [(3, 9, 1)]
    assert not await leader.drop_if_state_changed()

    # DeleteShareGroupOffsets / DeleteGroups: no stored state at all.
    assert await persister.delete_state(KEY) == ErrorCode.NONE
    assert await leader.drop_if_state_changed() and leader.state is None


class PendingStore:
    """A group-config store holding a change made through another instance, which this one applies only
    when it reads the store again (`refresh`), as a sidecar's tail would a moment later."""

    def __init__(self, configs: GroupConfigs, group_id: str, changes: dict[str, str]):
        self.configs = configs
        self.pending: tuple[str, dict[str, str]] | None = (group_id, changes)

    async def write(self, group_id: str, changes: Any) -> None:
        raise AssertionError("not written here")

    async def delete_group(self, group_id: str) -> None:
        raise AssertionError("not deleted here")

    async def refresh(self) -> None:
        if self.pending is not None:
            self.configs.replace(*self.pending)
            self.pending = None


async def test_a_first_load_reads_share_auto_offset_reset_as_the_store_has_it_now(tmp_path: Path) -> None:
    """share.auto.offset.reset=earliest set through another sidecar just before the group's first fetch:
    the leader resolves the start offset by the stored policy, not the "latest" it held before, which
    skipped every record produced before the first fetch."""
    parts = await open_parts(tmp_path, [[f"v{i}".encode() for i in range(5)]])
    try:
        uninitialised = SharePartitionKey("g2", KEY.topic_id, 0)
        assert await parts.leader.persister.initialize_state(uninitialised, 0, -1) == ErrorCode.NONE
        configs = parts.leader.group_configs
        configs.use_store(PendingStore(configs, "g2", {"share.auto.offset.reset": "earliest"}))
        leader = SharePartitionLeader(uninitialised, LocalPartitionSource(parts.plog), parts.leader.persister,
                                      configs, Purgatory())
        assert await leader.ensure_loaded() == ErrorCode.NONE
        assert leader.state is not None and leader.state.start_offset == 0
        leader.drop()
    finally:
        close_parts(parts)
