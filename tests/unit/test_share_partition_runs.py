"""The run-length record states of one in-flight batch (`_Batch`) against a per-offset model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share.share_partition import _TERMINAL, _Batch

FIRST, LAST = 100, 139
offsets = st.integers(FIRST, LAST)
values = st.tuples(st.integers(0, 5), st.sampled_from([None, "m1", "m2"]), st.integers(0, 3), st.sampled_from([0, 7]))
assigns = st.lists(st.tuples(offsets, offsets, values), max_size=25)


def model_runs(model: list[tuple[int, str | None, int, int]], lo: int, hi: int) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for o in range(lo, hi + 1):
        v = model[o - FIRST]
        if out and out[-1][1] == o - 1 and out[-1][2:] == v:
            out[-1] = (out[-1][0], o, *v)
        else:
            out.append((o, o, *v))
    return out


@given(values, assigns, offsets, offsets, st.booleans())
def test_runs_match_per_offset_states(start: tuple[int, str | None, int, int],
                                      steps: list[tuple[int, int, tuple[int, str | None, int, int]]],
                                      a: int, b: int, collapse: bool) -> None:
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
            assert batch.starts[0] == FIRST
            assert batch.starts == sorted(set(batch.starts))
            assert all(p != q for p, q in zip(batch.values, batch.values[1:], strict=False))
    lo, hi = min(a, b), max(a, b)
    assert batch.runs(lo, hi) == model_runs(model, lo, hi)
    assert batch.runs(FIRST - 5, LAST + 5) == model_runs(model, FIRST, LAST)
    assert batch.all_terminal() == all(v[0] in _TERMINAL for v in model)
    batch.maybe_collapse()
    assert (batch.starts is None) == (len(set(model)) == 1)
    assert batch.runs(FIRST, LAST) == model_runs(model, FIRST, LAST)
