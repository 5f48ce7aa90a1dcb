"""Share-partition state machine (KIP-932): the in-flight records of one (share group, topic-partition).

Pure logic. Nothing here does I/O, reads a clock or talks to the share coordinator: callers pass
``now_ms``, read the log themselves (handing over only the log-batch boundaries they read), persist
``write_state()`` with WriteShareGroupState and arm a timer from ``next_lock_deadline()``.

Model
-----
* The in-flight cache is a list of in-flight batches ordered by first offset. A batch covers
  [first, last] with one state / member / delivery count / lock deadline for the whole range and only
  switches to per-offset tracking (four parallel lists, not one object per record) when an
  acknowledgement, a partial acquisition or throttling splits it.
* SPSO (``start_offset``) is the first offset not known to be terminal. ``end_offset`` (SPEO) is the
  last cached offset, or SPSO - 1 when nothing is cached. Offsets in [SPSO, SPEO] with no batch are a
  gap window (persisted state had a hole there) and are fetched and acquired like new records.
* Acknowledgements are applied at once and can be undone with ``rollback()`` when the write fails.
  With ``until_written=True`` (acknowledgements and member releases) the records they make AVAILABLE
  are in a state transition until ``written()``: not acquirable, so a RELEASE is not handed straight
  back by a fetch running alongside its write (as Kafka's ongoing state transitions).
* ``write_state()`` returns only what changed since the previous call (the KIP's delta writes) unless
  a write was reported lost (``rollback`` / ``mark_write_failed``) or ``changed_only=False``: then it
  returns the whole cache. ACQUIRED is never persisted: it is written as AVAILABLE with its count.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from shoal.persister.persister import PersistedStateBatch
from shoal.protocol.acknowledge_type import AcknowledgeType
from shoal.protocol.errors import ErrorCode


class RecordState(IntEnum):
    """Record states; the numbers are the persisted DeliveryState ids."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVING = 3  # KIP-1191: on its way to the group's dead-letter topic
    ARCHIVED = 4


class AcquireMode(IntEnum):
    BATCH_OPTIMIZED = 0
    RECORD_LIMIT = 1


class FetchedBatch(NamedTuple):
    """Header of one log batch read for this fetch (base offset and last offset only)."""

    base_offset: int
    last_offset: int


class AckBatch(NamedTuple):
    first_offset: int
    last_offset: int
    ack_types: Sequence[int]


class ArchivingRun(NamedTuple):
    """Records in ARCHIVING, waiting for their dead-letter records (KIP-1191)."""

    first_offset: int
    last_offset: int
    delivery_count: int
    rejected: bool  # a consumer REJECTed them; False: they reached the delivery count limit


class AcquiredRange(NamedTuple):
    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class StateSnapshot:
    start_offset: int
    state_epoch: int
    delivery_complete_count: int
    state_batches: list[PersistedStateBatch]


_AVAILABLE = 0
_ACQUIRED = 1
_ACKNOWLEDGED = 2
_ARCHIVING = 3
_RELEASING = 5  # internal: AVAILABLE once its write is done; persisted as AVAILABLE, never loaded
_ARCHIVED = 4
_TERMINAL = (_ACKNOWLEDGED, _ARCHIVED)
# ARCHIVING records belong to no member, so their member slot says why they are dead-lettered: the
# transition that archived them knows, and the dead-letter header reports it. Runs loaded from the
# persisted state (which does not keep the cause) hold None, and the cause is inferred from the
# delivery count, as Kafka does when it resumes archiving after a load.
_CAUSE_REJECTED = "\x00rejected"
_CAUSE_DELIVERY_LIMIT = "\x00delivery-count-limit"

# (first, last, state, member, delivery count, lock deadline) of a run of identical offsets.
_Run = tuple[int, int, int, "str | None", int, int]


# A split batch is kept as runs while it has at most this many; beyond that (acknowledgements that alternate
# record by record) one entry per offset, where changing one offset costs O(1) instead of a list rebuild.
_MAX_RUNS = 64


