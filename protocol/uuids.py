"""Kafka's text form of a Uuid (topic ids, member ids): 22 characters of URL-safe base64, no padding."""

from __future__ import annotations

import base64


def uuid_to_str(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode().rstrip("=")
