"""External cursors (committed through the API, e.g. by the Spark source), kept in NATS.

All cursors of one virtual stream live in ONE key `cursors.<stream>` of the region's KV
bucket (the lease's bucket, placed in the region), as JSON `{subscription: sequence}`. So
they survive sidecar restarts, one `get` reads them all (cheap enough for every interval,
and it works while the region is cut off), and a move is one compare-and-set. Moves are
forward only; concurrent writers retry on the revision. The one exception is `reset`, an
operator's repair of a cursor committed wrong (`AdminService.ResetCursor`): it sets an
existing cursor to any value, backwards too. `cursor_commits()` follows the writes of every
replica (the signal to read a stream's cursors again).

A stored cursor is a floor whose reader delivers the data messages (`vs.data_filter()`): its
mark-delete position handed to the protocol is its effective position
(`sidecar.nats.effective`), so a cursor that only markers follow (e.g. a finished Spark job
whose cursor stands at the last data message, before snapshot markers) has consumed
everything and stands at the read stream's last sequence, as a durable with nothing pending.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping

import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from sidecar.nats.port import JetStreamPort, KeyValueBucket

log = structlog.get_logger(__name__)

_KEY_PREFIX = "cursors."
_CAS_ATTEMPTS = 20
_DEFAULT_TIMEOUT_S = 5.0


class CursorStore:
    def __init__(self, kv: KeyValueBucket) -> None:
        self._kv = kv

    @staticmethod
    def key(stream: str) -> str:
        return f"{_KEY_PREFIX}{stream}"

    async def load(self, stream: str) -> dict[str, int]:
        """Every external cursor of `stream` (empty when none was committed yet)."""
        return (await self._read(stream))[0]

    async def advance(self, stream: str, subscription: str, sequence: int) -> int:
        """Move `subscription`'s cursor forward to `sequence` (creating it); return the result."""
        before, _ = await self._set_if(
            stream, subscription, sequence, lambda current: current is None or current < sequence
        )
        return max(before or 0, sequence)

    async def reset(self, stream: str, subscription: str, sequence: int) -> int | None:
        """Set `subscription`'s existing cursor to `sequence`, backwards too; return its value
        before (None, changing nothing, when it does not exist)."""
        before, _ = await self._set_if(
            stream, subscription, sequence, lambda current: current is not None
        )
        return before

    async def _set_if(
        self,
        stream: str,
        subscription: str,
        sequence: int,
        condition: Callable[[int | None], bool],
    ) -> tuple[int | None, bool]:
        """Set the cursor to `sequence` if `condition(its value now)` (None: absent), with
        compare-and-set, reading again after a conflicting write; (its value before, whether
        it was written)."""
        for _ in range(_CAS_ATTEMPTS):
            cursors, revision = await self._read(stream)
            before = cursors.get(subscription)
            if not condition(before):
                return before, False
            cursors[subscription] = sequence
            try:
                await self._write(stream, cursors, revision)
            except KeyWrongLastSequenceError:
                continue  # another writer was faster: read again
            return before, True
        raise RuntimeError(
            f"cursor {stream}/{subscription}: gave up after {_CAS_ATTEMPTS} conflicting writes"
        )

    async def _read(self, stream: str) -> tuple[dict[str, int], int]:
        try:
            entry = await self._kv.get(self.key(stream))
        except KeyNotFoundError:
            return {}, 0
        return _parse(stream, entry.value), entry.revision or 0

    async def _write(self, stream: str, cursors: Mapping[str, int], revision: int) -> None:
        value = json.dumps(dict(sorted(cursors.items()))).encode()
        if revision == 0:
            await self._kv.create(self.key(stream), value)
        else:
            await self._kv.update(self.key(stream), value, last=revision)


def _parse(stream: str, value: bytes | None) -> dict[str, int]:
    try:
        data = json.loads(value or b"{}")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.error("cursors_unreadable", stream=stream)
        return {}
    cursors: dict[str, int] = {}
    for name, seq in data.items():
        if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0:
            cursors[str(name)] = seq
        else:
            log.error("cursor_unreadable", stream=stream, subscription=name, value=repr(seq))
    return cursors


async def cursor_commits(port: JetStreamPort, bucket: str) -> AsyncGenerator[str, None]:
    """The virtual stream of every cursor key written to `bucket` (the KV bucket's stream,
    read live, headers only), first those stored now, then each write as it comes; forever
    (until the connection closes: start again then)."""
    prefix = f"$KV.{bucket}.{_KEY_PREFIX}"
    tail = port.read(f"KV_{bucket}", f"{prefix}>", 1, live=True, headers_only=True)
    async with contextlib.aclosing(tail):
        async for msg in tail:
            yield msg.subject[len(prefix) :]
