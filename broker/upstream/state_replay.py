"""Sidecar mode: which batches of a state partition committed, decided by the end-transaction markers read.

A correct upstream answers a read_committed Fetch up to its last stable offset and lists the aborted
transactions in range, and the reader drops their batches (`partition_source.undeliverable`). Not every
Kafka-protocol broker does: Tansu returns aborted records with an empty list. The markers themselves say the
same thing on any upstream: a producer's transactional batch counts once that producer's COMMIT marker
follows it, and never once its ABORT marker does. `MarkerFilter` holds each transactional batch until its
producer's marker is read, and hands out what committed in offset order, so replay sees the records as the
log holds them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class BatchInfo(Protocol):
    """What the filter reads of a batch header (`record_batch.BatchHeader` has it)."""

    @property
    def base_offset(self) -> int: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...


@dataclass(slots=True)
class _Held(Generic[T]):
    item: T
    committed: bool | None  # None: its producer's marker not read yet


class MarkerFilter(Generic[T]):
    """Feed every batch of a partition in offset order (`add`); get back the data batches that committed, in
    offset order, as soon as everything before them is decided."""

    def __init__(self) -> None:
        self._held: deque[_Held[T]] = deque()
        self._open: dict[int, list[_Held[T]]] = {}  # per producer: its batches waiting for its marker

    @property
    def undecided(self) -> bool:
        """Some batch waits for its producer's marker (an open transaction, or a marker not read yet)."""
        return bool(self._held)

    def add(self, header: BatchInfo, item: T, commit: bool | None = None) -> list[T]:
        """One batch; `commit` is what a control batch's marker says (COMMIT True, ABORT False). Returns the
        batches now known to count."""
        if header.is_control:
            for held in self._open.pop(header.producer_id, []):
                held.committed = bool(commit)
        elif header.is_transactional:
            held = _Held(item, None)
            self._open.setdefault(header.producer_id, []).append(held)
            self._held.append(held)
        else:
            self._held.append(_Held(item, True))
        out: list[T] = []
        while self._held and self._held[0].committed is not None:
            done = self._held.popleft()
            if done.committed:
                out.append(done.item)
        return out
