"""Kafka's Uuids and member ids: the text form of a Uuid (topic ids, member ids) is 22 characters of
URL-safe base64 without padding; the null Uuid is sixteen zero bytes."""

from __future__ import annotations

import base64

ZERO_UUID = b"\x00" * 16  # Uuid.ZERO_UUID: "no topic id" on the wire

# KIP-848/KIP-932 cap a client-chosen member id at 36 characters (a UUID's canonical text form);
# the ids Kafka hands out itself are 22.
MAX_MEMBER_ID_LENGTH = 36


def uuid_to_str(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode().rstrip("=")
