"""Errors of the backend contract: the runtime raises them, the API understands them (request
validation raises `InvalidArgument` too).

Each error maps to exactly one gRPC status code (`sidecar.api.grpc_server.status_of`); the
runtime raises these and never imports grpc. The servers' own `ListenError` is the API's
(`sidecar.api.errors`).
"""

from __future__ import annotations


class ApiError(Exception):
    """Base class: `message` is shown to the client as the status detail."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ApiError):
    """A request field is missing or malformed (INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(ApiError):
    """The stream, subscription or snapshot does not exist here (NOT_FOUND)."""


class NotLeader(ApiError):
    """A write only the leader can make reached a follower (FAILED_PRECONDITION): asking
    this replica again cannot succeed, so clients must not retry it."""

    def __init__(self, message: str = "this sidecar is not the leader of its region") -> None:
        super().__init__(message)


class FailedPrecondition(ApiError):
    """The request makes no sense in the current state, e.g. nothing to snapshot
    (FAILED_PRECONDITION)."""


class Unavailable(ApiError):
    """The sidecar cannot serve the request right now, e.g. NATS is down (UNAVAILABLE)."""
