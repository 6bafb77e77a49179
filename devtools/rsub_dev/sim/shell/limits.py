"""What real servers, operators and producers do to the data besides the applications, in the
runtime's world, and why passing a message never consumed may then not be a loss.

- Limits by age and count on write and read streams (`stream_limits`), markers counted; and
  operators purging a stream (`Removals.purge`): all of it, or all but its last messages.
  Simjs removes the messages and moves the consumers as the server does (docs/simulation.md):
  a purge moves every consumer of the stream over what it removed, idle ones too, a limit
  acks what it removes from a consumer's pending ones.
- Twins: a producer publishes a message again in another region with the same
  `Nats-Msg-Id`; every read stream stores the first copy to arrive within its
  de-duplication window (both once it expired), and read streams may store different copies.

The guarantee is over logical messages (a `Nats-Msg-Id`: consuming one copy consumes its
twin, docs/protocol.md §6, case 2) that reach the read streams (`Excuses.why`, the
deleted protocol world's excuses): passing a logical message never consumed is excused when a copy of it was removed
from a read stream where the durable has been (removal under a consumer counts as passed
there, what vectors then carry elsewhere; by a purge it is counted apart), or a copy never
reached a read stream (its write stream removed it first) and the durable passed that gap
there.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.ledger import DataId, Ledger
from rsub_dev.sim.shell.params import ShellParams
from rsub_dev.simjs import SimJetStream
from sidecar.naming import VirtualStream


def stream_limits(p: ShellParams, *, read: bool) -> dict[str, Any]:
    """The limits of a read or write stream as `StreamConfig` fields."""
    if read:
        return {"max_age_ms": p.read_max_age_ms, "max_msgs": p.read_max_msgs}
    return {"max_age_ms": p.write_max_age_ms, "max_msgs": p.write_max_msgs}


class Removals:
    """The purges the world's operators made, and what they removed, per stream."""

    def __init__(self, vs: VirtualStream, js: SimJetStream) -> None:
        self._vs = vs
        self._js = js
        self.purged: dict[str, list[tuple[int, int]]] = defaultdict(list)
        """Per read stream's region: the ranges of sequences [from, to) a purge removed."""

    def purge(self, stream: str, keep: int | None) -> tuple[int, int]:
        """Purge `stream` (all, or all but its last `keep` messages), its faults suspended;
        the sequences it removed, [from, to)."""
        js = self._js
        js.settle()
        before = js.stream(stream).first_seq
        with js.faults.suspended():
            js.stream_purge(stream, keep)
        after = js.stream(stream).first_seq
        for region in self._vs.regions:
            if stream == self._vs.read_stream(region) and after > before:
                self.purged[region].append((before, after))
        return before, after

    def purge_some(self, world: LoopWorld[ShellParams], live: list[str]) -> None:
        """An operator purges the read or write stream of a live region: all of it in a
        third of the purges, else all but its last 1 to 50 messages."""
        rng, vs = world.rng, self._vs
        region = rng.choice(live)
        stream = rng.choice([vs.read_stream(region), vs.write_stream(region)])
        keep = None if rng.random() < 1 / 3 else rng.randint(1, 50)
        start, end = self.purge(stream, keep)
        world.stats["purges"] += 1
        world.note(f"operator purges {stream} (keep {keep}): {start}..{end - 1} removed")

    def by_purge(self, region: str, seq: int) -> bool:
        """Whether a purge removed `seq` from `region`'s read stream."""
        return any(start <= seq < end for start, end in self.purged[region])


class Excuses:
    """Why passing a data message never consumed is not a loss (`why`; None: it is)."""

    def __init__(
        self,
        vs: VirtualStream,
        js: SimJetStream,
        ledger: Ledger,
        consumed: Counter[DataId],
        removals: Removals,
        twins: dict[DataId, DataId],
    ) -> None:
        """For one durable: what its application `consumed`; `twins` (every durable's):
        each copy of a message published twice with one `Nats-Msg-Id`, the other."""
        self._vs = vs
        self._js = js
        self._ledger = ledger
        self._consumed = consumed
        self.removals = removals
        self.twins = twins
        self.high: dict[str, int] = {}
        """Per region, the furthest the durable's copy there ever stood (`passed`)."""
        self.stats: Counter[str] = Counter()

    def copies(self, data: DataId) -> tuple[DataId, ...]:
        """The copies of `data`'s logical message."""
        twin = self.twins.get(data)
        return (data,) if twin is None else (data, twin)

    def consumed(self, data: DataId) -> bool:
        """Whether `data`'s logical message was consumed (any copy)."""
        return any(self._consumed[c] for c in self.copies(data))

    def stood(self, region: str, standing: int | None) -> None:
        """The durable's copy in `region` stands at `standing` (None: absent)."""
        if standing is not None and standing > self.high.get(region, -1):
            self.high[region] = standing

    def passed(self, region: str) -> int | None:
        """How far the durable's copy in `region` ever got (None: never there)."""
        return self.high.get(region)

    def why(self, data: DataId) -> str | None:
        for copy in self.copies(data):
            for x in self._vs.regions:
                why = self._removed_under(copy, x) or self._never_reached(copy, x)
                if why is not None:
                    self.stats[why.split(" ", 1)[0]] += 1
                    return why
        if all(
            self._ledger.never_reaches(x, c) for c in self.copies(data) for x in self._vs.regions
        ):
            # Its write stream removed it before any link carried it (a region cut off longer
            # than its write stream's age limit): no read stream can deliver it, and a vector
            # passing its gap skips nothing anywhere (`make soak` seed 821305039233).
            self.stats["unreachable"] += 1
            return f"unreachable {data} reaches no read stream"
        return None

    def _removed_under(self, copy: DataId, x: str) -> str | None:
        """`copy` was removed from x's read stream while the durable was there (idle or not,
        its position then stands over it)."""
        at = self._ledger.stored_at(x, copy)
        if at is None or at >= self._js.stream(self._vs.read_stream(x)).first_seq:
            return None
        if self.passed(x) is None:
            return None
        if self.removals.by_purge(x, at):
            return self.excuse_purged(copy, x, at)
        return f"removed {copy} at {at} in {x} under the durable"

    def excuse_purged(self, copy: DataId, x: str, at: int) -> str | None:
        return f"purged {copy} at {at} in {x} under the durable"

    def _never_reached(self, copy: DataId, x: str) -> str | None:
        """`copy` never reached x's read stream (its write stream removed it first) and the
        durable passed that gap there (stood at or beyond the next message of its origin); or
        `copy` never left its region at all and the durable is in x, where no later message of
        its origin landed yet: no gap shows there, but no region but its own ever delivers it,
        so passing it there skips nothing the durable delivers anywhere else (a snapshot's
        mapped position passes it before the gap forms: the inline order a snapshot rests on
        does not hold for a message that expired before it left, `make soak` seed
        1075514836159)."""
        origin, seq = copy
        if not self._ledger.never_reaches(x, copy):
            return None
        resume = self._ledger.next_landed(x, origin, seq)
        passed = self.passed(x)
        if passed is None:
            return None
        if resume is None:
            stayed = all(
                self._ledger.never_reaches(y, copy) for y in self._vs.regions if y != origin
            )
            return f"unreached {copy} never left {origin}" if stayed else None
        if passed < resume:
            return None
        return f"unreached {copy} never reached {x}, passed there"
