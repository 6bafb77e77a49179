"""External cursors (committed through the API, e.g. by the Spark source), kept in NATS.

All cursors of one virtual stream live in ONE key `cursors.<stream>` of the region's KV
bucket (the lease's bucket, placed in the region), as JSON `{subscription: sequence}`. So
they survive sidecar restarts, one `get` reads them all (cheap enough for every interval,
and it works while the region is cut off), and a move is one compare-and-set. Moves are
forward only; concurrent writers retry on the revision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

log = structlog.get_logger(__name__)

_CAS_ATTEMPTS = 20


class CursorStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @staticmethod
    def key(stream: str) -> str:
        return f"cursors.{stream}"

    async def load(self, stream: str) -> dict[str, int]:
        """Every external cursor of `stream` (empty when none was committed yet)."""
        return (await self._read(stream))[0]

    async def advance(self, stream: str, subscription: str, sequence: int) -> int:
        """Move `subscription`'s cursor forward to `sequence` (creating it); return the result."""
        for _ in range(_CAS_ATTEMPTS):
            cursors, revision = await self._read(stream)
            current = cursors.get(subscription)
            if current is not None and current >= sequence:
                return current
            cursors[subscription] = sequence
            try:
                await self._write(stream, cursors, revision)
            except KeyWrongLastSequenceError:
                continue  # another writer was faster: read again
            return sequence
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