class _Batch:
    """One in-flight batch, tracked whole until part of it changes. Then as runs (`starts`, `values`): run
    i covers `starts[i]` up to the next start (or `last`) and holds (state, member, delivery count, lock
    deadline), neighbouring runs always differing, so that a batch split in a few places costs a few
    entries. Past _MAX_RUNS runs, as per-offset lists (`states`, `members`, `counts`, `deadlines`)."""

    __slots__ = ("first", "last", "state", "member", "count", "deadline", "starts", "values",
                 "states", "members", "counts", "deadlines")

    def __init__(self, first: int, last: int, state: int, member: str | None, count: int,
                 deadline: int) -> None:
        self.first = first
        self.last = last
        self.state = state
        self.member = member
        self.count = count
        self.deadline = deadline
        self.starts: list[int] | None = None
        self.values: list[tuple[int, str | None, int, int]] = []
        self.states: list[int] | None = None
        self.members: list[str | None] = []
        self.counts: list[int] = []
        self.deadlines: list[int] = []

    @property
    def whole(self) -> bool:
        return self.starts is None and self.states is None

    def explode(self) -> None:
        if self.whole:
            self.starts = [self.first]
            self.values = [(self.state, self.member, self.count, self.deadline)]

    def runs(self, lo: int, hi: int) -> list[_Run]:
        """Maximal runs of identical offsets within [lo, hi] (clipped to the batch)."""
        lo = max(lo, self.first)
        hi = min(hi, self.last)
        if lo > hi:
            return []
        out: list[_Run] = []
        states = self.states
        if states is not None:
            members, counts, deadlines = self.members, self.counts, self.deadlines
            f = self.first
            i, end = lo - f, hi - f
            while i <= end:
                s, m, c, d = states[i], members[i], counts[i], deadlines[i]
                j = i + 1
                while j <= end and states[j] == s and counts[j] == c and deadlines[j] == d and members[j] == m:
                    j += 1
                out.append((f + i, f + j - 1, s, m, c, d))
                i = j
            return out
        starts = self.starts
        if starts is None:
            return [(lo, hi, self.state, self.member, self.count, self.deadline)]
        values = self.values
        i = bisect_right(starts, lo) - 1
        n = len(starts)
        while i < n and starts[i] <= hi:
            s, m, c, d = values[i]
            run_hi = starts[i + 1] - 1 if i + 1 < n else self.last
            out.append((max(lo, starts[i]), min(hi, run_hi), s, m, c, d))
            i += 1
        return out

    def assign(self, lo: int, hi: int, state: int, member: str | None, count: int, deadline: int) -> None:
        if self.whole:
            if lo == self.first and hi == self.last:
                self.state, self.member, self.count, self.deadline = state, member, count, deadline
                return
            self.explode()
        if self.states is not None:
            a, b = lo - self.first, hi - self.first + 1
            n = b - a
            self.states[a:b] = [state] * n
            self.members[a:b] = [member] * n
            self.counts[a:b] = [count] * n
            self.deadlines[a:b] = [deadline] * n
            return
        starts, values = self.starts, self.values
        assert starts is not None
        value = (state, member, count, deadline)
        i = bisect_right(starts, lo) - 1  # the run holding lo
        keep = i + 1 if starts[i] < lo else i
        new_starts, new_values = starts[:keep], values[:keep]
        if not new_values or new_values[-1] != value:
            new_starts.append(lo)
            new_values.append(value)
        if hi < self.last:
            j = bisect_right(starts, hi + 1) - 1  # the run holding hi + 1
            if values[j] != value:
                new_starts.append(hi + 1)
                new_values.append(values[j])
            new_starts.extend(starts[j + 1:])
            new_values.extend(values[j + 1:])
        self.starts, self.values = new_starts, new_values
        if len(new_starts) > _MAX_RUNS:
            self._per_offset()

    def _per_offset(self) -> None:
        states: list[int] = []
        members: list[str | None] = []
        counts: list[int] = []
        deadlines: list[int] = []
        for lo, hi, s, m, c, d in self.runs(self.first, self.last):
            n = hi - lo + 1
            states += [s] * n
            members += [m] * n
            counts += [c] * n
            deadlines += [d] * n
        self.states, self.members, self.counts, self.deadlines = states, members, counts, deadlines
        self.starts, self.values = None, []

    def maybe_collapse(self) -> None:
        """Go back to whole-batch tracking once every offset agrees again."""
        states = self.states
        if states is not None:
            n = len(states)
            s, m, c, d = states[0], self.members[0], self.counts[0], self.deadlines[0]
            if (states.count(s) == n and self.counts.count(c) == n and self.deadlines.count(d) == n
                    and self.members.count(m) == n):
                self.state, self.member, self.count, self.deadline = s, m, c, d
                self.states = None
                self.members, self.counts, self.deadlines = [], [], []
        elif self.starts is not None and len(self.starts) == 1:
            self.state, self.member, self.count, self.deadline = self.values[0]
            self.starts = None
            self.values = []

    def all_terminal(self) -> bool:
        if self.states is not None:
            return self.states.count(_ACKNOWLEDGED) + self.states.count(_ARCHIVED) == len(self.states)
        if self.starts is None:
            return self.state in _TERMINAL
        return all(v[0] in _TERMINAL for v in self.values)

    def terminal_end(self, start: int) -> int:
        """The first offset from `start` (inside the batch) that is not terminal, or last + 1."""
        states = self.states
        if states is not None:
            i, n = start - self.first, len(states)
            while i < n and states[i] in _TERMINAL:
                i += 1
            return self.first + i
        for lo, _hi, s, _m, _c, _d in self.runs(start, self.last):
            if s not in _TERMINAL:
                return lo
        return self.last + 1

    def first_in_state(self, start: int, state: int) -> int | None:
        """The first offset from `start` (inside the batch) in `state`, if any."""
        if self.states is not None:
            try:
                return self.first + self.states.index(state, start - self.first)
            except ValueError:
                return None
        for lo, _hi, s, _m, _c, _d in self.runs(start, self.last):
            if s == state:
                return lo
        return None


@dataclass(slots=True)
class _Change:
    """One run changed by an acknowledgement: enough to put it back."""

    first: int
    last: int
    state: int
    member: str | None
    count: int
    deadline: int
    new_state: int
    new_member: str | None
    new_deadline: int
    renew: bool


@dataclass(slots=True)
class _Undo:
    changes: list[_Change]
    spso_before: int
    spso_after: int
    dropped: list[_Batch]
    used: bool = False


@dataclass
class AckOutcome:
    """Result of ``acknowledge``: the partition error code and, on success, what ``rollback`` needs."""

    error_code: int
    undo: _Undo | None = field(default=None, repr=False)

    @property
    def persist_required(self) -> bool:
        """False for RENEW-only or no-op acknowledgements (nothing to write)."""
        return self.undo is not None and any(not c.renew for c in self.undo.changes)


