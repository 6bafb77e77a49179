"""`JetStreamPort`: the one typed way the sidecar's runtime reaches JetStream in its region.

Every operation the runtime (and the modules of `sidecar.nats` it uses) really asks of NATS
is here, and nothing else: publish a marker, read a stream (what is stored, or live), read
a stream's state and stored messages, list, create and update streams (the bring-up's
topology and KV bucket, discovery), list, read, create, reset and pause consumers, a
key-value bucket's operations (cursors and leases), and the core-NATS signals (acks and
consumer advisories). `NatsPort` (`sidecar.nats.nats_port`) is the real one, over nats-py
(the connection's client), every JetStream API request through one request path
(`sidecar.nats.jsapi`); the deterministic simulation has its own over a simulated JetStream
(developer tools, never imported here).

Replies of the JetStream API are the server's JSON (`ApiJson`): the modules that read them
(`consumers`, `effective`) parse exactly what the server sends, and a simulated port must
answer in the same shape (its conformance test compares them with a real server's). An
error reply raises the matching `nats.js.errors.APIError`; no reply in time raises
`TimeoutError`; a missing consumer or stream raises what the server answers for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

ApiJson = dict[str, Any]
"""A JetStream API reply, as the server sends it (`STREAM.INFO`, `CONSUMER.INFO`, ...)."""

# `err_code` of an `APIError` about a stream that does not exist.
STREAM_NOT_FOUND = 10059
# `err_code` of a `STREAM.MSG.GET` that matched no message.
NO_MESSAGE_FOUND = 10037

# The reading task's `count` (`counting_creations_asked_again`); None: nobody counts.
_asked_again: ContextVar[Callable[[], None] | None] = ContextVar("asked_again", default=None)


@contextlib.contextmanager
def counting_creations_asked_again(count: Callable[[], None]) -> Iterator[None]:
    """Within it (in the calling task), `count` is called each time a read of the port
    (`JetStreamPort.read`) asks again for its consumer's creation, which the server left
    unanswered. Set per task rather than passed to `read`: the reads go through the marker
    and origin logs, which have no use for it."""
    token = _asked_again.set(count)
    try:
        yield
    finally:
        _asked_again.reset(token)


def creation_asked_again() -> None:
    """Called by a read asking again for its consumer's creation: counted by the reading
    task's `count`, if it set one."""
    count = _asked_again.get()
    if count is not None:
        count()


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message of a stream as read: its sequence there, subject, payload (empty when read
    headers only) and headers."""

    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Published:
    """JetStream's acknowledgement of a publish: where it was stored, or that its message id
    was a duplicate within the stream's window (stored once, earlier)."""

    seq: int
    duplicate: bool


class KeyEntry(Protocol):
    """A key as read: its revision and value."""

    @property
    def revision(self) -> int | None: ...
    @property
    def value(self) -> bytes | None: ...


class KeyValueBucket(Protocol):
    """The operations on one key-value bucket (history 1): a missing key raises
    `KeyNotFoundError`, a write over another revision than `last` (or a create over an
    existing key) `KeyWrongLastSequenceError`."""

    async def get(self, key: str) -> KeyEntry: ...
    async def put(self, key: str, value: bytes) -> int: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int) -> int: ...
    async def delete(self, key: str, last: int | None = None) -> object: ...


class Listener(Protocol):
    """A core-NATS subscription the port keeps across reconnects; `stop` ends it."""

    async def stop(self) -> None: ...


class JetStreamPort(Protocol):
    # ---- streams ------------------------------------------------------------------------

    async def stream_info(
        self, stream: str, *, subjects_filter: str | None = None, timeout_s: float
    ) -> ApiJson:
        """`STREAM.INFO`: configuration and state (`state.last_seq`, ...); with
        `subjects_filter`, `state.subjects` counts the messages of each subject matching it."""
        ...

    async def stream_names(self, *, subject: str | None = None, timeout_s: float) -> list[str]:
        """`STREAM.NAMES`, every page: the account's streams (with `subject`: those whose
        subjects overlap it)."""
        ...

    async def stream_create(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        """`STREAM.CREATE` of `config` (the server's JSON; again with the same configuration
        changes nothing; with another, `stream name already in use`)."""
        ...

    async def stream_update(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        """`STREAM.UPDATE` to `config`, a whole configuration (the server's JSON)."""
        ...

    async def stream_purge(self, stream: str, subject: str, *, timeout_s: float) -> ApiJson:
        """`STREAM.PURGE` of every message on `subject` (a filter)."""
        ...

    async def msg_get(
        self, stream: str, seq: int, *, next_by_subj: str | None = None, timeout_s: float
    ) -> ApiJson | None:
        """`STREAM.MSG.GET` from the stream leader: the message at `seq` (with
        `next_by_subj`: the first at or after `seq` on that subject), None when none."""
        ...

    async def publish(self, stream: str, subject: str, data: bytes, msg_id: str) -> Published:
        """Store `data` on `subject` in `stream` (`Nats-Expected-Stream`), with `msg_id`
        (`Nats-Msg-Id`); acknowledged, or `TimeoutError`, `NoRespondersError` (no stream
        takes `subject`), the matching `APIError`."""
        ...

    def read(
        self,
        stream: str,
        filter_subject: str,
        start_seq: int,
        *,
        live: bool,
        headers_only: bool = False,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[StoredMessage, None]:
        """The messages on `filter_subject` of `stream` from `start_seq` on, in stream order:
        those stored when it is called (`live=False`), or those and every one after, until
        the read loses its place or the connection closes (`live=True`: start again from
        the last sequence taken + 1). A live read calls `opened` once the server took it
        (its consumer created), before any message: from then on it follows the stream. A
        consumer creation the server leaves unanswered is asked again (under the same name:
        never a second consumer) a few times before the read fails, each one reported by
        `creation_asked_again`."""
        ...

    # ---- consumers ----------------------------------------------------------------------

    async def consumer_list(self, stream: str, offset: int, *, timeout_s: float) -> ApiJson:
        """One page of `CONSUMER.LIST` from `offset` (`consumers`, `missing`, `total`)."""
        ...

    async def consumer_info(self, stream: str, name: str, *, timeout_s: float) -> ApiJson:
        """`CONSUMER.INFO`."""
        ...

    async def consumer_create(
        self, stream: str, name: str, config: Mapping[str, Any], action: str, *, timeout_s: float
    ) -> ApiJson:
        """`CONSUMER.CREATE` with `action` `create` (fails if it exists) or `update`."""
        ...

    async def consumer_reset(
        self, stream: str, name: str, seq: int, *, timeout_s: float
    ) -> ApiJson:
        """`CONSUMER.RESET` (server 2.14+): deliver from `seq` on, as if all before it were
        acked."""
        ...

    async def consumer_pause(
        self, stream: str, name: str, seconds: float | None, *, timeout_s: float
    ) -> ApiJson:
        """`CONSUMER.PAUSE` for `seconds` from now (by the port's clock), or resume (None)."""
        ...

    # ---- key-value and signals ----------------------------------------------------------

    async def key_value(self, bucket: str) -> KeyValueBucket:
        """Bind to an existing bucket."""
        ...

    async def listen(self, subject: str, heard: Callable[[str, bytes], None]) -> Listener:
        """Call `heard` with the subject and payload of every message on `subject` (core
        NATS: best effort)."""
        ...
