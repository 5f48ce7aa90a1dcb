"""The share-session epoch rules, for ShareFetch and ShareAcknowledge."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.broker.share.share_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    EpochAction,
    ShareSessionCache,
    next_epoch,
    session_epoch_rule,
)
from shoal.protocol.errors import ErrorCode

epochs = st.integers(min_value=-1, max_value=MAX_EPOCH)
expected_epochs = st.one_of(st.none(), st.integers(min_value=1, max_value=MAX_EPOCH))


def test_opening() -> None:
    assert session_epoch_rule(INITIAL_EPOCH, None, may_open=True, has_acks=False).action is EpochAction.OPEN
    assert session_epoch_rule(INITIAL_EPOCH, 5, may_open=True, has_acks=False).action is EpochAction.OPEN
    acks = session_epoch_rule(INITIAL_EPOCH, None, may_open=True, has_acks=True)
    assert (acks.action, acks.error_code) == (EpochAction.REJECT, ErrorCode.INVALID_REQUEST)
    ack_api = session_epoch_rule(INITIAL_EPOCH, 3, may_open=False, has_acks=False)
    assert (ack_api.action, ack_api.error_code) == (EpochAction.REJECT, ErrorCode.INVALID_SHARE_SESSION_EPOCH)


def test_without_a_session_only_opening_works() -> None:
    for epoch in (FINAL_EPOCH, 1, 7):
        d = session_epoch_rule(epoch, None, may_open=True, has_acks=True)
        assert (d.action, d.error_code) == (EpochAction.REJECT, ErrorCode.SHARE_SESSION_NOT_FOUND)


def test_epoch_wraps_to_one() -> None:
    assert next_epoch(MAX_EPOCH) == 1
    d = session_epoch_rule(MAX_EPOCH, MAX_EPOCH, may_open=False, has_acks=False)
    assert (d.action, d.next_expected) == (EpochAction.CONTINUE, 1)


@given(epochs, expected_epochs, st.booleans(), st.booleans())
def test_rule_invariants(epoch: int, expected: int | None, may_open: bool, has_acks: bool) -> None:
    d = session_epoch_rule(epoch, expected, may_open=may_open, has_acks=has_acks)
    assert (d.action is EpochAction.REJECT) == (d.error_code != ErrorCode.NONE)
    assert (d.next_expected is not None) == (d.action is EpochAction.CONTINUE)
    if d.action is EpochAction.CONTINUE:
        assert epoch == expected and d.next_expected == next_epoch(epoch) and d.next_expected != INITIAL_EPOCH
    if d.action is EpochAction.CLOSE:
        assert epoch == FINAL_EPOCH and expected is not None
    if d.action is EpochAction.OPEN:
        assert epoch == INITIAL_EPOCH and may_open and not has_acks


def test_cache_enter_advances_and_closes() -> None:
    cache = ShareSessionCache(max_sessions=2)
    decision, found = cache.enter("g", "m", 1, may_open=True)
    assert (decision.error_code, found) == (ErrorCode.SHARE_SESSION_NOT_FOUND, None)
    session, _ = cache.open("g", "m", connection=object())
    decision, found = cache.enter("g", "m", 1, may_open=True)
    assert (decision.action, found, session.expected_epoch) == (EpochAction.CONTINUE, session, 2)
    decision, _ = cache.enter("g", "m", 1, may_open=False)  # a replayed epoch is refused, nothing moves
    assert (decision.error_code, session.expected_epoch) == (ErrorCode.INVALID_SHARE_SESSION_EPOCH, 2)
    decision, found = cache.enter("g", "m", FINAL_EPOCH, may_open=False)
    assert (decision.action, found, session.expected_epoch) == (EpochAction.CLOSE, session, 2)