class SharePartition:
    def __init__(
        self,
        group_id: str,
        topic_id: bytes,
        partition: int,
        *,
        start_offset: int,
        state_epoch: int,
        state_batches: Sequence[PersistedStateBatch],
        lock_duration_ms: int = 30000,
        delivery_count_limit: int = 5,
        max_in_flight_records: int = 2000,
        leader_epoch: int = 0,
        dead_letter: bool = False,
    ) -> None:
        if start_offset < 0:
            raise ValueError("start_offset must be resolved (share.auto.offset.reset) before loading")
        if delivery_count_limit < 1:
            raise ValueError("delivery_count_limit must be positive")
        self.group_id = group_id
        self.topic_id = topic_id
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight_records = max_in_flight_records
        # KIP-1191: the group has a dead-letter topic, so rejected records and those at the delivery
        # count limit pass through ARCHIVING (persisted) until the leader has written them there.
        self.dead_letter = dead_letter
        # Redelivery throttling kicks in from this delivery count on.
        self.throttle_threshold = max(2, -(-delivery_count_limit // 2))
        self._state_epoch = state_epoch
        self._spso = start_offset
        self._end = start_offset - 1
        self._batches: list[_Batch] = []
        self._firsts: list[int] = []
        self._state_counts = [0, 0, 0, 0, 0, 0]  # indexed by state, _RELEASING (5) included
        # Deadline -> number of ACQUIRED offsets holding it, plus a lazy min-heap over the keys.
        self._lock_counts: dict[int, int] = {}
        self._lock_heap: list[int] = []
        self._nfo: int | None = None
        self._dirty: list[tuple[int, int]] = []
        self._full_write = False
        self._load(state_batches)

    # ------------------------------------------------------------------ loading

    def _load(self, state_batches: Sequence[PersistedStateBatch]) -> None:
        prev_last = self._spso - 1
        over_limit: list[tuple[int, int]] = []
        for pb in sorted(state_batches, key=lambda b: b.first_offset):
            first = max(pb.first_offset, prev_last + 1)
            last = pb.last_offset
            if last < first:
                continue
            state = pb.delivery_state
            if state == _ACQUIRED:
                state = _AVAILABLE
            elif state not in (_AVAILABLE, _ACKNOWLEDGED, _ARCHIVING, _ARCHIVED):
                raise ValueError(f"unknown persisted delivery state {state}")
            count = pb.delivery_count
            member = None
            if state == _AVAILABLE and count >= self.delivery_count_limit:
                # At the limit (lowered since the write): never delivered again, dead-lettered if the group
                # has a dead-letter topic. Unlike what was loaded as it is, that change is still to be written.
                state, member = self._failed(_CAUSE_DELIVERY_LIMIT)
                if state == _ARCHIVING:
                    over_limit.append((first, last))
            self._insert(len(self._batches), _Batch(first, last, state, member, count, 0))
            prev_last = last
        self._end = prev_last
        self._advance()
        self._dirty.clear()
        for lo, hi in over_limit:
            self._mark_dirty(lo, hi)

    @property
    def unwritten(self) -> bool:
        """Changes not handed to ``write_state`` yet (after a load: records sent to ARCHIVING by it)."""
        return self._full_write or bool(self._dirty)

    # ------------------------------------------------------------------ properties

    @property
    def start_offset(self) -> int:
        return self._spso

    @property
    def end_offset(self) -> int:
        """SPEO: last cached offset, SPSO - 1 when nothing is cached."""
        return max(self._end, self._spso - 1)

    @property
    def state_epoch(self) -> int:
        return self._state_epoch

    @property
    def in_flight_count(self) -> int:
        return max(0, self.end_offset - self._spso + 1)

    @property
    def acquired_count(self) -> int:
        return self._state_counts[_ACQUIRED]

    @property
    def available_count(self) -> int:
        return self._state_counts[_AVAILABLE] + self._state_counts[_RELEASING]

    @property
    def transitioning_count(self) -> int:
        """Records released whose write has not completed yet (not acquirable until ``written``)."""
        return self._state_counts[_RELEASING]

    @property
    def acknowledged_count(self) -> int:
        return self._state_counts[_ACKNOWLEDGED]

    @property
    def archiving_count(self) -> int:
        return self._state_counts[_ARCHIVING]

    @property
    def archived_count(self) -> int:
        return self._state_counts[_ARCHIVED]

    @property
    def cached_batch_count(self) -> int:
        return len(self._batches)

    @property
    def delivery_complete_count(self) -> int:
        """Terminal records in [SPSO, SPEO] (persisted for lag = latest - SPSO - this)."""
        total = self._state_counts[_ACKNOWLEDGED] + self._state_counts[_ARCHIVED]
        for b in self._batches:
            if b.first >= self._spso:
                break
            for lo, hi, s, _m, _c, _d in b.runs(b.first, self._spso - 1):
                if s in _TERMINAL:
                    total -= hi - lo + 1
        return total

    def oldest_lock_start_ms(self) -> int | None:
        """When the oldest still-held acquisition lock started (locks all last lock_duration_ms)."""
        d = self.next_lock_deadline()
        return None if d is None else d - self.lock_duration_ms

    def offset_state(self, offset: int) -> tuple[RecordState, str | None, int] | None:
        """(state, member, delivery count) of one cached offset, None when not cached."""
        b = self._batch_at(offset)
        if b is None:
            return None
        (_lo, _hi, s, m, c, _d), = b.runs(offset, offset)
        if s == _ARCHIVING:
            m = None  # the slot holds the cause, not a member
        return RecordState(_AVAILABLE if s == _RELEASING else s), m, c

    def lock_deadline(self, offset: int) -> int | None:
        b = self._batch_at(offset)
        if b is None:
            return None
        (_lo, _hi, s, _m, _c, d), = b.runs(offset, offset)
        return d if s == _ACQUIRED else None

    # ------------------------------------------------------------------ cache plumbing

    def _batch_index(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= offset."""
        i = bisect_right(self._firsts, offset) - 1
        if i < 0:
            return 0
        return i if self._batches[i].last >= offset else i + 1

    def _batch_at(self, offset: int) -> _Batch | None:
        i = bisect_right(self._firsts, offset) - 1
        if i >= 0 and self._batches[i].last >= offset:
            return self._batches[i]
        return None

    def _account(self, b: _Batch, sign: int) -> None:
        for lo, hi, s, _m, _c, d in b.runs(b.first, b.last):
            n = (hi - lo + 1) * sign
            self._state_counts[s] += n
            if s == _ACQUIRED:
                self._lock_add(d, n)

    def _insert(self, idx: int, b: _Batch) -> None:
        self._batches.insert(idx, b)
        self._firsts.insert(idx, b.first)
        self._account(b, 1)
        if b.last > self._end:
            self._end = b.last
        self._nfo = None

    def _lock_add(self, deadline: int, n: int) -> None:
        left = self._lock_counts.get(deadline, 0) + n
        if left > 0:
            if deadline not in self._lock_counts:
                heapq.heappush(self._lock_heap, deadline)
            self._lock_counts[deadline] = left
        else:
            self._lock_counts.pop(deadline, None)

    def _set(self, b: _Batch, lo: int, hi: int, state: int, member: str | None, count: int,
             deadline: int, *, dirty: bool = True) -> None:
        """The single place record states change, so counters, lock index and dirty ranges agree."""
        for rl, rh, s, _m, _c, d in b.runs(lo, hi):
            n = rh - rl + 1
            self._state_counts[s] -= n
            if s == _ACQUIRED:
                self._lock_add(d, -n)
        n = hi - lo + 1
        self._state_counts[state] += n
        if state == _ACQUIRED:
            self._lock_add(deadline, n)
        elif dirty:
            # Acquisitions are not persisted on their own; every other transition is.
            self._mark_dirty(lo, hi)
        b.assign(lo, hi, state, member, count, deadline)
        self._nfo = None

    def _mark_dirty(self, lo: int, hi: int) -> None:
        if self._full_write:
            return
        dirty = self._dirty
        if dirty and dirty[-1][1] + 1 >= lo and dirty[-1][0] <= hi + 1:
            plo, phi = dirty[-1]
            dirty[-1] = (min(plo, lo), max(phi, hi))
            return
        dirty.append((lo, hi))
        if len(dirty) > 4096:
            # Too fragmented to be worth tracking: write everything next time.
            self._full_write = True
            dirty.clear()

    def _advance(self) -> list[_Batch]:
        """Move SPSO over the contiguous terminal prefix and drop fully terminal batches below it."""
        new = self._spso
        batches = self._batches
        for k in range(self._batch_index(new), len(batches)):
            b = batches[k]
            if b.first > new:
                break  # unfetched gap blocks SPSO
            new = b.terminal_end(new)
            if new <= b.last:
                break
        if new != self._spso:
            self._spso = new
            self._nfo = None
        k = 0
        while k < len(batches) and batches[k].last < self._spso and batches[k].all_terminal():
            k += 1
        if not k:
            return []
        dropped = batches[:k]
        for b in dropped:
            self._account(b, -1)
        del batches[:k]
        del self._firsts[:k]
        self._nfo = None
        return dropped

    def _release_run(self, b: _Batch, lo: int, hi: int, count: int, available: int = _AVAILABLE) -> None:
        """ACQUIRED -> AVAILABLE (or ``available``), or ARCHIVED below SPSO or at the delivery count limit."""
        if lo < self._spso:
            cut = min(hi, self._spso - 1)
            self._set(b, lo, cut, _ARCHIVED, None, count, 0)
            lo = cut + 1
            if lo > hi:
                return
        if count >= self.delivery_count_limit:
            state, cause = self._failed(_CAUSE_DELIVERY_LIMIT)
            self._set(b, lo, hi, state, cause, count, 0)
        else:
            self._set(b, lo, hi, available, None, count, 0)

    def _failed(self, cause: str) -> tuple[int, str | None]:
        """Where a rejected record or one at the delivery count limit goes, with what its member slot holds:
        ARCHIVING with the cause when the group has a dead-letter topic, else ARCHIVED."""
        return (_ARCHIVING, cause) if self.dead_letter else (_ARCHIVED, None)

    # ------------------------------------------------------------------ fetch side

    def next_fetch_offset(self) -> int:
        """First AVAILABLE or gap-window offset at or above SPSO, else SPEO + 1."""
        if self._nfo is None:
            self._nfo = self._find_next_fetch_offset()
        return self._nfo

    def _find_next_fetch_offset(self) -> int:
        expected = self._spso
        batches = self._batches
        for k in range(self._batch_index(expected), len(batches)):
            b = batches[k]
            if b.first > expected:
                return expected
            found = b.first_in_state(max(b.first, expected), _AVAILABLE)
            if found is not None:
                return found
            expected = b.last + 1
        return self.end_offset + 1

    def acquirable(self, max_records: int) -> int:
        """The most records one acquisition may take now: up to the in-flight limit, or at the limit what
        the cached range still holds from the next fetch offset on."""
        capacity = self.max_in_flight_records - self.in_flight_count
        if capacity > 0:
            return min(max_records, capacity)
        nfo = self.next_fetch_offset()
        return min(max_records, self.end_offset - nfo + 1) if nfo <= self.end_offset else 0

    def can_acquire(self) -> bool:
        """False only when the in-flight limit is reached and nothing in the cache is acquirable."""
        return self.acquirable(1) > 0

    def acquire(
        self,
        member_id: str,
        fetched: Sequence[FetchedBatch],
        *,
        max_records: int,
        batch_size: int,
        now_ms: int,
        mode: AcquireMode = AcquireMode.BATCH_OPTIMIZED,
        fetch_offset: int | None = None,
    ) -> list[AcquiredRange]:
        """Acquire records of ``fetched`` (log batches read from ``next_fetch_offset()``) for a member.

        ``fetch_offset`` is the offset the log read started at; when given, cached AVAILABLE records
        between it and the first returned batch (removed by compaction) are archived. Offsets below
        the first returned batch that were never cached are archived either way, since the log has
        no records there.
        """
        if max_records <= 0 or not fetched:
            return []
        first_base = fetched[0].base_offset
        log_last = fetched[-1].last_offset
        if log_last < self._spso:
            return []
        read_from = fetch_offset if fetch_offset is not None else self.next_fetch_offset()
        if first_base > read_from:
            self._archive_missing(read_from, first_base - 1, archive_available=fetch_offset is not None)
            self._advance()

        budget = self.acquirable(max_records)
        if budget <= 0:
            return []
        # At the in-flight limit only records already inside the cached range can go out.
        hi = log_last if self.in_flight_count < self.max_in_flight_records else min(log_last, self.end_offset)

        deadline = now_ms + self.lock_duration_ms
        result: list[AcquiredRange] = []
        acquired = 0
        cursor = max(self._spso, first_base)
        i = self._batch_index(cursor)
        while cursor <= hi and acquired < budget:
            b = self._batches[i] if i < len(self._batches) else None
            if b is not None and b.first <= cursor:
                n, stop = self._acquire_cached(b, member_id, cursor, hi, budget - acquired, mode,
                                               deadline, acquired, result)
                acquired += n
                if stop:
                    break
                cursor = b.last + 1
                i += 1
                continue
            seg_hi = hi if b is None else min(hi, b.first - 1)
            n, new_batches = self._acquire_new(member_id, fetched, cursor, seg_hi, budget - acquired,
                                               batch_size, mode, deadline, result)
            for nb in new_batches:
                self._insert(i, nb)
                i += 1
            acquired += n
            cursor = seg_hi + 1
        if result:
            self._nfo = None
        self._advance()
        return result

    def archive_undeliverable(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Archive log ranges no consumer may get (control batches; aborted transactions under
        read_committed) before acquiring: they never become ACQUIRED, so no delivery is counted."""
        for lo, hi in ranges:
            if hi >= self._spso:
                self._archive_missing(lo, hi, archive_available=True)
        self._advance()

    def _archive_missing(self, lo: int, hi: int, *, archive_available: bool) -> None:
        """The log has nothing in [lo, hi]: archive gap offsets there (and stale AVAILABLE ones)."""
        cursor = max(lo, self._spso)
        i = self._batch_index(cursor)
        while cursor <= hi:
            b = self._batches[i] if i < len(self._batches) else None
            if b is not None and b.first <= cursor:
                if archive_available:
                    for rl, rh, s, _m, c, _d in b.runs(cursor, hi):
                        if s == _AVAILABLE:
                            self._set(b, rl, rh, _ARCHIVED, None, c, 0)
                    b.maybe_collapse()
                cursor = b.last + 1
                i += 1
                continue
            seg_hi = hi if b is None else min(hi, b.first - 1)
            filler = _Batch(cursor, seg_hi, _ARCHIVED, None, 0, 0)
            self._insert(i, filler)
            self._mark_dirty(cursor, seg_hi)
            i += 1
            cursor = seg_hi + 1

    def _throttled(self, b: _Batch, lo: int, hi: int) -> bool:
        threshold = self.throttle_threshold
        return any(s == _AVAILABLE and c >= threshold for _l, _h, s, _m, c, _d in b.runs(lo, hi))

    def _acquire_cached(self, b: _Batch, member: str, cursor: int, hi: int, remaining: int,
                        mode: AcquireMode, deadline: int, acquired_before: int,
                        result: list[AcquiredRange]) -> tuple[int, bool]:
        """Re-acquire AVAILABLE records of one cached batch; returns (count, stop the whole fetch)."""
        lo = max(cursor, b.first)
        b_hi = min(b.last, hi)
        throttle = self._throttled(b, lo, b_hi)
        if throttle and acquired_before > 0:
            # Records being redelivered many times go out without other records in the response.
            return 0, True
        full = lo == b.first and b.last <= hi
        record_limit_subset = mode == AcquireMode.RECORD_LIMIT and b.last - b.first + 1 > remaining
        if full and b.whole and not record_limit_subset and not throttle:
            if b.state != _AVAILABLE:
                return 0, False
            if b.count >= self.delivery_count_limit:
                # The limit was lowered since these were released: dead-lettered like any record at it.
                state, cause = self._failed(_CAUSE_DELIVERY_LIMIT)
                self._set(b, b.first, b.last, state, cause, b.count, 0)
                return 0, False
            self._set(b, b.first, b.last, _ACQUIRED, member, b.count + 1, deadline)
            result.append(AcquiredRange(b.first, b.last, b.count))
            return b.last - b.first + 1, False
        if b.whole and b.state != _AVAILABLE:
            return 0, False
        n = self._acquire_subset(b, member, lo, b_hi, remaining, mode, deadline, result)
        return n, throttle and n > 0

    def _acquire_subset(self, b: _Batch, member: str, lo: int, hi: int, remaining: int,
                        mode: AcquireMode, deadline: int, result: list[AcquiredRange]) -> int:
        limit = self.delivery_count_limit
        threshold = self.throttle_threshold
        batch_len = b.last - b.first + 1
        throttle_cap: int | None = None
        taken = 0
        picks: list[tuple[int, int, int]] = []
        for rl, rh, s, _m, c, _d in b.runs(lo, hi):
            if s != _AVAILABLE:
                continue
            if c >= limit:
                state, cause = self._failed(_CAUSE_DELIVERY_LIMIT)
                self._set(b, rl, rh, state, cause, c, 0)
                continue
            last_attempt = limit > 2 and c + 1 == limit
            if last_attempt and taken > 0:
                break  # goes out alone in a later fetch
            if c >= threshold and throttle_cap is None:
                # Halve the hand-out for every attempt beyond the threshold.
                throttle_cap = max(1, batch_len >> (c - threshold + 1))
            take = rh - rl + 1
            if last_attempt:
                take = 1
            if mode == AcquireMode.RECORD_LIMIT:
                take = min(take, remaining - taken)
            if throttle_cap is not None:
                take = min(take, throttle_cap - taken)
            if take <= 0:
                break
            picks.append((rl, rl + take - 1, c + 1))
            taken += take
            if take < rh - rl + 1 or last_attempt:
                break
        for first, last, count in picks:
            self._set(b, first, last, _ACQUIRED, member, count, deadline)
            if result and result[-1].last_offset + 1 == first and result[-1].delivery_count == count:
                prev = result.pop()
                first = prev.first_offset
            result.append(AcquiredRange(first, last, count))
        b.maybe_collapse()
        return taken

    def _acquire_new(self, member: str, fetched: Sequence[FetchedBatch], lo: int, hi: int,
                     remaining: int, batch_size: int, mode: AcquireMode, deadline: int,
                     result: list[AcquiredRange]) -> tuple[int, list[_Batch]]:
        """Acquire never-cached records [lo, ...hi] as new in-flight batches (delivery count 1)."""
        last = hi
        if remaining < hi - lo + 1:
            # Soft limit: finish the log batch holding the last wanted record.
            last = min(hi, _containing_batch_end(fetched, lo + remaining - 1))
        if mode == AcquireMode.RECORD_LIMIT:
            acq_last = min(last, lo + remaining - 1)
            nb = _Batch(lo, last, _ACQUIRED, member, 1, deadline)
            if acq_last < last:
                # The rest of the log batch is cached but stays AVAILABLE for the next fetch.
                nb.explode()
                nb.assign(acq_last + 1, last, _AVAILABLE, None, 0, 0)
            result.append(AcquiredRange(lo, acq_last, 1))
            return acq_last - lo + 1, [nb]
        chunks: list[tuple[int, int]] = []
        cur = lo
        size = max(1, batch_size)
        if last - lo + 1 > size:
            for fb in fetched:
                base = fb.base_offset
                if base > last:
                    break
                if base - cur >= size:
                    chunks.append((cur, base - 1))
                    cur = base
        chunks.append((cur, last))
        new_batches = []
        for first, chunk_last in chunks:
            new_batches.append(_Batch(first, chunk_last, _ACQUIRED, member, 1, deadline))
            result.append(AcquiredRange(first, chunk_last, 1))
        return last - lo + 1, new_batches

    # ------------------------------------------------------------------ acknowledgements

    def acknowledge(self, member_id: str, batches: Sequence[AckBatch], *, now_ms: int,
                    until_written: bool = False) -> AckOutcome:
        """Apply one request's acknowledgements for this partition atomically.

        INVALID_REQUEST for malformed batches or ranges past the cache, INVALID_RECORD_STATE for
        offsets not cached or not ACQUIRED by ``member_id``; on any error nothing changes. With
        ``until_written`` released records are not acquirable until ``written(outcome)``.
        """
        prev_last: int | None = None
        for ab in batches:
            n = ab.last_offset - ab.first_offset + 1
            types = ab.ack_types
            if (n < 1 or (prev_last is not None and ab.first_offset < prev_last) or not types
                    or (len(types) != 1 and len(types) != n) or any(t < 0 or t > 4 for t in types)):
                return AckOutcome(int(ErrorCode.INVALID_REQUEST))
            prev_last = ab.last_offset
        changes: list[_Change] = []
        dirty_before = list(self._dirty)
        full_before = self._full_write
        touched: list[_Batch] = []
        spso_before = self._spso
        for ab in batches:
            if ab.last_offset < spso_before:
                continue  # already behind SPSO
            err = self._ack_one(member_id, ab, now_ms, changes, touched, until_written)
            if err:
                for ch in reversed(changes):
                    self._restore(ch, match_renew=True)
                for b in touched:
                    b.maybe_collapse()
                self._dirty = dirty_before
                self._full_write = full_before
                return AckOutcome(err)
        for b in touched:
            b.maybe_collapse()
        dropped = self._advance()
        return AckOutcome(0, _Undo(changes, spso_before, self._spso, dropped))

    def _ack_one(self, member: str, ab: AckBatch, now_ms: int, changes: list[_Change],
                 touched: list[_Batch], until_written: bool) -> int:
        first = max(ab.first_offset, self._spso)
        last = ab.last_offset
        batches = self._batches
        i = bisect_right(self._firsts, first) - 1
        if i < 0:
            return int(ErrorCode.INVALID_RECORD_STATE)
        j = bisect_right(self._firsts, last) - 1
        if batches[j].last < first or last > batches[j].last:
            return int(ErrorCode.INVALID_REQUEST)
        for k in range(i, j + 1):
            for _l, _h, s, m, _c, _d in batches[k].runs(first, last):
                if s != _ACQUIRED or m != member:
                    return int(ErrorCode.INVALID_RECORD_STATE)
        types = ab.ack_types
        for k in range(i, j + 1):
            b = batches[k]
            lo, hi = max(first, b.first), min(last, b.last)
            if lo > hi:
                continue
            if not touched or touched[-1] is not b:
                touched.append(b)
            if len(types) == 1:
                self._ack_range(b, lo, hi, types[0], now_ms, changes, until_written)
                continue
            base = ab.first_offset
            o = lo
            while o <= hi:
                t = types[o - base]
                e = o
                while e < hi and types[e + 1 - base] == t:
                    e += 1
                self._ack_range(b, o, e, t, now_ms, changes, until_written)
                o = e + 1
        return 0

    def _ack_range(self, b: _Batch, lo: int, hi: int, ack_type: int, now_ms: int,
                   changes: list[_Change], until_written: bool) -> None:
        for rl, rh, s, m, c, d in b.runs(lo, hi):
            renew = ack_type == AcknowledgeType.RENEW
            if renew:
                new_state, new_member, new_deadline = _ACQUIRED, m, now_ms + self.lock_duration_ms
            elif ack_type == AcknowledgeType.ACCEPT:
                new_state, new_member, new_deadline = _ACKNOWLEDGED, None, 0
            elif ack_type == AcknowledgeType.RELEASE:
                if c >= self.delivery_count_limit:
                    new_state, new_member = self._failed(_CAUSE_DELIVERY_LIMIT)
                else:
                    new_state, new_member = (_RELEASING if until_written else _AVAILABLE), None
                new_deadline = 0
            elif ack_type == AcknowledgeType.REJECT:
                new_state, new_member = self._failed(_CAUSE_REJECTED)
                new_deadline = 0
            else:  # GAP: no record there, nothing to dead-letter
                new_state, new_member, new_deadline = _ARCHIVED, None, 0
            changes.append(_Change(rl, rh, s, m, c, d, new_state, new_member, new_deadline, renew))
            self._set(b, rl, rh, new_state, new_member, c, new_deadline)

    def _restore(self, ch: _Change, *, match_renew: bool, below_spso: bool = False) -> None:
        """Put a changed run back where it still holds exactly what the acknowledgement wrote (below SPSO
        too with ``below_spso``: a release archives ACQUIRED records the log start overtook)."""
        if ch.renew and not match_renew:
            return
        lo = ch.first if below_spso else max(ch.first, self._spso)
        hi = ch.last
        if lo > hi:
            return
        for k in range(self._batch_index(lo), len(self._batches)):
            b = self._batches[k]
            if b.first > hi:
                break
            for rl, rh, s, m, c, d in b.runs(lo, hi):
                if s == ch.new_state and m == ch.new_member and c == ch.count and (
                        not ch.renew or d == ch.new_deadline):
                    self._set(b, rl, rh, ch.state, ch.member, ch.count, ch.deadline)
            b.maybe_collapse()

    def rollback(self, outcome: AckOutcome, *, now_ms: int | None = None) -> bool:
        """Undo a successful acknowledgement whose WriteShareGroupState failed.

        Records go back to ACQUIRED by their member with their old lock deadline; pass ``now_ms`` to
        expire those whose lock ran out meanwhile. Records changed since (re-acquired after a
        RELEASE) or passed by a later SPSO move are left alone. RENEW is not undone. The next
        ``write_state`` writes the whole cache, since the failed write may have carried other
        changes. Returns True when something was undone.
        """
        undo = outcome.undo
        if undo is None or undo.used:
            return False
        undo.used = True
        # Nothing moved SPSO since: the outcome is undone exactly, batches it dropped included.
        unmoved = self._spso == undo.spso_after
        if unmoved:
            if undo.dropped:
                self._batches[0:0] = undo.dropped
                self._firsts[0:0] = [b.first for b in undo.dropped]
                for b in undo.dropped:
                    self._account(b, 1)
            self._spso = undo.spso_before
        for ch in reversed(undo.changes):
            self._restore(ch, match_renew=False, below_spso=unmoved)
        self._full_write = True
        self._dirty.clear()
        self._nfo = None
        self._advance()
        if now_ms is not None:
            self.expire_locks(now_ms)
        return True

    # ------------------------------------------------------------------ releases and expiry

    def release_member(self, member_id: str, *, now_ms: int, until_written: bool = False) -> AckOutcome | None:
        """Session close / disconnect: the member's ACQUIRED records go back, delivery count kept.

        Returns None when the member held nothing, else an outcome that ``rollback`` can undo (the
        records go back to ACQUIRED, to lapse with their lock) and ``written`` completes. ``now_ms``
        is not needed for the transition itself (locks of other members are left to ``expire_locks``).
        """
        del now_ms
        available = _RELEASING if until_written else _AVAILABLE
        changes: list[_Change] = []
        spso_before = self._spso
        for b in list(self._batches):
            runs = [r for r in b.runs(b.first, b.last) if r[2] == _ACQUIRED and r[3] == member_id]
            for rl, rh, _s, m, c, d in runs:
                self._release_run(b, rl, rh, c, available)
                for ql, qh, qs, qm, _qc, _qd in b.runs(rl, rh):
                    changes.append(_Change(ql, qh, _ACQUIRED, m, c, d, qs, qm, 0, False))
            if runs:
                b.maybe_collapse()
        if not changes:
            return None
        dropped = self._advance()
        return AckOutcome(0, _Undo(changes, spso_before, self._spso, dropped))

    def written(self, outcome: AckOutcome) -> None:
        """The write carrying ``outcome`` succeeded: its released records become acquirable."""
        undo = outcome.undo
        if undo is None or undo.used:
            return
        undo.used = True
        for ch in undo.changes:
            if ch.new_state != _RELEASING:
                continue
            lo, hi = ch.first, ch.last
            for k in range(self._batch_index(lo), len(self._batches)):
                b = self._batches[k]
                if b.first > hi:
                    break
                for rl, rh, s, m, c, _d in b.runs(lo, hi):
                    if s == _RELEASING and m is None and c == ch.count:
                        if rl < self._spso:  # passed by SPSO meanwhile: gone for good
                            self._release_run(b, rl, rh, c)
                        else:
                            self._set(b, rl, rh, _AVAILABLE, None, c, 0, dirty=False)
                b.maybe_collapse()

    def next_lock_deadline(self) -> int | None:
        heap = self._lock_heap
        while heap and heap[0] not in self._lock_counts:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def expire_locks(self, now_ms: int) -> bool:
        """Acquisition locks with deadline <= now_ms lapse: AVAILABLE again, ARCHIVED at the limit."""
        first_deadline = self.next_lock_deadline()
        if first_deadline is None or first_deadline > now_ms:
            return False
        for b in list(self._batches):
            runs = [r for r in b.runs(b.first, b.last) if r[2] == _ACQUIRED and r[5] <= now_ms]
            for rl, rh, _s, _m, c, _d in runs:
                self._release_run(b, rl, rh, c)
            if runs:
                b.maybe_collapse()
        self._advance()
        return True

    def on_log_start_offset_moved(self, log_start: int) -> bool:
        """Retention / DeleteRecords moved the log start past SPSO: archive AVAILABLE below it.

        ACQUIRED records below the new SPSO stay until released or expired (then ARCHIVED).
        """
        if log_start <= self._spso:
            return False
        for b in list(self._batches):
            if b.first >= log_start:
                break
            runs = [r for r in b.runs(b.first, log_start - 1) if r[2] == _AVAILABLE]
            for rl, rh, _s, _m, c, _d in runs:
                self._set(b, rl, rh, _ARCHIVED, None, c, 0)
            if runs:
                b.maybe_collapse()
        self._spso = log_start
        self._nfo = None
        self._advance()
        return True

    # ------------------------------------------------------------------ dead-lettering (KIP-1191)

    def archiving_runs(self) -> list[ArchivingRun]:
        """Every run in ARCHIVING, in offset order, with why it is dead-lettered."""
        out: list[ArchivingRun] = []
        for b in self._batches:
            if b.whole and b.state != _ARCHIVING:
                continue
            for rl, rh, s, m, c, _d in b.runs(b.first, b.last):
                if s == _ARCHIVING:
                    rejected = m == _CAUSE_REJECTED if m is not None else c < self.delivery_count_limit
                    if out and out[-1].last_offset + 1 == rl and out[-1].delivery_count == c \
                            and out[-1].rejected == rejected:
                        out[-1] = out[-1]._replace(last_offset=rh)
                    else:
                        out.append(ArchivingRun(rl, rh, c, rejected))
        return out

    def complete_archiving(self, runs: Sequence[ArchivingRun]) -> bool:
        """ARCHIVING -> ARCHIVED for ``runs`` once their dead-letter records are durable."""
        changed = False
        for first, last, count, _rejected in runs:
            for k in range(self._batch_index(first), len(self._batches)):
                b = self._batches[k]
                if b.first > last:
                    break
                for rl, rh, s, _m, c, _d in b.runs(max(first, b.first), min(last, b.last)):
                    if s == _ARCHIVING and c == count:
                        self._set(b, rl, rh, _ARCHIVED, None, c, 0)
                        changed = True
                b.maybe_collapse()
        if changed:
            self._advance()
        return changed

    # ------------------------------------------------------------------ persistence

    def mark_write_failed(self) -> None:
        """A WriteShareGroupState was lost: make the next ``write_state`` carry the whole cache."""
        self._full_write = True
        self._dirty.clear()

    def write_state(self, changed_only: bool = True) -> StateSnapshot:
        """What to send with WriteShareGroupState now; resets the set of changed ranges.

        ``changed_only`` returns the ranges changed since the previous call (or the whole cache after
        a failed write); False always returns the whole cache. Nothing below SPSO is included,
        ACQUIRED is written as AVAILABLE and adjacent runs with equal state and count are merged.
        """
        spso, end = self._spso, self.end_offset
        if changed_only and not self._full_write:
            ranges = _merge_ranges(self._dirty)
        else:
            ranges = [(spso, end)]
        self._dirty.clear()
        self._full_write = False
        out: list[PersistedStateBatch] = []
        for rlo, rhi in ranges:
            lo, hi = max(rlo, spso), min(rhi, end)
            if lo > hi:
                continue
            for k in range(self._batch_index(lo), len(self._batches)):
                b = self._batches[k]
                if b.first > hi:
                    break
                for first, last, s, _m, c, _d in b.runs(lo, hi):
                    state = _AVAILABLE if s in (_ACQUIRED, _RELEASING) else s
                    if out and out[-1].last_offset + 1 == first and out[-1].delivery_state == state \
                            and out[-1].delivery_count == c:
                        out[-1] = PersistedStateBatch(out[-1].first_offset, last, state, c)
                    else:
                        out.append(PersistedStateBatch(first, last, state, c))
        return StateSnapshot(spso, self._state_epoch, self.delivery_complete_count, out)


def _containing_batch_end(fetched: Sequence[FetchedBatch], offset: int) -> int:
    """Last offset of the fetched log batch holding ``offset`` (``offset`` itself if none does)."""
    holder: FetchedBatch | None = None
    for fb in fetched:
        if fb.base_offset > offset:
            break
        holder = fb
    if holder is not None and offset <= holder.last_offset:
        return holder.last_offset
    return offset


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged
