"""`OriginIndex`: where each origin's messages lie in one read stream (DESIGN §7).

Every data message of a read stream `Q` is a copy of message `(o, s)`: origin sequence `s` of
region `o`'s write stream (its `Nats-Stream-Source` header). Sourcing keeps each origin's
order, so per origin both the read-stream sequences and the origin sequences of its messages
rise together. The index keeps, per origin, runs of messages whose read sequences and origin
sequences both step by one, in three parallel `array('q')` columns (run start in `Q`, run
start in the origin, messages before the run), so it answers by bisection:

- `vector_at(M)`: per origin, the highest origin sequence among its messages at or below `M`
  (the progress vector of a subscription with mark-delete `M`);
- `position_for(v, after)`: the furthest position `P` such that every data message in
  (`after`, `P`] is covered by `v` (`s <= v[o]`), never past what the index has seen;
- `covered_above(M, v)`: how many data messages above `M` are covered by `v` (the messages a
  native consumer standing at `M` would receive again).

Memory: 24 bytes per run, so at most 24 bytes per indexed message (origins interleaving one
message at a time) and far less for bursts; `trim(T)` drops whole runs at or below `T`,
folding each origin's highest trimmed origin sequence into `base`, which keeps `vector_at`
exact for every `M >= T`. Written here because no library offers a per-origin run index.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

UNKNOWN_ORIGIN = ""
"""The origin of a data message without a usable `Nats-Stream-Source` (published into the
read stream directly, or from a stream of no known region). No vector ever covers it."""

# Trimming moves array memory: do it once a quarter of the runs (and at least this many) can go.
_TRIM_MIN_RUNS = 1024


@dataclass(frozen=True, slots=True)
class DataEntry:
    """One data message of the read stream: `origin` is a region or `UNKNOWN_ORIGIN`."""

    read_seq: int
    origin: str
    origin_seq: int


class _Runs:
    """One origin's messages as runs `(read start, origin start, messages before)`.

    Messages are numbered in arrival order over the origin's whole history ("index"), so
    trimmed runs keep the numbering of the rest; `count` is the next number.
    """

    __slots__ = ("base", "before", "count", "last_origin", "last_read", "origins", "reads")

    def __init__(self) -> None:
        self.reads = array("q")
        self.origins = array("q")
        self.before = array("q")
        self.count = 0
        self.last_read = 0
        self.last_origin = 0
        self.base = 0  # the highest origin sequence trimmed away (0: nothing trimmed)

    def add(self, read_seq: int, origin_seq: int) -> None:
        follows = read_seq == self.last_read + 1 and origin_seq == self.last_origin + 1
        if not (follows and self.reads):
            self.reads.append(read_seq)
            self.origins.append(origin_seq)
            self.before.append(self.count)
        self.count += 1
        self.last_read, self.last_origin = read_seq, origin_seq

    def _length(self, i: int) -> int:
        end = self.before[i + 1] if i + 1 < len(self.before) else self.count
        return end - self.before[i]

    def _after(self, column: array[int], value: int) -> int:
        """The index of the first kept message whose `column` value is above `value`."""
        i = bisect_right(column, value) - 1
        if i < 0:
            return self.before[0] if self.reads else self.count
        offset = value - column[i] + 1
        if offset < self._length(i):
            return self.before[i] + offset
        return self.before[i + 1] if i + 1 < len(self.before) else self.count

    def after_read(self, position: int) -> int:
        return self._after(self.reads, position)

    def after_origin(self, origin_seq: int) -> int:
        return self._after(self.origins, origin_seq)

    def read_at(self, index: int) -> int:
        i = bisect_right(self.before, index) - 1
        return self.reads[i] + index - self.before[i]

    def origin_at_or_below(self, position: int) -> int:
        """The highest origin sequence at or below `position` (`base` when none is kept)."""
        i = bisect_right(self.reads, position) - 1
        if i < 0:
            return self.base
        return self.origins[i] + min(position - self.reads[i], self._length(i) - 1)

    def origin_at(self, read_seq: int) -> int | None:
        """The origin sequence of this origin's kept message at `read_seq` (None: none)."""
        i = bisect_right(self.reads, read_seq) - 1
        if i < 0 or read_seq - self.reads[i] >= self._length(i):
            return None
        return self.origins[i] + read_seq - self.reads[i]

    def runs_through(self, position: int) -> int:
        """How many leading runs end at or below `position`."""
        i = bisect_right(self.reads, position)
        if i > 0 and self.reads[i - 1] + self._length(i - 1) - 1 > position:
            i -= 1
        return i

    def drop(self, runs: int) -> int:
        """Drop the first `runs` runs; returns the read sequence of the last message dropped."""
        last = runs - 1
        length = self._length(last)
        self.base = self.origins[last] + length - 1
        end = self.reads[last] + length - 1
        del self.reads[:runs], self.origins[:runs], self.before[:runs]
        return end


