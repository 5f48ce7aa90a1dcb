"""Share sessions: one per (group, member) on this broker, tied to the connection that opened it.

Epoch 0 opens (replacing any session of the same member), n must equal the expected epoch, -1 closes.
A session lists the share partitions its fetches cover; closing it, or losing its connection,
releases the records the member holds on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.protocol.errors import ErrorCode
from shoal.protocol.topic_id_partition import TopicIdPartition

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1



def next_epoch(epoch: int) -> int:
    # After Integer.MAX_VALUE the epoch wraps to 1, never back to 0 (0 means "open").
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(eq=False)
class ShareSession:
    group_id: str
    member_id: str
    connection: Any
    expected_epoch: int = 1
    # Insertion-ordered set of the session's partitions (dict keys keep order).
    partitions: dict[TopicIdPartition, None] = field(default_factory=dict)
    # Partitions answered with an error: the next response names them again, so a client learns the
    # error cleared (as Kafka's CachedSharePartition.requiresUpdateInResponse).
    resend: set[TopicIdPartition] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str]:
        return (self.group_id, self.member_id)

    def add(self, tp: TopicIdPartition) -> bool:
        if tp in self.partitions:
            return False
        self.partitions[tp] = None
        return True

    def forget(self, tp: TopicIdPartition) -> None:
        self.partitions.pop(tp, None)
        self.resend.discard(tp)

    def take_resend(self) -> set[TopicIdPartition]:
        out, self.resend = self.resend, set()
        return out


class ShareSessionCache:
    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], ShareSession] = {}
        self._per_group: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def check(self, group_id: str, member_id: str, epoch: int) -> tuple[int, ShareSession | None]:
        """Validate a non-initial epoch; returns (error code, session)."""
        session = self._sessions.get((group_id, member_id))
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, None
        if epoch != FINAL_EPOCH and epoch != session.expected_epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, session
        return ErrorCode.NONE, session

    def is_full_for(self, group_id: str, member_id: str) -> bool:
        return (group_id, member_id) not in self._sessions and len(self._sessions) >= self.max_sessions

    def open(self, group_id: str, member_id: str, connection: Any) -> tuple[ShareSession, ShareSession | None]:
        """A new session at epoch 0; returns it and the one it replaced (whose records are not released)."""
        old = self._sessions.get((group_id, member_id))
        session = ShareSession(group_id, member_id, connection)
        self._sessions[session.key] = session
        if old is None:
            self._per_group[group_id] = self._per_group.get(group_id, 0) + 1
        return session, old

    def remove(self, session: ShareSession) -> bool:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
            left = self._per_group[session.group_id] - 1
            if left:
                self._per_group[session.group_id] = left
            else:
                del self._per_group[session.group_id]
            return True
        return False

    def has_group(self, group_id: str) -> bool:
        """Whether any session of the group is open on this broker."""
        return group_id in self._per_group

    def sessions_of(self, connection: Any) -> list[ShareSession]:
        return [s for s in self._sessions.values() if s.connection is connection]

    def groups(self) -> set[str]:
        return set(self._per_group)
