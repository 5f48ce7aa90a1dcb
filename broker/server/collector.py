"""The interpreter's cyclic garbage collector, set for a long-running broker.

A full collection walks every tracked object with the event loop stopped. Under a share group at 10k
records/s the interpreter's default thresholds ran one about every 0.6 s, each 20-35 ms, and those pauses
were most of the share consumers' p99 produce-to-delivery latency: the records that came in meanwhile waited
for the acknowledgement writes the pause held up. Young collections (generations 0 and 1) keep the
interpreter's thresholds and still free short-lived cycles; a full collection waits for many more young ones;
and what start-up built (modules, message classes, the configuration) is frozen out of every collection.
"""

from __future__ import annotations

import gc

# Generation-1 collections between two full ones (the interpreter's default is 10).
FULL_COLLECTION_THRESHOLD = 1000


def settle_after_start() -> None:
    """Call once the broker serves: start-up garbage is freed, what survives it is never walked again."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
