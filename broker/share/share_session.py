"""Share sessions: one per (group, member) on this broker, tied to the connection that opened it.

Epoch 0 opens (replacing any session of the same member), n must equal the expected epoch, -1 closes:
`session_epoch_rule` decides, for ShareFetch and ShareAcknowledge alike. A session lists the share partitions its fetches cover; closing it, or losing its connection,
releases the records the member holds on them.
"""

from __future__ import annotations

import enum
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


class EpochAction(enum.Enum):
    OPEN = "open"  # epoch 0: a new session (replacing the member's old one)
    CONTINUE = "continue"  # the expected epoch: the session goes on, expecting the next one
    CLOSE = "close"  # epoch -1: the request is served, then the session ends
    REJECT = "reject"  # answer with error_code and nothing else


@dataclass(frozen=True, slots=True)
class EpochDecision:
    action: EpochAction
    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    # The epoch the session expects next (CONTINUE only).
    next_expected: int | None = None


def session_epoch_rule(epoch: int, expected: int | None, *, may_open: bool, has_acks: bool) -> EpochDecision:
    """What a request's share session epoch means, given the member's session (`expected` is its
    expected epoch, None if it has none). ShareAcknowledge may not open a session (`may_open`), and a
    ShareFetch that opens one may not carry acknowledgements."""
    if epoch == INITIAL_EPOCH:
        if not may_open:
            return EpochDecision(EpochAction.REJECT, ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                                 "ShareAcknowledge cannot open a share session")
        if has_acks:
            return EpochDecision(EpochAction.REJECT, ErrorCode.INVALID_REQUEST,
                                 "acknowledgements are not allowed when opening a share session")
        return EpochDecision(EpochAction.OPEN)
    if expected is None:
        return EpochDecision(EpochAction.REJECT, ErrorCode.SHARE_SESSION_NOT_FOUND)
    if epoch == FINAL_EPOCH:
        return EpochDecision(EpochAction.CLOSE)
    if epoch != expected:
        return EpochDecision(EpochAction.REJECT, ErrorCode.INVALID_SHARE_SESSION_EPOCH)
    return EpochDecision(EpochAction.CONTINUE, next_expected=next_epoch(epoch))


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

    def enter(self, group_id: str, member_id: str, epoch: int, *, may_open: bool,
              has_acks: bool = False) -> tuple[EpochDecision, ShareSession | None]:
        """Apply the epoch rule to the member's session: a CONTINUE advances its expected epoch. OPEN
        returns no session (the caller opens one once there is room)."""
        session = self._sessions.get((group_id, member_id))
        decision = session_epoch_rule(epoch, None if session is None else session.expected_epoch,
                                      may_open=may_open, has_acks=has_acks)
        if decision.next_expected is not None and session is not None:
            session.expected_epoch = decision.next_expected
        return decision, (session if decision.action in (EpochAction.CONTINUE, EpochAction.CLOSE) else None)

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
