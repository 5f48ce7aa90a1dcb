"""Replay of a state partition decides what committed from the end-transaction markers it reads
(`state_replay.MarkerFilter`), so an upstream that returns aborted records without listing them (Tansu)
replays what a correct one does. The property: on every log a correct broker serves, the markers give the
answer the aborted-transactions list gives."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.storage.partition_source import SourceRead, undeliverable
from shoal.broker.upstream.state_replay import MarkerFilter
from shoal.protocol.record_batch import CONTROL_FLAG, TRANSACTIONAL_FLAG, BatchHeader

PLAIN = -1  # a producer writing without transactions
Batch = tuple[BatchHeader, bool | None]  # the header, and what a control batch's marker says


def _header(offset: int, count: int, producer_id: int, attributes: int) -> BatchHeader:
    return BatchHeader(base_offset=offset, batch_length=0, partition_leader_epoch=0, magic=2, crc=0,
                       attributes=attributes, last_offset_delta=count - 1, base_timestamp=0, max_timestamp=0,
                       producer_id=producer_id, producer_epoch=0, base_sequence=0, records_count=count)


@dataclass
class Log:
    """A partition as a correct broker writes it, with what its read_committed Fetch would report."""

    batches: list[Batch]
    aborted: list[tuple[int, int]]  # (producer id, first offset) of each aborted transaction
    open_from: dict[int, int]  # producer id -> first offset of its transaction still open at the end

    @property
    def last_stable_offset(self) -> int:
        end = self.batches[-1][0].last_offset + 1 if self.batches else 0
        return min(self.open_from.values(), default=end)


# One step: a producer (0..2 transactional, PLAIN not) writes a batch of `count` records, or ends its
# transaction (True commit, False abort).
steps = st.lists(st.one_of(
    st.tuples(st.just("data"), st.sampled_from([0, 1, 2, PLAIN]), st.integers(min_value=1, max_value=4)),
    st.tuples(st.just("end"), st.sampled_from([0, 1, 2]), st.booleans())), max_size=40)


def build(ops: list[tuple[str, int, int | bool]], *, close_all: bool | None) -> Log:
    """The log the steps write; `close_all` ends every transaction still open (commit or abort)."""
    batches: list[Batch] = []
    aborted: list[tuple[int, int]] = []
    open_from: dict[int, int] = {}
    offset = 0

    def end(pid: int, commit: bool) -> None:
        nonlocal offset
        first = open_from.pop(pid)
        if not commit:
            aborted.append((pid, first))
        batches.append((_header(offset, 1, pid, TRANSACTIONAL_FLAG | CONTROL_FLAG), commit))
        offset += 1

    for kind, pid, arg in ops:
        if kind == "data":
            count = int(arg)
            if pid != PLAIN:
                open_from.setdefault(pid, offset)
            batches.append((_header(offset, count, pid, 0 if pid == PLAIN else TRANSACTIONAL_FLAG), None))
            offset += count
        elif pid in open_from:
            end(pid, bool(arg))
    if close_all is not None:
        for pid in list(open_from):
            end(pid, close_all)
    return Log(batches, aborted, open_from)


def by_aborted_list(batches: list[Batch], aborted: list[tuple[int, int]]) -> list[int]:
    """Base offsets of the data batches a reader keeps by the Fetch's aborted list (Kafka's consumer rule)."""
    read = SourceRead(batches=[(h, memoryview(b"")) for h, _ in batches], high_watermark=0, last_stable_offset=0,
                      log_start_offset=0, aborted=aborted)
    skip = undeliverable(read)
    return [h.base_offset for h, _ in batches if (h.base_offset, h.last_offset) not in skip]


def by_markers(batches: list[Batch]) -> tuple[list[int], bool]:
    kept: MarkerFilter[int] = MarkerFilter()
    out = [offset for h, commit in batches for offset in kept.add(h, h.base_offset, commit)]
    return out, kept.undecided


@given(steps, st.booleans())
def test_the_markers_keep_what_the_aborted_list_keeps_on_a_whole_log(ops: list[tuple[str, int, int | bool]],
                                                                   close_with: bool) -> None:
    log = build(ops, close_all=close_with)
    kept, undecided = by_markers(log.batches)
    assert kept == by_aborted_list(log.batches, log.aborted)
    assert not undecided


@given(steps)
def test_up_to_the_last_stable_offset_the_markers_never_keep_what_the_list_drops(
        ops: list[tuple[str, int, int | bool]]) -> None:
    """A read_committed Fetch stops at the last stable offset: a transaction whose marker lies past it stays
    undecided by the markers (the reader reads on), while the list already knows it; what the markers hand
    out is always where the list's answer starts."""
    log = build(ops, close_all=None)
    served = [b for b in log.batches if b[0].base_offset < log.last_stable_offset]
    listed = [(pid, first) for pid, first in log.aborted if first < log.last_stable_offset]
    kept, _ = by_markers(served)
    assert kept == by_aborted_list(served, listed)[:len(kept)]


def test_a_batch_waits_for_its_producers_marker_and_an_abort_drops_it() -> None:
    log = build([("data", 0, 1), ("data", PLAIN, 1), ("data", 1, 2), ("end", 1, True), ("end", 0, False)],
                close_all=None)
    kept: MarkerFilter[int] = MarkerFilter()
    released = [kept.add(h, h.base_offset, commit) for h, commit in log.batches]
    # Producer 0's batch at 0 holds the plain batch at 1 and producer 1's at 2 until its ABORT at 5.
    assert released == [[], [], [], [], [1, 2]]
    assert not kept.undecided
