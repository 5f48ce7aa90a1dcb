"""Share-partition state machine: behaviours pinned by Apache Kafka's SharePartitionTest, the KIP-932
worked example, and a stateful property test against a per-offset model."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shoal.broker.share.share_partition import (
    AckBatch,
    AckOutcome,
    AcquireMode,
    FetchedBatch,
    RecordState,
    SharePartition,
)
from shoal.persister.persister import PersistedStateBatch

TOPIC_ID = bytes(range(16))
ACCEPT, RELEASE, REJECT, GAP, RENEW = 1, 2, 3, 0, 4
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = (RecordState.AVAILABLE, RecordState.ACQUIRED,
                                                RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
INVALID_REQUEST, INVALID_RECORD_STATE = 42, 121
LOCK = 30000


def make(start: int = 0, batches: list[PersistedStateBatch] | None = None, **kw: int) -> SharePartition:
    return SharePartition("g1", TOPIC_ID, 0, start_offset=start, state_epoch=0,
                          state_batches=batches or [], **kw)


def fb(*bounds: tuple[int, int]) -> list[FetchedBatch]:
    return [FetchedBatch(a, b) for a, b in bounds]


def acq(sp: SharePartition, member: str, *bounds: tuple[int, int], max_records: int = 500,
        batch_size: int = 500, now: int = 0, mode: AcquireMode = AcquireMode.BATCH_OPTIMIZED,
        fetch_offset: int | None = None) -> list[tuple[int, int, int]]:
    got = sp.acquire(member, fb(*bounds), max_records=max_records, batch_size=batch_size, now_ms=now,
                     mode=mode, fetch_offset=fetch_offset)
    return [tuple(r) for r in got]  # type: ignore[misc]


def ack(sp: SharePartition, member: str, *batches: tuple[int, int, list[int]], now: int = 0) -> AckOutcome:
    return sp.acknowledge(member, [AckBatch(a, b, t) for a, b, t in batches], now_ms=now)


def states(sp: SharePartition, lo: int, hi: int) -> list[tuple[RecordState, str | None, int] | None]:
    return [sp.offset_state(o) for o in range(lo, hi + 1)]


def persisted(sp: SharePartition, changed_only: bool = True) -> tuple[int, list[tuple[int, int, int, int]]]:
    snap = sp.write_state(changed_only)
    return snap.start_offset, [astuple(b) for b in snap.state_batches]


# ---------------------------------------------------------------- acquisition


def test_acquire_multiple_records() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 9)) == [(0, 9, 1)]
    assert sp.next_fetch_offset() == 10
    assert sp.end_offset == 9 and sp.start_offset == 0
    assert sp.acquired_count == 10 and sp.cached_batch_count == 1
    assert sp.offset_state(5) == (ACQUIRED, "m1", 1)
    assert sp.lock_deadline(5) == LOCK


def test_acquire_with_max_fetch_records_is_soft_to_log_batch_end() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 4), max_records=10) == [(0, 4, 1)]
    # One log batch 0-24 read again from 0: cached 0-4 is skipped, the rest of the batch goes out whole.
    assert acq(sp, "m1", (0, 24), max_records=10) == [(5, 24, 1)]
    assert sp.next_fetch_offset() == 25 and sp.cached_batch_count == 2
    # Several log batches: stop at the end of the batch holding the 7th record.
    sp2 = make()
    assert acq(sp2, "m1", (0, 4), (5, 9), (10, 14), max_records=7) == [(0, 9, 1)]
    assert sp2.next_fetch_offset() == 10


def test_acquire_with_batch_size_splits_at_log_batch_boundaries() -> None:
    sp = make(start=2)
    got = acq(sp, "m1", (2, 6), (10, 14), (15, 21), (22, 27), batch_size=5, max_records=100)
    # The hole 7-9 (compacted) stays inside the first range; the client reports it as GAP.
    assert got == [(2, 9, 1), (10, 14, 1), (15, 21, 1), (22, 27, 1)]
    assert sp.next_fetch_offset() == 28 and sp.cached_batch_count == 4
    # Small log batches are grouped until a chunk reaches the batch size.
    sp2 = make()
    got = acq(sp2, "m1", (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), batch_size=3)
    assert got == [(0, 3, 1), (4, 7, 1), (8, 9, 1)]


def test_acquire_with_max_in_flight_records_and_try_acquire_new_batch() -> None:
    sp = make(max_in_flight_records=20)
    assert acq(sp, "m1", (0, 9)) == [(0, 9, 1)]
    # Budget 10 ends inside log batch 15-24, which is taken whole (the limit is soft per batch).
    assert acq(sp, "m1", (10, 14), (15, 24), (25, 29), (30, 31)) == [(10, 24, 1)]
    assert sp.next_fetch_offset() == 25 and sp.in_flight_count == 25
    assert not sp.can_acquire()
    assert acq(sp, "m1", (25, 34)) == []
    assert sp.next_fetch_offset() == 25
    # A released record inside the cache is still served at the limit, but nothing new.
    assert ack(sp, "m1", (3, 3, [RELEASE])).error_code == 0
    assert sp.can_acquire()
    assert acq(sp, "m2", (0, 9), (10, 24), (25, 29)) == [(3, 3, 2)]


def test_acquirable_is_the_in_flight_room_or_at_the_limit_the_cached_range_from_the_next_fetch_offset() -> None:
    sp = make(max_in_flight_records=20)
    assert sp.acquirable(500) == 20 and sp.acquirable(7) == 7
    assert acq(sp, "m1", (0, 9)) == [(0, 9, 1)]
    assert sp.acquirable(500) == 10
    assert acq(sp, "m1", (10, 24)) == [(10, 24, 1)]
    assert sp.acquirable(500) == 0  # at the limit with nothing AVAILABLE in the cache
    assert ack(sp, "m1", (3, 3, [RELEASE])).error_code == 0
    # Only the cached range from the released offset (3) to the cache end (24) can still go out.
    assert sp.acquirable(500) == 22 and sp.acquirable(5) == 5
    assert sp.acquirable(0) == 0


def test_acquire_released_record_gets_delivery_count_plus_one() -> None:
    sp = make()
    acq(sp, "m1", (0, 4))
    assert ack(sp, "m1", (0, 4, [RELEASE])).error_code == 0
    assert sp.next_fetch_offset() == 0 and sp.available_count == 5
    assert acq(sp, "m2", (0, 4)) == [(0, 4, 2)]
    assert sp.offset_state(0) == (ACQUIRED, "m2", 2)
    # Released per offset: re-acquisition follows the single offsets that are AVAILABLE.
    assert ack(sp, "m2", (0, 4, [ACCEPT, RELEASE, ACCEPT, RELEASE, RELEASE])).error_code == 0
    assert sp.start_offset == 1 and sp.next_fetch_offset() == 1
    assert acq(sp, "m1", (0, 4)) == [(1, 1, 3), (3, 4, 3)]


def test_never_acquires_acquired_offsets_and_skips_below_spso() -> None:
    sp = make(start=3)
    assert acq(sp, "m1", (0, 9)) == [(3, 9, 1)]
    assert acq(sp, "m2", (0, 9)) == []
    assert acq(sp, "m2", (0, 9), (10, 12)) == [(10, 12, 1)]


def test_record_limit_mode_is_strict_and_keeps_rest_of_log_batch_available() -> None:
    sp = make()
    got = acq(sp, "m1", (0, 9), max_records=3, mode=AcquireMode.RECORD_LIMIT)
    assert got == [(0, 2, 1)]
    assert sp.next_fetch_offset() == 3 and sp.end_offset == 9
    assert sp.offset_state(3) == (AVAILABLE, None, 0)
    assert acq(sp, "m2", (0, 9), max_records=4, mode=AcquireMode.RECORD_LIMIT) == [(3, 6, 1)]
    assert acq(sp, "m2", (0, 9), (10, 19), max_records=5, mode=AcquireMode.RECORD_LIMIT) == [(7, 9, 1), (10, 11, 1)]
    # Compare batch_optimized on the same shape: the whole log batch goes out.
    sp2 = make()
    assert acq(sp2, "m1", (0, 9), max_records=3) == [(0, 9, 1)]


def test_whole_batch_acquire_and_accept_stays_batch_tracked() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 499)) == [(0, 499, 1)]
    batch = sp._batches[0]
    assert batch.starts is None
    assert ack(sp, "m1", (0, 499, [ACCEPT])).error_code == 0
    assert sp.cached_batch_count == 0 and sp.start_offset == 500


def test_next_lock_deadline_and_oldest_lock_start() -> None:
    sp = make()
    assert sp.next_lock_deadline() is None
    acq(sp, "m1", (0, 4), now=1000)
    acq(sp, "m1", (5, 9), now=2000)
    assert sp.next_lock_deadline() == 1000 + LOCK
    assert sp.oldest_lock_start_ms() == 1000
    ack(sp, "m1", (0, 4, [ACCEPT]))
    assert sp.next_lock_deadline() == 2000 + LOCK


# ---------------------------------------------------------------- acknowledgement


def test_acknowledge_single_record_batch_moves_spso_and_empties_cache() -> None:
    sp = make()
    acq(sp, "m1", (0, 0))
    out = ack(sp, "m1", (0, 0, [ACCEPT]))
    assert out.error_code == 0 and out.persist_required
    assert sp.start_offset == 1 and sp.cached_batch_count == 0
    assert sp.next_fetch_offset() == 1 and sp.end_offset == 0 and sp.in_flight_count == 0
    assert persisted(sp) == (1, [])


def test_all_records_acknowledged_clears_cache() -> None:
    sp = make()
    acq(sp, "m1", (0, 9), (10, 14), batch_size=5)
    acq(sp, "m2", (15, 19))
    assert ack(sp, "m2", (15, 19, [REJECT])).error_code == 0
    assert sp.start_offset == 0
    assert ack(sp, "m1", (0, 14, [ACCEPT])).error_code == 0
    assert sp.start_offset == 20 and sp.cached_batch_count == 0 and sp.next_fetch_offset() == 20


def test_acknowledge_multiple_record_batch_with_gap_offsets() -> None:
    sp = make(start=5)
    assert acq(sp, "m1", (5, 6), (10, 18)) == [(5, 18, 1)]
    types = [ACCEPT, ACCEPT, GAP, GAP, GAP, ACCEPT, RELEASE, REJECT, ACCEPT, RELEASE, ACCEPT, ACCEPT, ACCEPT, GAP]
    assert ack(sp, "m1", (5, 18, types)).error_code == 0
    # Below SPSO but kept: the in-flight batch 5-18 leaves the cache only once fully terminal.
    assert sp.offset_state(7) == (ARCHIVED, None, 1)
    assert sp.start_offset == 11
    assert sp.offset_state(11) == (AVAILABLE, None, 1)
    assert sp.offset_state(12) == (ARCHIVED, None, 1)
    assert sp.offset_state(18) == (ARCHIVED, None, 1)
    assert sp.next_fetch_offset() == 11
    assert acq(sp, "m2", (5, 6), (10, 18)) == [(11, 11, 2), (14, 14, 2)]


def test_acknowledge_out_of_range_cached_data() -> None:
    sp = make(start=5)
    assert ack(sp, "m1", (0, 15, [REJECT])).error_code == INVALID_RECORD_STATE
    acq(sp, "m1", (5, 9))
    assert ack(sp, "m1", (20, 25, [REJECT])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (7, 12, [REJECT])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (0, 3, [REJECT])).error_code == 0  # wholly below SPSO: skipped
    assert sp.offset_state(5) == (ACQUIRED, "m1", 1)
    assert ack(sp, "m1", (3, 6, [ACCEPT])).error_code == 0  # 3-4 below SPSO are skipped
    assert sp.start_offset == 7


def test_acknowledge_malformed_batches_are_invalid_request() -> None:
    sp = make()
    acq(sp, "m1", (0, 9))
    assert ack(sp, "m1", (5, 4, [ACCEPT])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (0, 3, [])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (0, 3, [ACCEPT, ACCEPT])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (0, 3, [5])).error_code == INVALID_REQUEST
    assert ack(sp, "m1", (4, 6, [ACCEPT]), (2, 3, [ACCEPT])).error_code == INVALID_REQUEST
    assert sp.acquired_count == 10
    # Equal boundary is accepted by validation but offset 3 is then no longer ACQUIRED.
    assert ack(sp, "m1", (0, 3, [ACCEPT]), (3, 5, [ACCEPT])).error_code == INVALID_RECORD_STATE
    assert sp.acquired_count == 10


def test_acknowledge_with_another_member() -> None:
    sp = make()
    acq(sp, "m1", (5, 9))
    before = states(sp, 5, 9)
    assert ack(sp, "m2", (5, 9, [ACCEPT])).error_code == INVALID_RECORD_STATE
    assert ack(sp, "m2", (6, 7, [ACCEPT])).error_code == INVALID_RECORD_STATE
    assert states(sp, 5, 9) == before


def test_acknowledge_rollback_with_full_batch_error() -> None:
    sp = make(start=5)
    acq(sp, "m1", (5, 9))
    acq(sp, "m2", (10, 14))
    before = states(sp, 5, 14)
    out = ack(sp, "m1", (5, 9, [ACCEPT]), (10, 14, [ACCEPT]))
    assert out.error_code == INVALID_RECORD_STATE
    assert states(sp, 5, 14) == before and sp.start_offset == 5
    assert persisted(sp) == (5, [])


def test_acknowledge_rollback_with_subset_error() -> None:
    sp = make(start=5)
    acq(sp, "m1", (5, 9))
    acq(sp, "m1", (10, 14))
    ack(sp, "m1", (12, 12, [RELEASE]))
    persisted(sp)
    before = states(sp, 5, 14)
    out = ack(sp, "m1", (5, 9, [RELEASE]), (10, 14, [ACCEPT, ACCEPT, ACCEPT, ACCEPT, ACCEPT]))
    assert out.error_code == INVALID_RECORD_STATE
    assert states(sp, 5, 14) == before
    assert persisted(sp) == (5, [])
    assert sp.next_fetch_offset() == 12


def test_rollback_after_failed_persist_restores_acquired_and_spso() -> None:
    sp = make()
    acq(sp, "m1", (0, 4), now=0)
    acq(sp, "m1", (5, 9), now=0)
    out = ack(sp, "m1", (0, 9, [ACCEPT]))
    assert sp.start_offset == 10 and sp.cached_batch_count == 0
    assert persisted(sp) == (10, [])
    assert sp.rollback(out)
    assert sp.start_offset == 0
    assert states(sp, 0, 9) == [(ACQUIRED, "m1", 1)] * 10
    assert sp.lock_deadline(3) == LOCK
    # The lost write may have carried other changes: the next write is the whole cache.
    assert persisted(sp) == (0, [(0, 9, 0, 1)])
    assert not sp.rollback(out)  # single use
    # Rolled-back records can be acknowledged again.
    assert ack(sp, "m1", (0, 9, [ACCEPT])).error_code == 0 and sp.start_offset == 10


def test_rollback_leaves_records_reacquired_meanwhile_and_expires_lapsed_locks() -> None:
    sp = make()
    acq(sp, "m1", (0, 9), now=0)
    out = ack(sp, "m1", (0, 4, [RELEASE]))
    assert acq(sp, "m2", (0, 9), now=10) == [(0, 4, 2)]
    assert sp.rollback(out)
    assert sp.offset_state(0) == (ACQUIRED, "m2", 2)
    # RELEASE of 5-9 rolled back after the lock lapsed: back to AVAILABLE, not ACQUIRED.
    out = ack(sp, "m1", (5, 9, [ACCEPT]))
    assert sp.rollback(out, now_ms=LOCK + 1)
    assert sp.offset_state(5) == (AVAILABLE, None, 1)
    assert sp.offset_state(0) == (ACQUIRED, "m2", 2)


def test_acknowledge_after_acquisition_lock_timeout_fails() -> None:
    sp = make()
    acq(sp, "m1", (0, 4), now=0)
    assert sp.expire_locks(LOCK)
    assert ack(sp, "m1", (0, 4, [ACCEPT])).error_code == INVALID_RECORD_STATE
    assert states(sp, 0, 4) == [(AVAILABLE, None, 1)] * 5


def test_renew_restarts_lock_without_persisting() -> None:
    sp = make()
    acq(sp, "m1", (0, 4), now=0)
    persisted(sp)
    out = ack(sp, "m1", (0, 4, [RENEW]), now=20000)
    assert out.error_code == 0 and not out.persist_required
    assert sp.next_lock_deadline() == 20000 + LOCK
    assert not sp.expire_locks(LOCK)
    assert sp.offset_state(0) == (ACQUIRED, "m1", 1)
    assert persisted(sp) == (0, [])
    assert sp.expire_locks(20000 + LOCK)
    # Renew on expired records fails.
    assert ack(sp, "m1", (0, 4, [RENEW]), now=60000).error_code == INVALID_RECORD_STATE


# ---------------------------------------------------------------- lock expiry, limits, releases


def test_acquisition_lock_timeout_at_delivery_limit_archives() -> None:
    sp = make(delivery_count_limit=2)
    acq(sp, "m1", (0, 9), now=0)
    assert sp.expire_locks(LOCK)
    assert sp.offset_state(0) == (AVAILABLE, None, 1)
    assert acq(sp, "m1", (0, 9), now=LOCK) == [(0, 9, 2)]
    assert sp.expire_locks(2 * LOCK)
    # Archived with delivery count 2; SPSO passes them and the cache empties.
    assert sp.start_offset == 10 and sp.cached_batch_count == 0
    assert sp.archived_count == 0 and sp.next_fetch_offset() == 10


def test_acquisition_lock_timeout_moves_spso() -> None:
    sp = make(delivery_count_limit=2)
    acq(sp, "m1", (0, 4), now=0)
    ack(sp, "m1", (0, 4, [RELEASE]))
    acq(sp, "m1", (0, 4), now=100)
    acq(sp, "m2", (5, 9), now=100)
    ack(sp, "m2", (5, 9, [ACCEPT]))
    assert sp.start_offset == 0
    persisted(sp)
    sp.expire_locks(100 + LOCK)
    assert sp.start_offset == 10
    assert persisted(sp) == (10, [])


def test_release_at_delivery_limit_archives() -> None:
    sp = make(delivery_count_limit=2)
    acq(sp, "m1", (0, 9))
    ack(sp, "m1", (0, 9, [RELEASE]))
    assert acq(sp, "m1", (0, 9)) == [(0, 9, 2)]
    ack(sp, "m1", (0, 4, [RELEASE]))
    assert sp.offset_state(0) == (ARCHIVED, None, 2)
    assert sp.start_offset == 5
    assert acq(sp, "m2", (0, 9)) == []


def test_release_member_touches_only_that_member() -> None:
    sp = make()
    acq(sp, "m1", (0, 4))
    acq(sp, "m2", (5, 9))
    assert sp.release_member("m1", now_ms=0)
    assert states(sp, 0, 4) == [(AVAILABLE, None, 1)] * 5
    assert states(sp, 5, 9) == [(ACQUIRED, "m2", 1)] * 5
    assert not sp.release_member("m3", now_ms=0)


def test_release_member_keeps_delivery_count() -> None:
    sp = make(delivery_count_limit=3)
    acq(sp, "m1", (0, 4))
    sp.release_member("m1", now_ms=0)
    assert acq(sp, "m1", (0, 4)) == [(0, 4, 2)]
    sp.release_member("m1", now_ms=0)
    assert sp.offset_state(0) == (AVAILABLE, None, 2)
    assert acq(sp, "m1", (0, 4)) == [(0, 0, 3)]  # last attempt goes out alone
    sp.release_member("m1", now_ms=0)
    assert sp.offset_state(0) == (ARCHIVED, None, 3)
    assert sp.start_offset == 1


def test_acknowledgements_in_between_do_not_move_spso() -> None:
    sp = make()
    acq(sp, "m1", (0, 9))
    acq(sp, "m1", (10, 19))
    acq(sp, "m1", (20, 29))
    ack(sp, "m1", (10, 19, [ACCEPT]))
    assert sp.start_offset == 0 and sp.in_flight_count == 30 and sp.cached_batch_count == 3
    ack(sp, "m1", (0, 9, [ACCEPT]))
    assert sp.start_offset == 20 and sp.cached_batch_count == 1
    assert sp.delivery_complete_count == 0


def test_next_fetch_offset_with_multiple_consumers() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 2)) == [(0, 2, 1)]
    assert acq(sp, "m2", (3, 5)) == [(3, 5, 1)]
    assert sp.next_fetch_offset() == 6
    ack(sp, "m2", (3, 5, [RELEASE]))
    assert sp.next_fetch_offset() == 3
    assert acq(sp, "m3", (3, 5), (6, 9)) == [(3, 5, 2), (6, 9, 1)]
    assert sp.next_fetch_offset() == 10
    ack(sp, "m1", (1, 1, [RELEASE]))
    assert sp.next_fetch_offset() == 1


def test_throttled_redelivery_halves_until_single_record_on_last_attempt() -> None:
    sp = make(start=5, batches=[PersistedStateBatch(15, 34, 0, 4)], delivery_count_limit=7)
    assert sp.throttle_threshold == 4
    assert (sp.start_offset, sp.end_offset, sp.next_fetch_offset()) == (5, 34, 5)
    # Read from 5 returns the log batch starting at 15: 5-14 are not in the log and are archived.
    assert acq(sp, "m1", (15, 34), now=0, fetch_offset=5) == [(15, 24, 5)]
    assert sp.start_offset == 15
    sp.expire_locks(LOCK)
    assert acq(sp, "m1", (15, 34), now=LOCK) == [(15, 19, 6)]
    sp.expire_locks(2 * LOCK)
    for i in range(5):
        assert acq(sp, "m1", (15, 34), now=2 * LOCK) == [(15 + i, 15 + i, 7)]
    assert acq(sp, "m1", (15, 34), now=2 * LOCK) == [(20, 24, 6)]
    assert acq(sp, "m1", (15, 34), now=2 * LOCK) == [(25, 34, 5)]
    # Last attempt done: expiry archives 15-19 at the limit.
    sp.expire_locks(3 * LOCK)
    assert sp.offset_state(15) == (ARCHIVED, None, 7)


def test_throttled_batch_is_not_mixed_with_other_records() -> None:
    sp = make(delivery_count_limit=4)  # threshold 2
    acq(sp, "m1", (0, 3))
    acq(sp, "m1", (4, 7))
    ack(sp, "m1", (0, 7, [RELEASE]))
    assert acq(sp, "m1", (0, 3), (4, 7)) == [(0, 3, 2), (4, 7, 2)]
    ack(sp, "m1", (0, 7, [RELEASE]))
    # Count 2 >= threshold: first batch halved (4 >> 1), nothing else in the same fetch.
    assert acq(sp, "m1", (0, 3), (4, 7)) == [(0, 1, 3)]
    assert acq(sp, "m2", (0, 3), (4, 7)) == [(2, 3, 3)]


# ---------------------------------------------------------------- loading, log start, persistence


def test_load_state_batches_with_gap_at_beginning() -> None:
    sp = make(start=10, batches=[PersistedStateBatch(15, 18, 0, 2), PersistedStateBatch(20, 22, 2, 1)])
    assert sp.start_offset == 10 and sp.end_offset == 22 and sp.in_flight_count == 13
    assert sp.next_fetch_offset() == 10
    got = acq(sp, "m1", (10, 14), (15, 18), (19, 22))
    assert got == [(10, 14, 1), (15, 18, 3), (19, 19, 1)]
    assert sp.next_fetch_offset() == 23
    assert ack(sp, "m1", (10, 19, [ACCEPT])).error_code == 0
    assert sp.start_offset == 23 and sp.cached_batch_count == 0


def test_load_converts_and_trims_persisted_state() -> None:
    sp = make(start=12, batches=[PersistedStateBatch(10, 14, 0, 1), PersistedStateBatch(15, 16, 1, 2),
                                 PersistedStateBatch(17, 17, 0, 5)])
    assert sp.start_offset == 12
    assert sp.offset_state(11) is None
    assert sp.offset_state(15) == (AVAILABLE, None, 2)  # ACQUIRED is never a persisted state
    assert sp.offset_state(17) == (ARCHIVED, None, 5)  # already at the delivery limit
    assert persisted(sp) == (12, [])
    assert persisted(sp, changed_only=False) == (12, [(12, 14, 0, 1), (15, 16, 0, 2), (17, 17, 4, 5)])
    # Leading terminal batches move SPSO at load.
    sp2 = make(start=0, batches=[PersistedStateBatch(0, 4, 2, 1), PersistedStateBatch(5, 6, 0, 1)])
    assert sp2.start_offset == 5 and sp2.next_fetch_offset() == 5


def test_log_start_offset_movement_archives_available_and_moves_spso() -> None:
    sp = make()
    acq(sp, "m1", (0, 9))
    ack(sp, "m1", (0, 4, [RELEASE]))
    assert sp.on_log_start_offset_moved(7)
    assert sp.start_offset == 7
    assert sp.offset_state(0) == (ARCHIVED, None, 1)
    assert sp.offset_state(5) == (ACQUIRED, "m1", 1)
    assert sp.next_fetch_offset() == 10 and sp.in_flight_count == 3
    assert persisted(sp, changed_only=False) == (7, [(7, 9, 0, 1)])
    # Acks below the new SPSO are ignored; expiry archives what is left below it.
    assert ack(sp, "m1", (5, 6, [ACCEPT])).error_code == 0
    assert sp.offset_state(5) == (ACQUIRED, "m1", 1)
    sp.expire_locks(LOCK)
    assert sp.offset_state(5) == (ARCHIVED, None, 1) and sp.offset_state(7) == (AVAILABLE, None, 1)
    assert sp.acquired_count == 0
    assert not sp.on_log_start_offset_moved(3)
    # Past the end of an empty cache.
    sp2 = make()
    assert sp2.on_log_start_offset_moved(50)
    assert (sp2.start_offset, sp2.next_fetch_offset(), sp2.in_flight_count) == (50, 50, 0)


def test_compaction_archives_stale_available_records() -> None:
    sp = make()
    acq(sp, "m1", (0, 4))
    acq(sp, "m1", (5, 9))
    ack(sp, "m1", (0, 9, [RELEASE]))
    # Log read from 0 now starts at 5: 0-4 were compacted away.
    assert acq(sp, "m2", (5, 9), fetch_offset=0) == [(5, 9, 2)]
    assert sp.offset_state(0) is None and sp.start_offset == 5


def test_write_state_coalesces_and_never_writes_acquired() -> None:
    sp = make()
    acq(sp, "m1", (0, 4))
    acq(sp, "m2", (5, 9))
    ack(sp, "m2", (5, 9, [RELEASE]))
    ack(sp, "m1", (3, 4, [ACCEPT]))
    snap = sp.write_state(changed_only=False)
    assert snap.start_offset == 0 and snap.state_epoch == 0
    assert snap.delivery_complete_count == 2
    assert [astuple(b) for b in snap.state_batches] == [(0, 2, 0, 1), (3, 4, 2, 1), (5, 9, 0, 1)]


# ---------------------------------------------------------------- KIP-932 worked example


def test_kip_worked_example_offsets_100_to_120() -> None:
    sp = make(start=100)
    assert persisted(sp) == (100, [])
    assert acq(sp, "c1", (100, 109), now=0) == [(100, 109, 1)]
    assert ack(sp, "c1", (100, 109, [ACCEPT])).error_code == 0
    assert persisted(sp) == (110, [])
    log = [(110, 112), (113, 118), (119, 119)]
    assert acq(sp, "c1", *log, max_records=3, now=0) == [(110, 112, 1)]
    assert acq(sp, "c2", *log, max_records=6, now=10) == [(113, 118, 1)]
    assert acq(sp, "c3", *log, max_records=1, now=20) == [(119, 119, 1)]
    assert (sp.start_offset, sp.end_offset) == (110, 119)

    ack(sp, "c1", (110, 110, [RELEASE]))
    assert persisted(sp) == (110, [(110, 110, 0, 1)])
    ack(sp, "c3", (119, 119, [ACCEPT]))
    assert persisted(sp) == (110, [(119, 119, 2, 1)])

    log.append((120, 120))
    assert acq(sp, "c1", *log, max_records=2, now=5000) == [(110, 110, 2), (120, 120, 1)]
    assert persisted(sp) == (110, [])  # acquisition alone is not persisted

    assert sp.expire_locks(LOCK)  # c1's 111-112 (acquired at 0)
    assert states(sp, 110, 113) == [(ACQUIRED, "c1", 2), (AVAILABLE, None, 1), (AVAILABLE, None, 1),
                                    (ACQUIRED, "c2", 1)]
    assert persisted(sp) == (110, [(111, 112, 0, 1)])

    ack(sp, "c2", (113, 118, [ACCEPT]))
    assert persisted(sp) == (110, [(113, 118, 2, 1)])

    assert acq(sp, "c3", *log, max_records=2, now=LOCK) == [(111, 112, 2)]
    ack(sp, "c1", (110, 110, [ACCEPT]))
    assert sp.start_offset == 111
    assert persisted(sp) == (111, [])  # 110 is below the new SPSO
    ack(sp, "c3", (111, 112, [ACCEPT]))
    assert sp.start_offset == 120
    assert persisted(sp) == (120, [])
    assert persisted(sp, changed_only=False) == (120, [(120, 120, 0, 1)])
    assert sp.offset_state(120) == (ACQUIRED, "c1", 1)


# ---------------------------------------------------------------- stateful property test

MEMBERS = ("m1", "m2", "m3")
LOG_END = 120
LOCK_MS = 100


def _log_layout() -> list[tuple[int, int]]:
    sizes = [1, 4, 2, 7, 3, 5, 1, 6]
    out, o, k = [], 0, 0
    while o < LOG_END:
        s = min(sizes[k % len(sizes)], LOG_END - o)
        out.append((o, o + s - 1))
        o += s
        k += 1
    return out


LOG = _log_layout()
TERMINAL = (ACKNOWLEDGED, ARCHIVED)


class SharePartitionMachine(RuleBasedStateMachine):
    """Drives a share partition with random fetches/acks/releases/expiry against a per-offset model."""

    def __init__(self) -> None:
        super().__init__()
        self.sp = make()
        self.limit = 5
        self.now = 0
        # offset -> [state, member, delivery count, lock deadline]; missing = never delivered
        self.model: dict[int, list] = {}
        self.prev_spso = 0
        self.log_start = 0

    @initialize(limit=st.integers(2, 5), in_flight=st.integers(5, 40),
                loaded=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4),
                                          st.sampled_from([AVAILABLE, ACKNOWLEDGED, ARCHIVED]),
                                          st.integers(1, 5)), max_size=4))
    def setup(self, limit: int, in_flight: int, loaded: list[tuple[int, int, RecordState, int]]) -> None:
        """Start from persisted state: batches separated by gap windows that must be fetched again."""
        self.limit = limit
        batches = []
        o = 0
        for gap, length, state, count in loaded:
            first = o + gap
            count = min(count, limit)
            batches.append(PersistedStateBatch(first, first + length - 1, int(state), count))
            if state == AVAILABLE and count >= limit:
                state = ARCHIVED  # at the limit: never delivered again
            for k in range(first, first + length):
                self.model[k] = [state, None, count, 0]
            o = first + length
        self.sp = make(batches=batches, delivery_count_limit=limit, max_in_flight_records=in_flight,
                       lock_duration_ms=LOCK_MS)

    def _release(self, o: int, spso: int) -> None:
        rec = self.model[o]
        rec[0] = ARCHIVED if rec[2] >= self.limit or o < spso else AVAILABLE
        rec[1] = None

    def _apply_ack(self, o: int, t: int, spso: int) -> None:
        if o < spso:
            return  # acknowledgements below SPSO are ignored
        rec = self.model[o]
        if t == RENEW:
            rec[3] = self.now + LOCK_MS
        elif t == ACCEPT:
            rec[0], rec[1] = ACKNOWLEDGED, None
        elif t == RELEASE:
            self._release(o, spso)
        else:
            rec[0], rec[1] = ARCHIVED, None

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 15), batch_size=st.integers(1, 8),
          record_limit=st.booleans(), n_batches=st.integers(1, 6))
    def fetch(self, member: str, max_records: int, batch_size: int, record_limit: bool, n_batches: int) -> None:
        nfo = self.sp.next_fetch_offset()
        start = next((i for i, (_a, b) in enumerate(LOG) if b >= nfo), len(LOG))
        fetched = [FetchedBatch(a, b) for a, b in LOG[start:start + n_batches]]
        mode = AcquireMode.RECORD_LIMIT if record_limit else AcquireMode.BATCH_OPTIMIZED
        end_before, in_flight_before = self.sp.end_offset, self.sp.in_flight_count
        got = self.sp.acquire(member, fetched, max_records=max_records, batch_size=batch_size,
                              now_ms=self.now, mode=mode)
        if got and got[-1].last_offset > end_before:
            # New records past the cache only while under the in-flight limit.
            assert in_flight_before < self.sp.max_in_flight_records
        seen: set[int] = set()
        prev_last = -1
        total = 0
        for r in got:
            assert r.first_offset > prev_last and r.first_offset <= r.last_offset
            prev_last = r.last_offset
            for o in range(r.first_offset, r.last_offset + 1):
                assert o not in seen
                seen.add(o)
                assert o >= self.sp.start_offset
                rec = self.model.setdefault(o, [AVAILABLE, None, 0, 0])
                assert rec[0] == AVAILABLE, (o, rec)
                assert rec[2] + 1 == r.delivery_count <= self.limit
                self.model[o] = [ACQUIRED, member, r.delivery_count, self.now + LOCK_MS]
            total += r.last_offset - r.first_offset + 1
        if record_limit:
            assert total <= max_records

    @rule(member=st.sampled_from(MEMBERS), data=st.data(), then_rollback=st.booleans())
    def acknowledge_own(self, member: str, data: st.DataObject, then_rollback: bool) -> None:
        held = sorted(o for o, r in self.model.items() if r[0] == ACQUIRED and r[1] == member)
        if not held:
            return
        chosen = sorted(data.draw(st.sets(st.sampled_from(held), min_size=1)))
        ranges: list[list[int]] = []
        for o in chosen:
            if ranges and ranges[-1][1] + 1 == o:
                ranges[-1][1] = o
            else:
                ranges.append([o, o])
        batches = []
        for a, b in ranges:
            per_offset = data.draw(st.booleans())
            n = b - a + 1 if per_offset else 1
            types = data.draw(st.lists(st.sampled_from([GAP, ACCEPT, RELEASE, REJECT, RENEW]),
                                       min_size=n, max_size=n))
            batches.append(AckBatch(a, b, types))
        before = self._observed()
        spso = self.sp.start_offset
        out = self.sp.acknowledge(member, batches, now_ms=self.now)
        assert out.error_code == 0
        if then_rollback:
            # A failed write undoes everything but RENEW (a lock extension is never persisted).
            assert self.sp.rollback(out)
            renewed = self._observed_states()
            for ab in batches:
                for o in range(ab.first_offset, ab.last_offset + 1):
                    t = ab.ack_types[0] if len(ab.ack_types) == 1 else ab.ack_types[o - ab.first_offset]
                    if t == RENEW and o >= spso:
                        self.model[o][3] = self.now + LOCK_MS
            assert renewed == [before[0], before[1], [st_ for st_, _d in before[2]]]
            return
        for ab in batches:
            for o in range(ab.first_offset, ab.last_offset + 1):
                t = ab.ack_types[0] if len(ab.ack_types) == 1 else ab.ack_types[o - ab.first_offset]
                self._apply_ack(o, t, spso)

    @rule(member=st.sampled_from(MEMBERS), first=st.integers(0, LOG_END), length=st.integers(1, 8),
          ack_type=st.sampled_from([ACCEPT, RELEASE, REJECT]))
    def acknowledge_arbitrary(self, member: str, first: int, length: int, ack_type: int) -> None:
        last = first + length - 1
        spso = self.sp.start_offset
        before = self._observed()
        out = self.sp.acknowledge(member, [AckBatch(first, last, [ack_type])], now_ms=self.now)
        if out.error_code:
            assert out.error_code in (INVALID_REQUEST, INVALID_RECORD_STATE)
            assert self._observed() == before
            return
        for o in range(max(first, spso), last + 1):
            rec = self.model.get(o)
            assert rec is not None and rec[0] == ACQUIRED and rec[1] == member
            self._apply_ack(o, ack_type, spso)

    @rule(member=st.sampled_from(MEMBERS))
    def close_session(self, member: str) -> None:
        spso = self.sp.start_offset
        self.sp.release_member(member, now_ms=self.now)
        for o, rec in self.model.items():
            if rec[0] == ACQUIRED and rec[1] == member:
                self._release(o, spso)

    @rule(member=st.sampled_from(MEMBERS), then_rollback=st.booleans())
    def close_session_written_or_failed(self, member: str, then_rollback: bool) -> None:
        """A release held until written: completed, or rolled back to ACQUIRED when its write fails."""
        spso = self.sp.start_offset
        before = self._observed()
        out = self.sp.release_member(member, now_ms=self.now, until_written=True)
        if out is None:
            assert self._observed() == before
            return
        if then_rollback:
            assert self.sp.rollback(out)
            assert self._observed() == before
            return
        self.sp.written(out)
        for o, rec in self.model.items():
            if rec[0] == ACQUIRED and rec[1] == member:
                self._release(o, spso)

    @rule(dt=st.integers(1, 150))
    def time_passes(self, dt: int) -> None:
        self.now += dt
        spso = self.sp.start_offset
        self.sp.expire_locks(self.now)
        for o, rec in self.model.items():
            if rec[0] == ACQUIRED and rec[3] <= self.now:
                self._release(o, spso)

    @rule(delta=st.integers(1, 6))
    def log_start_moves(self, delta: int) -> None:
        """Retention: AVAILABLE below the new log start is archived, ACQUIRED waits for its lock."""
        new_start = min(self.sp.start_offset + delta, LOG_END)
        if new_start <= self.sp.start_offset:
            return
        assert self.sp.on_log_start_offset_moved(new_start)
        self.log_start = new_start
        for o in range(new_start):
            rec = self.model.setdefault(o, [ARCHIVED, None, 0, 0])
            if rec[0] == AVAILABLE:
                rec[0] = ARCHIVED

    def _observed(self) -> list:
        sp = self.sp
        return [sp.start_offset, sp.end_offset,
                [(sp.offset_state(o), sp.lock_deadline(o)) for o in range(sp.start_offset, sp.end_offset + 1)]]

    def _observed_states(self) -> list:
        sp = self.sp
        return [sp.start_offset, sp.end_offset,
                [sp.offset_state(o) for o in range(sp.start_offset, sp.end_offset + 1)]]

    @invariant()
    def matches_model(self) -> None:
        sp = self.sp
        spso = sp.start_offset
        assert spso >= self.prev_spso
        self.prev_spso = spso
        expected_spso = self.log_start
        while self.model.get(expected_spso, [AVAILABLE])[0] in TERMINAL:
            expected_spso += 1
        assert spso == expected_spso
        for o, (state, member, count, deadline) in self.model.items():
            assert count <= self.limit
            if o < spso:
                # Only records the log start overtook may still be ACQUIRED below SPSO.
                assert state in TERMINAL or (state == ACQUIRED and o < self.log_start)
                if state == ACQUIRED:
                    assert sp.offset_state(o) == (state, member, count)
                else:
                    cached = sp.offset_state(o)
                    assert cached is None or cached[0] in TERMINAL
                continue
            assert sp.offset_state(o) == (state, member, count), o
            if state == ACQUIRED:
                assert sp.lock_deadline(o) == deadline
        # Fetching resumes at the first released/expired or never-delivered offset.
        expected_nfo = spso
        while self.model.get(expected_nfo, [AVAILABLE])[0] != AVAILABLE:
            expected_nfo += 1
        assert sp.next_fetch_offset() == min(expected_nfo, sp.end_offset + 1)
        acquired = [r for r in self.model.values() if r[0] == ACQUIRED]
        assert sp.acquired_count == len(acquired)
        assert sp.next_lock_deadline() == (min(r[3] for r in acquired) if acquired else None)
        snap = sp.write_state(changed_only=False)
        assert snap.start_offset == spso
        prev = None
        for b in snap.state_batches:
            assert b.delivery_state != ACQUIRED and b.first_offset >= spso
            if prev is not None and prev.last_offset + 1 == b.first_offset:
                assert (prev.delivery_state, prev.delivery_count) != (b.delivery_state, b.delivery_count)
            prev = b
            for o in range(b.first_offset, b.last_offset + 1):
                state, _m, count, _d = self.model.get(o, [AVAILABLE, None, 0, 0])
                assert (b.delivery_state, b.delivery_count) == (AVAILABLE if state == ACQUIRED else state, count)
        sp.mark_write_failed()  # keep the full write from hiding deltas the machine does not track


SharePartitionMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestSharePartitionStateful = SharePartitionMachine.TestCase


@pytest.mark.parametrize("limit,expected", [(2, 2), (3, 2), (5, 3), (6, 3), (10, 5)])
def test_throttle_threshold(limit: int, expected: int) -> None:
    assert make(delivery_count_limit=limit).throttle_threshold == expected


# ---------------------------------------------------------------- transitions held until written


def test_release_until_written_is_not_acquirable_until_written() -> None:
    """A RELEASE whose write is under way is in a state transition: a fetch running alongside does not
    hand the records straight back (Kafka's ongoing state transition)."""
    sp = make()
    assert acq(sp, "m1", (0, 4), (5, 9), max_records=1) == [(0, 4, 1)]
    out = sp.acknowledge("m1", [AckBatch(0, 4, [RELEASE])], now_ms=0, until_written=True)
    assert out.error_code == 0 and out.persist_required
    assert sp.transitioning_count == 5 and sp.available_count == 5
    assert sp.offset_state(2) == (AVAILABLE, None, 1)
    # Persisted as AVAILABLE, and the fetch reads past the records in transition.
    assert persisted(sp) == (0, [(0, 4, 0, 1)])
    assert sp.next_fetch_offset() == 5
    assert acq(sp, "m2", (5, 9)) == [(5, 9, 1)]
    sp.written(out)
    assert sp.transitioning_count == 0 and sp.next_fetch_offset() == 0
    assert persisted(sp) == (0, [])  # completing the transition writes nothing new
    assert acq(sp, "m2", (0, 4)) == [(0, 4, 2)]


def test_failed_release_write_rolls_back_to_acquired() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 9), now=100) == [(0, 9, 1)]
    out = sp.release_member("m1", now_ms=200, until_written=True)
    assert out is not None and sp.transitioning_count == 10
    assert sp.rollback(out)
    # Back to ACQUIRED by the member with its lock, which then lapses as usual.
    assert states(sp, 0, 9) == [(ACQUIRED, "m1", 1)] * 10
    assert sp.lock_deadline(3) == 100 + LOCK
    sp.written(out)  # a rolled-back outcome is spent: nothing to complete
    assert sp.acquired_count == 10
    assert sp.expire_locks(100 + LOCK)
    assert states(sp, 0, 9) == [(AVAILABLE, None, 1)] * 10
    assert sp.release_member("m1", now_ms=0, until_written=True) is None


def test_written_release_below_a_moved_spso_is_archived() -> None:
    sp = make()
    assert acq(sp, "m1", (0, 9)) == [(0, 9, 1)]
    out = sp.release_member("m1", now_ms=0, until_written=True)
    assert out is not None
    sp.on_log_start_offset_moved(5)
    sp.written(out)
    assert states(sp, 5, 9) == [(AVAILABLE, None, 1)] * 5
    assert sp.start_offset == 5 and sp.transitioning_count == 0
    assert states(sp, 0, 4) == [(ARCHIVED, None, 1)] * 5
