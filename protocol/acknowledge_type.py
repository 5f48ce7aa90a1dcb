"""How a share consumer acknowledges delivered records (ShareFetch/ShareAcknowledge AcknowledgeTypes)."""

from __future__ import annotations

from enum import IntEnum


class AcknowledgeType(IntEnum):
    GAP = 0  # offsets without a record (compacted away or transaction markers), sent by the client itself
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # keep the acquisition lock (KIP-1222, ShareFetch/ShareAcknowledge v2)
