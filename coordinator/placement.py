"""Which internal-topic partition holds a coordinator key, computed exactly as Kafka does, and the one
place every coordinator asks it (`Placement`), so that lookups go where replay put the key."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("shoal.coordinator_placement")

K = TypeVar("K", bound=Hashable)

# Keys of a misplaced kind logged one by one at load; past that, one line gives the total.
_WARN_EACH = 20


@functools.lru_cache(maxsize=1 << 16)
def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a signed int32.

    Cached: group ids recur on every request and on every pass over the groups."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, num_partitions: int) -> int:
    """Utils.abs(key.hashCode()) % partitions, where Utils.abs(Integer.MIN_VALUE) is 0."""
    h = java_string_hashcode(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


class Placement(Generic[K]):
    """Where the keys of one internal topic live: the answer every write and every lookup uses.

    A key's home is Kafka's hash of it modulo `num_partitions`, the partition count the topic was created
    with (not its current count: a data directory may hold partitions added later). Replay is the other
    side: it puts a key's records into the shard of the partition they are in. `settle`, after a load,
    keeps the two in agreement: a key replay found only outside its home stays where it was found (logged
    once), so its next writes go where the next replay will find them; a copy of a key also held at its
    home, or already placed elsewhere, is left out of lookups (`holds`).
    """

    def __init__(self, num_partitions: int, key_string: Callable[[K], str] = str, *, topic: str = "") -> None:
        if num_partitions < 1:
            raise ValueError(f"an internal topic has at least one partition, not {num_partitions}")
        self.num_partitions = num_partitions
        self.topic = topic
        self._key_string = key_string
        self._found: dict[K, int] = {}  # keys replay found away from home -> the partition holding them

    def home(self, key: K) -> int:
        return coordinator_partition(self._key_string(key), self.num_partitions)

    def partition_for(self, key: K) -> int:
        """The partition whose shard holds `key`, and where its next records are written."""
        if self._found:
            found = self._found.get(key)
            if found is not None:
                return found
        return self.home(key)

    def holds(self, partition: int, key: K) -> bool:
        """Whether lookups of `key` go to `partition` (false for a copy `settle` left out)."""
        return self.partition_for(key) == partition

    @property
    def misplaced(self) -> dict[K, int]:
        """Keys held away from their home partition, and where they are."""
        return dict(self._found)

    def settle(self, shards: Sequence[Collection[K]], kind: str = "key") -> int:
        """After loading every partition: `shards[p]` is the keys partition p's shard holds. Returns the
        number of keys found away from home."""
        found = 0
        for partition, keys in enumerate(shards):
            for key in keys:
                want = self.partition_for(key)
                if want == partition:
                    continue
                home = self.home(key)
                if key in self._found or (home < len(shards) and key in shards[home]):
                    log.warning("ignoring a second copy of a coordinator key", topic=self.topic, kind=kind,
                                key=self._key_string(key), partition=partition, used=want)
                    continue
                self._found[key] = partition
                found += 1
                if found <= _WARN_EACH:
                    log.warning("coordinator key found outside its partition; it stays where it is",
                                topic=self.topic, kind=kind, key=self._key_string(key), partition=partition,
                                expected=home, partitions=self.num_partitions)
        if found > _WARN_EACH:
            log.warning("coordinator keys found outside their partitions", topic=self.topic, kind=kind,
                        count=found, partitions=self.num_partitions)
        return found
