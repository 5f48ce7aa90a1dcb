"""The record states of one in-flight batch (`_Batch`: whole, as runs, or per offset past the run limit)
against a per-offset model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share import share_partition
from shoal.broker.share.share_partition import _TERMINAL, _Batch

FIRST, LAST = 100, 139
offsets = st.integers(FIRST, LAST)
values = st.tuples(st.integers(0, 5), st.sampled_from([None, "m1", "m2"]), st.integers(0, 3), st.sampled_from([0, 7]))
assigns = st.lists(st.tuples(offsets, offsets, values), max_size=25)
Value = tuple[int, str | None, int, int]


def model_runs(model: list[Value], lo: int, hi: int) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for o in range(lo, hi + 1):
        v = model[o - FIRST]
        if out and out[-1][1] == o - 1 and out[-1][2:] == v:
            out[-1] = (out[-1][0], o, *v)
        else:
            out.append((o, o, *v))
    return out


@given(values, assigns, offsets, offsets, st.booleans(), st.sampled_from([2, 64]))
def test_runs_match_per_offset_states(start: Value, steps: list[tuple[int, int, Value]], a: int, b: int,
                                      collapse: bool, max_runs: int) -> None:
    saved = share_partition._MAX_RUNS
    share_partition._MAX_RUNS = max_runs
    try:
        batch = _Batch(FIRST, LAST, *start)
        model = [start] * (LAST - FIRST + 1)
        for x, y, v in steps:
            lo, hi = min(x, y), max(x, y)
            batch.assign(lo, hi, *v)
            model[lo - FIRST : hi - FIRST + 1] = [v] * (hi - lo + 1)
            if collapse:
                batch.maybe_collapse()
            if batch.starts is not None:
                # Neighbouring runs always differ, and the runs start inside the batch, in order.
                assert len(batch.starts) <= max_runs
                assert batch.starts[0] == FIRST
                assert batch.starts == sorted(set(batch.starts))
                assert all(p != q for p, q in zip(batch.values, batch.values[1:], strict=False))
        lo, hi = min(a, b), max(a, b)
        assert batch.runs(lo, hi) == model_runs(model, lo, hi)
        assert batch.runs(FIRST - 5, LAST + 5) == model_runs(model, FIRST, LAST)
        assert batch.all_terminal() == all(v[0] in _TERMINAL for v in model)
        not_terminal = [o for o in range(lo, LAST + 1) if model[o - FIRST][0] not in _TERMINAL]
        assert batch.terminal_end(lo) == (not_terminal[0] if not_terminal else LAST + 1)
        available = [o for o in range(lo, LAST + 1) if model[o - FIRST][0] == 0]
        assert batch.first_in_state(lo, 0) == (available[0] if available else None)
        batch.maybe_collapse()
        assert batch.whole == (len(set(model)) == 1)
        assert batch.runs(FIRST, LAST) == model_runs(model, FIRST, LAST)
    finally:
        share_partition._MAX_RUNS = saved


def test_acknowledging_record_by_record_stays_linear() -> None:
    """Alternating outcomes over a large log batch go to per-offset tracking, so no run list of thousands
    of entries is rebuilt for each record (checked by the runs kept, not by time)."""
    n = 50_000
    batch = _Batch(0, n - 1, 1, "m", 1, 5)
    for o in range(0, n, 2):
        batch.assign(o, o, 2, None, 1, 0)
        assert batch.starts is None or len(batch.starts) <= share_partition._MAX_RUNS
    assert batch.states is not None
    assert [r[2] for r in batch.runs(0, 5)] == [2, 1, 2, 1, 2, 1]