class OriginIndex:
    """The origin positions of one read stream's data messages (see the module docstring)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Runs] = {}
        self.indexed_through = 0
        """Every data message at or below this read sequence has been added."""
        self.trimmed_through = 0
        """The read sequence of the last message dropped by `trim` (0: none): answers about
        positions at or above it are exact."""

    def add(self, entries: Iterable[DataEntry]) -> int:
        """Add data messages in read-stream order; ones at or below `indexed_through` (a replay)
        are skipped. Returns how many were added."""
        added = 0
        for entry in entries:
            if entry.read_seq <= self.indexed_through:
                continue
            origin, origin_seq = entry.origin, entry.origin_seq
            runs = self._runs.get(origin)
            # Per-origin order is the sourcing guarantee: a message whose origin sequence does
            # not rise (its write stream was re-created) cannot be placed, so it is kept as
            # one no vector covers.
            if runs is not None and origin != UNKNOWN_ORIGIN and origin_seq <= runs.last_origin:
                origin = UNKNOWN_ORIGIN
                runs = self._runs.get(origin)
            if origin == UNKNOWN_ORIGIN:
                origin_seq = entry.read_seq
            if runs is None:
                runs = self._runs[origin] = _Runs()
            runs.add(entry.read_seq, origin_seq)
            self.indexed_through = entry.read_seq
            added += 1
        return added

    def vector_at(self, mark_delete: int) -> dict[str, int]:
        """Per origin, the highest origin sequence at or below `mark_delete` (origins with
        none left out). Exact for `mark_delete >= trimmed_through`; callers never ask below
        their trim point (`trim`)."""
        vector: dict[str, int] = {}
        for origin, runs in self._runs.items():
            if origin != UNKNOWN_ORIGIN:
                highest = runs.origin_at_or_below(mark_delete)
                if highest > 0:
                    vector[origin] = highest
        return vector

    def origin_of(self, read_seq: int) -> tuple[str, int] | None:
        """The origin and origin sequence of the data message at `read_seq` (None: none kept
        there: a marker, not indexed yet, trimmed, or of unknown origin)."""
        for origin, runs in self._runs.items():
            if origin != UNKNOWN_ORIGIN:
                origin_seq = runs.origin_at(read_seq)
                if origin_seq is not None:
                    return origin, origin_seq
        return None

    def position_for(self, vector: Mapping[str, int], after: int = 0) -> int | None:
        """The furthest `P >= after`, `P <= indexed_through`, such that every data message in
        (`after`, `P`] is covered by `vector`. None when that cannot be known: `after` lies
        below the trim point and some origin's trimmed messages are not all covered."""
        if after >= self.indexed_through:
            return after
        position = self.indexed_through
        for origin, runs in self._runs.items():
            covered = vector.get(origin, 0) if origin != UNKNOWN_ORIGIN else 0
            if after < self.trimmed_through and covered < runs.base:
                return None
            first = max(runs.after_read(after), runs.after_origin(covered))
            if first < runs.count:
                position = min(position, runs.read_at(first) - 1)
        return max(position, after)

    def covered_above(self, mark_delete: int, vector: Mapping[str, int]) -> int:
        """How many kept data messages above `mark_delete` are covered by `vector`."""
        total = 0
        for origin, runs in self._runs.items():
            if origin != UNKNOWN_ORIGIN:
                start = runs.after_read(mark_delete)
                total += max(0, runs.after_origin(vector.get(origin, 0)) - start)
        return total

    def trim(self, position: int) -> None:
        """Forget runs ending at or below `position` where enough can go, raising
        `trimmed_through` only as far as messages were really dropped: below it the caller
        must not ask `vector_at`, and `position_for` after a point below it may answer None."""
        for runs in self._runs.values():
            n = runs.runs_through(position)
            if n >= _TRIM_MIN_RUNS and n * 4 >= len(runs.reads):
                self.trimmed_through = max(self.trimmed_through, runs.drop(n))

    @property
    def runs(self) -> int:
        """Runs held (each costs 24 bytes)."""
        return sum(len(r.reads) for r in self._runs.values())
