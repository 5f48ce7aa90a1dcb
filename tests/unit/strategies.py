"""Hypothesis strategies derived from the message specs themselves.

A strategy is built per (message, version): only fields present in that version are drawn, nulls only where
nullableVersions allows them, integers across their full wire range. Absent fields keep the class defaults,
which is also what the decoder fills in, so an encode/decode round trip must give back an equal object.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from shoal.protocol.codec import MessageBase, MessageCodec
from shoal.protocol.schema import FieldSpec, StructSpec

INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

# Small collections keep a run of hundreds of message versions fast; nesting multiplies sizes anyway.
MAX_LIST = 3
MAX_TEXT = 12


def _scalar(f: FieldSpec, version: int) -> st.SearchStrategy[Any]:
    t = f.type
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        # Bias towards the edges, where sign and width mistakes show up.
        return st.one_of(st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))
    if t == "bool":
        return st.booleans()
    if t == "float64":
        return st.floats(allow_nan=False)  # NaN != NaN would make equality checks meaningless
    if t == "uuid":
        return st.binary(min_size=16, max_size=16)
    if t == "string":
        # Multi-byte characters check that lengths are counted in bytes, not characters.
        base: st.SearchStrategy[Any] = st.text(max_size=MAX_TEXT)
    elif t in ("bytes", "records"):
        base = st.binary(max_size=MAX_TEXT * 2)
    else:
        raise AssertionError(f"unhandled type {t}")
    if version in f.nullable:
        return st.none() | base
    return base


def struct_strategy(
    codec: MessageCodec, s: StructSpec, version: int, *, extensions: bool = True
) -> st.SearchStrategy[MessageBase]:
    """Instances of `s`; without `extensions`, Shoal's own fields keep their defaults (as Kafka's spec has them)."""
    cls: type[MessageBase] = codec.cls if s.name == codec.spec.root.name else getattr(codec.cls, s.name)
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in s.fields:
        if version not in f.versions or (f.extension and not extensions):
            continue  # absent in this version: the class default is what decode yields
        kwargs[f.attr] = field_strategy(codec, f, version, extensions=extensions)
    return st.builds(cls, **kwargs)


def field_strategy(
    codec: MessageCodec, f: FieldSpec, version: int, *, extensions: bool = True
) -> st.SearchStrategy[Any]:
    nullable = version in f.nullable
    if f.struct is not None:
        elem = st.deferred(
            lambda: struct_strategy(codec, f.struct, version, extensions=extensions)  # type: ignore[arg-type]
        )
    else:
        elem = _scalar(f, version) if not f.is_array else _array_elem(f, version)
    if f.is_array:
        lists = st.lists(elem, max_size=MAX_LIST)
        return st.none() | lists if nullable else lists
    if f.struct is not None and nullable:
        return st.none() | elem
    return elem


def _array_elem(f: FieldSpec, version: int) -> st.SearchStrategy[Any]:
    # nullableVersions on an array field means the array may be null, never its elements.
    t = f.type
    if t == "string":
        return st.text(max_size=MAX_TEXT)
    if t in ("bytes", "records"):
        return st.binary(max_size=MAX_TEXT)
    return _scalar(f, version)


def message_strategy(codec: MessageCodec, version: int, *, extensions: bool = True) -> st.SearchStrategy[MessageBase]:
    return struct_strategy(codec, codec.spec.root, version, extensions=extensions)
