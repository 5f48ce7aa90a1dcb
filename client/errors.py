"""Client-side exceptions: a Kafka error code with its name, plus the failures that have no wire code."""

from __future__ import annotations

from shoal.protocol.errors import ErrorCode

# Codes the broker's enum does not list but a client can still receive from some broker.
_EXTRA_NAMES: dict[int, str] = {
    8: "BROKER_NOT_AVAILABLE",
    9: "REPLICA_NOT_AVAILABLE",
    13: "NETWORK_EXCEPTION",
    19: "NOT_ENOUGH_REPLICAS",
    20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    60: "REASSIGNMENT_IN_PROGRESS",
    89: "THROTTLING_QUOTA_EXCEEDED",
}

# Error codes Kafka marks retriable (their exception classes extend RetriableException).
RETRIABLE_CODES: frozenset[int] = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        13,  # NETWORK_EXCEPTION
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NOT_COORDINATOR,
        19,
        20,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.SHARE_SESSION_NOT_FOUND,
        ErrorCode.INVALID_SHARE_SESSION_EPOCH,
        ErrorCode.SHARE_SESSION_LIMIT_REACHED,
        89,
    }
)


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return _EXTRA_NAMES.get(code, f"ERROR_{code}")


class KafkaError(Exception):
    """A failure reported by a broker (or raised by the client in its stead), named by its Kafka error code."""

    default_code: int = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, code: int | None = None, message: str | None = None):
        self.code = int(self.default_code if code is None else code)
        self.name = error_name(self.code)
        self.message = message
        super().__init__(f"{self.name} ({self.code})" + (f": {message}" if message else ""))

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE_CODES

    def __eq__(self, other: object) -> bool:
        # Results dicts compare errors by what went wrong, not by object identity.
        if not isinstance(other, KafkaError):
            return NotImplemented
        return type(self) is type(other) and self.code == other.code and self.message == other.message

    def __hash__(self) -> int:
        return hash((type(self), self.code))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.code, self.message))


class KafkaConnectionError(KafkaError):
    """The TCP/TLS connection could not be opened or was lost; the request may or may not have been applied."""

    default_code = 13  # NETWORK_EXCEPTION

    @property
    def retriable(self) -> bool:
        return True


class KafkaTimeoutError(KafkaError):
    """No answer within the client's timeout."""

    default_code = ErrorCode.REQUEST_TIMED_OUT

    @property
    def retriable(self) -> bool:
        return True


class UnsupportedVersionError(KafkaError):
    """The broker does not serve any version of an API this client can speak."""

    default_code = ErrorCode.UNSUPPORTED_VERSION


class AuthenticationError(KafkaError):
    """SASL or TLS authentication was refused."""

    default_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class NotCoordinatorError(KafkaError):
    default_code = ErrorCode.NOT_COORDINATOR


class UnknownTopicError(KafkaError):
    default_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class IllegalStateError(KafkaError):
    """The caller used the client in a way its state does not allow (e.g. polling with unacknowledged records)."""

    default_code = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str):
        super().__init__(None, message)
        self.name = "ILLEGAL_STATE"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


class ClientClosedError(IllegalStateError):
    """A method was called after close()."""

    def __init__(self, message: str = "the client is closed"):
        super().__init__(message)


_BY_CODE: dict[int, type[KafkaError]] = {
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersionError,
    ErrorCode.SASL_AUTHENTICATION_FAILED: AuthenticationError,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: AuthenticationError,
    ErrorCode.ILLEGAL_SASL_STATE: AuthenticationError,
    ErrorCode.NOT_COORDINATOR: NotCoordinatorError,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicError,
    ErrorCode.UNKNOWN_TOPIC_ID: UnknownTopicError,
}


def for_code(code: int, message: str | None = None) -> KafkaError:
    """The most specific exception for a wire error code."""
    return _BY_CODE.get(code, KafkaError)(code, message)


def check(code: int, message: str | None = None) -> None:
    """Raise for a non-zero error code."""
    if code:
        raise for_code(code, message)
