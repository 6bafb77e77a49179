"""A key-value bucket, built as the server builds one: a stream `KV_<bucket>` on
`$KV.<bucket>.>` keeping one message per key (history 1), messages removed `ttl_ms` after
they were written (the stream's `max_age`), revisions the stream's sequences (shared by all
keys of the bucket, never reused). A delete writes a `KV-Operation: DEL` marker (a purge a
`PURGE` one), which is the key's last revision until it expires in turn.

The calls behave as nats-py's `KeyValue` against nats-server 2.15.1: `get` of a key with no
value (never written, expired, deleted) raises `SimKeyNotFound` (with `op` for a marker);
`create` fails with `SimKeyWrongLastSequence` unless the key has no value; `update` fails
with it unless `last` is the key's last revision (0: none, so an expired key can be updated
from 0); `delete(last=...)` fails with a 400 `wrong last sequence` (nats-py's
`BadRequestError`, not the key-value error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from nats.js.api import Header
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from rsub_dev.simjs.errors import (
    WRONG_LAST_SEQUENCE,
    SimBadRequest,
    SimJSError,
    SimKeyNotFound,
    SimKeyWrongLastSequence,
)
from rsub_dev.simjs.faults import Op
from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.stream import Stream, StreamConfig

T = TypeVar("T")


class Host(Protocol):
    """What a bucket needs of the JetStream holding it (`SimJetStream`): its stream, the
    time, and every operation run as one, with its faults."""

    @property
    def now_ms(self) -> int: ...

    def _stream(self, name: str) -> Stream: ...

    def _call(
        self,
        op: Op,
        target: str,
        action: Callable[[], T],
        missing: Callable[[], SimJSError] = ...,
        cluster: str | None = None,
    ) -> T: ...


Operation = Literal["PUT", "DEL", "PURGE"]


def bucket_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def bucket_config(bucket: str, ttl_ms: int = 0, placement: str | None = None) -> StreamConfig:
    return StreamConfig(
        bucket_stream(bucket),
        subjects=(f"$KV.{bucket}.>",),
        max_msgs_per_subject=1,
        max_age_ms=ttl_ms,
        placement=placement,
    )


@dataclass(frozen=True, slots=True)
class KVEntry:
    bucket: str
    key: str
    value: bytes
    revision: int
    operation: Operation = "PUT"


class KeyValue:
    def __init__(self, js: Host, bucket: str) -> None:
        self._js = js
        self.bucket = bucket
        self._stream = bucket_stream(bucket)

    def _subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"

    def _entry(self, key: str, msg: StoredMessage) -> KVEntry:
        op: Operation = "PUT"
        if msg.headers.get(KV_OP) in (KV_DEL, KV_PURGE):
            op = "DEL" if msg.headers[KV_OP] == KV_DEL else "PURGE"
        return KVEntry(self.bucket, key, msg.data, msg.seq, op)

    def _last(self, key: str) -> KVEntry | None:
        msg = self._js._stream(self._stream).last_of(self._subject(key))
        return self._entry(key, msg) if msg is not None else None

    def _write(self, key: str, value: bytes, headers: dict[str, str]) -> int:
        stream = self._js._stream(self._stream)
        return stream.store(self._subject(key), value, headers, self._js.now_ms).seq

    def get(self, key: str) -> KVEntry:
        def get() -> KVEntry:
            entry = self._last(key)
            if entry is None:
                raise SimKeyNotFound()
            if entry.operation != "PUT":
                raise SimKeyNotFound(entry=entry, op=entry.operation)
            return entry

        return self._js._call(Op.KV_GET, self._stream, get, missing=SimKeyNotFound)

    def put(self, key: str, value: bytes) -> int:
        """Write `value`; its revision."""
        return self._js._call(Op.KV_PUT, self._stream, lambda: self._write(key, value, {}))

    def create(self, key: str, value: bytes) -> int:
        """Write `value` if `key` has none (never written, expired, deleted or purged)."""

        def create() -> int:
            last = self._last(key)
            if last is not None and last.operation == "PUT":
                raise SimKeyWrongLastSequence(f"wrong last sequence: {last.revision}")
            expected = str(last.revision) if last is not None else "0"
            return self._write(key, value, {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: expected})

        return self._js._call(Op.KV_CREATE, self._stream, create)

    def update(self, key: str, value: bytes, last: int) -> int:
        """Write `value` if `last` is the key's last revision (0: it has none)."""

        def update() -> int:
            headers = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(last)}
            try:
                return self._write(key, value, headers)
            except SimBadRequest as err:
                if err.err_code != WRONG_LAST_SEQUENCE:
                    raise
                raise SimKeyWrongLastSequence(err.description) from err

        return self._js._call(Op.KV_UPDATE, self._stream, update)

    def delete(self, key: str, last: int | None = None) -> int:
        """Write a delete marker (if `last` is given, only over that revision)."""
        headers = {KV_OP: KV_DEL}
        if last is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(last)
        return self._js._call(Op.KV_DELETE, self._stream, lambda: self._write(key, b"", headers))

    def purge(self, key: str) -> int:
        """Write a purge marker (history 1: the same as a delete marker, but `PURGE`)."""
        headers = {KV_OP: KV_PURGE, Header.ROLLUP.value: "sub"}
        return self._js._call(Op.KV_PURGE, self._stream, lambda: self._write(key, b"", headers))
