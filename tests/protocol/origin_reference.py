"""Brute-force references for the origin index (DESIGN §7, docs/protocol.md §6), computed
from the list of data messages alone, and a seeded generator of busy read streams.

The references restate the documented definitions without the index's data structure:
the vector at `M`, the furthest covered position, and where a trim leaves the index.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry

# docs/protocol.md §6, "Trimming": runs go in chunks of at least 1,024 runs and a quarter of
# an origin's runs at a time.
TRIM_MIN_RUNS = 1024


def covered(entry: DataEntry, vector: Mapping[str, int]) -> bool:
    return entry.origin != UNKNOWN_ORIGIN and entry.origin_seq <= vector.get(entry.origin, 0)


def brute_vector(entries: list[DataEntry], mark_delete: int) -> dict[str, int]:
    """Per origin, the highest origin sequence at or below `mark_delete`."""
    vector: dict[str, int] = {}
    for e in entries:
        if e.read_seq <= mark_delete and e.origin != UNKNOWN_ORIGIN:
            vector[e.origin] = max(vector.get(e.origin, 0), e.origin_seq)
    return vector


def brute_position(entries: list[DataEntry], vector: Mapping[str, int], after: int) -> int:
    """The furthest position past `after` with every data message in between covered."""
    end = entries[-1].read_seq if entries else 0
    position = max(end, after)
    for e in entries:
        if e.read_seq > after and not covered(e, vector):
            return e.read_seq - 1
    return position


def brute_runs(entries: list[DataEntry]) -> dict[str, list[list[int]]]:
    """Per origin, its messages' read sequences cut into runs: a message continues the run of
    the origin's previous message when both its read and origin sequences are one higher
    (an unknown origin's sequence is its read sequence)."""
    runs: dict[str, list[list[int]]] = {}
    last: dict[str, tuple[int, int]] = {}
    for e in entries:
        origin_seq = e.read_seq if e.origin == UNKNOWN_ORIGIN else e.origin_seq
        previous = last.get(e.origin)
        if previous == (e.read_seq - 1, origin_seq - 1):
            runs[e.origin][-1].append(e.read_seq)
        else:
            runs.setdefault(e.origin, []).append([e.read_seq])
        last[e.origin] = (e.read_seq, origin_seq)
    return runs


def brute_trim(entries: list[DataEntry], position: int) -> tuple[int, int]:
    """What one trim at `position` of an index holding `entries` leaves: (the trim point, the
    runs kept). Per origin, the leading runs ending at or below `position` go when there are
    enough of them; the trim point is the last message dropped (0: none)."""
    trim_point, kept = 0, 0
    for runs in brute_runs(entries).values():
        ending = sum(1 for run in runs if run[-1] <= position)
        if ending >= TRIM_MIN_RUNS and ending * 4 >= len(runs):
            trim_point = max(trim_point, runs[ending - 1][-1])
            kept += len(runs) - ending
        else:
            kept += len(runs)
    return trim_point, kept


def busy_read_stream(
    rng: random.Random, messages: int, origins: tuple[str, ...]
) -> list[DataEntry]:
    """`messages` data messages of one read stream: the origins interleaved, mostly one
    message at a time with a few bursts; per-origin order kept, with gaps in the read
    sequence (markers) and in an origin's sequence (filtered messages); about 2% of unknown
    origin."""
    next_origin = dict.fromkeys(origins, 1)
    read_seq = 0
    origin = origins[0]
    entries = []
    for _ in range(messages):
        read_seq += 1 if rng.random() < 0.9 else 2
        if rng.random() < 0.02:
            entries.append(DataEntry(read_seq, UNKNOWN_ORIGIN, 0))
            continue
        if rng.random() < 0.7:
            origin = rng.choice(origins)
        if rng.random() < 0.05:
            next_origin[origin] += 1
        entries.append(DataEntry(read_seq, origin, next_origin[origin]))
        next_origin[origin] += 1
    return entries


def trim_positions(rng: random.Random, entries: list[DataEntry], count: int) -> list[int]:
    """`count` positions in the second half of `entries` to trim at or place a mark-delete
    at, half of them at the last message of a known origin's run and half just before one
    (where a trim one message too far would drop one run more)."""
    half = entries[len(entries) // 2].read_seq
    ends = [
        run[-1]
        for origin, runs in brute_runs(entries).items()
        if origin != UNKNOWN_ORIGIN
        for run in runs
        if half <= run[-1] < entries[-1].read_seq
    ]
    chosen = rng.sample(sorted(ends), count)
    return [end - i % 2 for i, end in enumerate(chosen)]
