"""Where every data message landed: per read stream, told by the simulated JetStream as its
links carry them (`SimJetStream.on_sourced`), so what limits and purges remove since is still
known. A data message is named by its origin region and its sequence in that region's write
stream (what `Nats-Stream-Source` says); a copy a read stream dropped as a duplicate of its
`Nats-Msg-Id` lands where the stored copy is."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

from rsub_dev.simjs import SimJetStream
from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.sourcing import Link
from rsub_dev.simjs.stream import PubAck
from sidecar.naming import VirtualStream
from sidecar.nats.topology import subject_within

DataId = tuple[str, int]
"""(origin region, sequence in its write stream)."""


@dataclass(slots=True)
class _Landed:
    """The data messages of one origin in one read stream, in origin order."""

    origin_seqs: list[int] = field(default_factory=list)
    read_seqs: list[int] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)
    """(origin seq, the read seq of the stored copy it was dropped for)."""


class Ledger:
    def __init__(self, vs: VirtualStream, js: SimJetStream) -> None:
        self._vs = vs
        self._js = js
        self._origins = {vs.write_stream(r): r for r in vs.regions}
        self._regions = {vs.read_stream(r): r for r in vs.regions}
        self.at: dict[str, dict[DataId, int]] = defaultdict(dict)
        """Per region, where each data message lies in its read stream (a duplicate: at the
        stored copy)."""
        self.stored: dict[str, list[tuple[int, DataId]]] = defaultdict(list)
        """Per region, the data messages its read stream stored, in order."""
        self._landed: dict[tuple[str, str], _Landed] = defaultdict(_Landed)
        self._prefix: dict[tuple[str, str], list[int]] = {}
        js.on_sourced = self._sourced

    def _sourced(self, link: Link, msg: StoredMessage, ack: PubAck) -> None:
        origin, region = self._origins.get(link.origin), self._regions.get(link.target)
        if origin is None or region is None:
            return
        if not subject_within(msg.subject, self._vs.data_subject(origin)):
            return
        data = (origin, msg.seq)
        self.at[region][data] = ack.seq
        landed = self._landed[(origin, region)]
        if ack.duplicate:
            landed.dropped.append((msg.seq, ack.seq))
            return
        landed.origin_seqs.append(msg.seq)
        landed.read_seqs.append(ack.seq)
        self.stored[region].append((ack.seq, data))

    def reach(self, x: str, a: str, p: int) -> int | None:
        """The highest position in a's read stream of the data messages at or below `p` in
        x's (0: none); None when one of them has not reached a's yet."""
        prefix = self._prefix.setdefault((x, a), [])
        stored, at = self.stored[x], self.at[a]
        while len(prefix) < len(stored) and stored[len(prefix)][0] <= p:
            data = stored[len(prefix)][1]
            where = at.get(data)
            if where is None:
                if not self.never_reaches(a, data):
                    return None
                where = 0  # its write stream removed it first: the claim is over what reaches
            prefix.append(max(prefix[-1] if prefix else 0, where))
        k = bisect_right(stored, p, hi=len(prefix), key=lambda e: e[0])
        return prefix[k - 1] if k else 0

    def never_reaches(self, region: str, data: DataId) -> bool:
        """Whether `data` will never reach `region`'s read stream: not there, and its write
        stream removed it (or the link passed it without carrying it)."""
        origin, seq = data
        if data in self.at[region]:
            return False
        link = self._js.link(self._vs.read_stream(region), self._vs.write_stream(origin))
        return link.taken >= seq or self._js.stream(self._vs.write_stream(origin)).first_seq > seq

    def removed_between(self, region: str, after: int, last: int, first_seq: int) -> bool:
        """Whether `region`'s read stream stored data in (after, last] that is gone now (below
        its `first_seq`)."""
        stored = self.stored[region]
        k = bisect_right(stored, after, key=lambda e: e[0])
        return k < len(stored) and stored[k][0] <= last and stored[k][0] < first_seq

    def data_at(self, region: str, read_seq: int) -> DataId | None:
        """The data message `region`'s read stream stored at `read_seq` (None: none)."""
        stored = self.stored[region]
        k = bisect_right(stored, read_seq, key=lambda e: e[0]) - 1
        return stored[k][1] if k >= 0 and stored[k][0] == read_seq else None

    def stored_at(self, region: str, data: DataId) -> int | None:
        """Where `region`'s read stream stored `data` itself (None: not stored, or dropped
        as a duplicate of a copy stored elsewhere in it)."""
        landed = self._landed[(data[0], region)]
        k = bisect_right(landed.origin_seqs, data[1]) - 1
        return landed.read_seqs[k] if k >= 0 and landed.origin_seqs[k] == data[1] else None

    def next_landed(self, region: str, origin: str, origin_seq: int) -> int | None:
        """Where `region`'s read stream stored the first data message of `origin` above
        `origin_seq` (None: none yet)."""
        landed = self._landed[(origin, region)]
        k = bisect_right(landed.origin_seqs, origin_seq)
        return landed.read_seqs[k] if k < len(landed.read_seqs) else None

    def next_data(self, region: str, origin: str, position: int) -> int:
        """The origin sequence of the first data message of `origin` that `region`'s read
        stream holds above `position` or may still receive; past every one written when
        there is none."""
        landed = self._landed[(origin, region)]
        k = bisect_right(landed.read_seqs, position)
        if k < len(landed.read_seqs):
            return landed.origin_seqs[k]
        link = self._js.link(self._vs.read_stream(region), self._vs.write_stream(origin))
        write = self._js.stream(self._vs.write_stream(origin))
        after = next(write.matching(link.taken + 1, (self._vs.data_subject(origin),)), None)
        return write.last_seq + 1 if after is None else after.seq

    def dropped_above(self, region: str, origin: str, origin_seq: int, position: int) -> int | None:
        """A copy of `origin`'s data at or below `origin_seq` that `region`'s read stream
        dropped as a duplicate of one stored above `position`: where that one lies."""
        for seq, stored_at in self._landed[(origin, region)].dropped:
            if seq <= origin_seq and stored_at > position:
                return stored_at
        return None
