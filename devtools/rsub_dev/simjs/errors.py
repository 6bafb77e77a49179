"""The errors the simulated JetStream raises: its own types, each a subclass of the nats-py
error that the same failure raises against a real server, so code that catches the real
ones (`APIError` and its `err_code`, `NotFoundError`, `KeyNotFoundError`,
`KeyWrongLastSequenceError`, `TimeoutError`, `nats.errors.Error`) catches these the same way,
and `SimJSError` tells them apart from real ones.

API errors carry the server's `code`, `err_code` and `description` (nats-server
`server/errors.json`, 2.15.1); `api_error` picks the class from the code as nats-py's
`APIError.from_error` does.
"""

from __future__ import annotations

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from sidecar.nats.port import NO_MESSAGE_FOUND, STREAM_NOT_FOUND

# `err_code`s of the server's replies (server/errors.json); the product's own constants
# (`sidecar.nats.jsapi`) are reused where it has them.
CLUSTER_NOT_AVAILABLE = 10008  # 503 "JetStream system temporarily unavailable"
CLUSTER_NOT_LEADER = 10009  # 500 "JetStream cluster can not handle request"
CONSUMER_NOT_FOUND = 10014  # 404
STREAM_NAME_EXISTS = 10058  # 400 "stream name already in use with a different configuration"
STREAM_NOT_MATCH = 10060  # 400 "expected stream does not match"
SUBJECT_OVERLAP = 10065  # 400 "subjects overlap with an existing stream"
WRONG_LAST_SEQUENCE = 10071  # 400 "wrong last sequence: {seq}"
CONSUMER_ALREADY_EXISTS = 10148  # 400 "consumer already exists"
INVALID_RESET = 10204  # 400 "invalid reset: {err}"


class SimJSError(Exception):
    """Raised by the simulated JetStream (every class below is one)."""


class SimTimeout(SimJSError, NatsTimeoutError):
    """The request got no reply in time (`nats: timeout`)."""


class SimNoResponders(SimJSError, NoRespondersError):
    """Nothing listens on the subject: a publish no stream stores."""


class SimAPIError(SimJSError, APIError):
    """An API error whose code has no class of its own."""


class SimBadRequest(SimJSError, BadRequestError):
    """A 400 reply."""


class SimNotFound(SimJSError, NotFoundError):
    """A 404 reply."""


class SimServerError(SimJSError, ServerError):
    """A 500 reply."""


class SimUnavailable(SimJSError, ServiceUnavailableError):
    """A 503 reply (no JetStream meta leader: `CLUSTER_NOT_AVAILABLE`), or the bare 503
    status a pull gets when no consumer listens (no codes then, as nats-py raises it)."""


class SimBucketNotFound(SimJSError, BucketNotFoundError):
    """A key-value bucket to bind to does not exist."""


class SimKeyNotFound(SimJSError, KeyNotFoundError):
    """A key-value get found no value: none, expired, or deleted (`op` "DEL" or "PURGE")."""


class SimKeyWrongLastSequence(SimJSError, KeyWrongLastSequenceError):
    """A key-value create or update expected another revision (`wrong last sequence: N`)."""


_BY_CODE: dict[int, type[SimJSError]] = {
    400: SimBadRequest,
    404: SimNotFound,
    500: SimServerError,
    503: SimUnavailable,
}


def api_error(code: int, err_code: int, description: str) -> SimJSError:
    """The error a reply `{"code", "err_code", "description"}` raises (not raised here)."""
    cls = _BY_CODE.get(code, SimAPIError)
    error = cls(code=code, err_code=err_code, description=description)  # type: ignore[call-arg]
    return error


def unavailable() -> SimJSError:
    return api_error(503, CLUSTER_NOT_AVAILABLE, "JetStream system temporarily unavailable")


def stream_not_found() -> SimJSError:
    return api_error(404, STREAM_NOT_FOUND, "stream not found")


def consumer_not_found() -> SimJSError:
    return api_error(404, CONSUMER_NOT_FOUND, "consumer not found")


def no_message_found() -> SimJSError:
    return api_error(404, NO_MESSAGE_FOUND, "no message found")


def wrong_last_sequence(last: int) -> SimJSError:
    return api_error(400, WRONG_LAST_SEQUENCE, f"wrong last sequence: {last}")
