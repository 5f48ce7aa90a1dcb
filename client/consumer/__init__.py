"""The share consumer (KIP-932): joins a share group, fetches acquired records and acknowledges them."""

from .share_consumer import AcknowledgeType, AsyncShareConsumer, ShareConsumer, ShareRecord, new_member_id

__all__ = ["AcknowledgeType", "AsyncShareConsumer", "ShareConsumer", "ShareRecord", "new_member_id"]
