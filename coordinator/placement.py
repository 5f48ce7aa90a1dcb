"""Which internal-topic partition holds a coordinator key, computed exactly as Kafka does."""

from __future__ import annotations


def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a signed int32."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, num_partitions: int) -> int:
    """Utils.abs(key.hashCode()) % partitions, where Utils.abs(Integer.MIN_VALUE) is 0."""
    h = java_string_hashcode(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions
