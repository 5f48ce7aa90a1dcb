"""Topic and group names unique to one test run, so runs sharing one broker (SHOAL_BOOTSTRAP) never collide."""

from __future__ import annotations

import uuid


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
