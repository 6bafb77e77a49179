"""Effective positions: where a reader stands, extended over what it never delivers.

A durable's ack floor and an external cursor stand at the last message their reader
consumed. The messages right after it that the reader never delivers (markers, subjects
outside its filters) are nothing it still has to consume, so its *effective* position, the
mark-delete `M` handed to the protocol (DESIGN §2), is the floor extended over them: up to
just before the first message it does deliver, never beyond the read stream's last sequence
read *before* the scan. Without it a durable in use (something pending) stood below the
markers after its last message at every read, and each update whose position reached over
them (its own progress echoed back by another region) asked to move it again, for nothing;
a finished Spark job's cursor never reached the stream's end.

- `filters_of(config)`: the subjects a consumer delivers, from its configuration;
- `first_delivered(...)`: the first message at or after a sequence that a reader with these
  filters delivers (one leader `STREAM.MSG.GET` with `next_by_subj` per filter subject);
- `EffectivePositions`: the effective positions of the readers of one stream, read again
  and again: each floor costs one `first_delivered` once, plus one per read only while new
  messages arrive after it (and none for a reader of every message: nothing to skip).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.nats.port import JetStreamPort

_DEFAULT_TIMEOUT_S = 5.0
_EVERY_MESSAGE = ">"


@dataclass(frozen=True)
class Floor:
    """Where a reader stands: everything it delivers up to `seq` is consumed."""

    seq: int
    filters: tuple[str, ...]
    """The subjects it delivers; empty: every message (markers too)."""


def filters_of(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The filter subjects of a consumer configuration (JSON form); empty when it has none."""
    single = config.get("filter_subject")
    return tuple(str(s) for s in config.get("filter_subjects") or ([single] if single else []))


async def first_delivered(
    port: JetStreamPort, stream: str, seq: int, filters: tuple[str, ...], *, timeout_s: float
) -> int | None:
    """The sequence of the first message at or after `seq` that a reader with `filters`
    delivers (any message when `filters` is empty), None when there is none.

    Asked of the stream leader (`STREAM.MSG.GET`), not with a direct get: a lagging replica
    answering "none" would claim messages the reader has not consumed.
    """
    found = [
        int(msg["seq"])
        for subject in filters or (_EVERY_MESSAGE,)
        if (msg := await port.msg_get(stream, seq, next_by_subj=subject, timeout_s=timeout_s))
        is not None
    ]
    return min(found, default=None)


@dataclass
class _Scan:
    floor: Floor  # the floor this scan belongs to
    clear_to: int  # no message its reader delivers lies in (floor.seq, clear_to]
    done: bool  # one it delivers lies at clear_to + 1 (or it delivers all): nothing to learn


class EffectivePositions:
    """Effective positions of the readers of one read stream (see the module docstring).

    Per reader it remembers how far past its floor the stream holds no message it delivers,
    so a floor is scanned once, and again only while new messages arrive after it.
    """

    def __init__(self, stream: str, *, timeout_s: float = _DEFAULT_TIMEOUT_S) -> None:
        self._stream = stream
        self._timeout = timeout_s
        self._scans: dict[str, _Scan] = {}

    async def read(
        self, port: JetStreamPort, floors: Mapping[str, Floor], last_seq: int, first_seq: int = 0
    ) -> dict[str, int]:
        """The effective position of every reader; `last_seq` MUST be read before this call.
        With `first_seq` (the stream's first sequence, read before too; 0: not given), a
        reader whose next message was removed since (limits, a purge) stands over the gap:
        it can never deliver a message below `first_seq`, so the scan goes on from there.

        Safety: `last_seq` was read first, so every message at or below it was stored before
        the scan looks; a scan finding none its reader delivers in (floor, last_seq]
        therefore skips nothing the reader would deliver, and messages stored later have
        sequences above `last_seq`, which is never claimed. What a scan learnt stays true: a
        stream only grows at its end (removing messages never adds one a reader delivers).
        So the position claims what the floor claims (everything the reader delivers up to
        it consumed) plus only messages the reader never delivers.
        """
        for gone in self._scans.keys() - floors.keys():
            del self._scans[gone]
        positions: dict[str, int] = {}
        for name, floor in floors.items():
            scan = self._scans.get(name)
            if scan is None or scan.floor != floor:
                # A reader of every message delivers the one right after its floor.
                scan = self._scans[name] = _Scan(floor, floor.seq, done=not floor.filters)
            if scan.clear_to + 1 < min(first_seq, last_seq + 1):
                # The message it was to deliver next is gone: a paused or idle durable's floor
                # stays put, and without this its position would stay below the removed ones
                # (shell simulation, `make soak` seed 559096701612: a returned region's
                # hold waited for a position only removals could give).
                scan.clear_to, scan.done = first_seq - 1, False
            if not scan.done and scan.clear_to < last_seq:
                found = await first_delivered(
                    port, self._stream, scan.clear_to + 1, floor.filters, timeout_s=self._timeout
                )
                scan.done = found is not None
                scan.clear_to = last_seq if found is None else found - 1
            positions[name] = self.known(name, floor, last_seq)
        return positions

    def known(self, name: str, floor: Floor, last_seq: int) -> int:
        """The effective position from what earlier scans learnt (no I/O; else `floor.seq`)."""
        scan = self._scans.get(name)
        if scan is None or scan.floor != floor:
            return floor.seq
        return max(floor.seq, min(scan.clear_to, last_seq))
