"""`OriginIndex` against the definitions of DESIGN §7, computed by brute force."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry, OriginIndex
from tests.protocol.origin_reference import (
    brute_position,
    brute_trim,
    brute_vector,
    busy_read_stream,
    covered,
    trim_positions,
)

ORIGINS = ("west", "east", "central")


@st.composite
def read_streams(draw: st.DrawFn) -> list[DataEntry]:
    """Data messages of one read stream: origins interleaved, per-origin order kept, gaps from
    filters (skipped origin sequences) and markers (skipped read sequences), a few unknown."""
    next_origin = dict.fromkeys(ORIGINS, 1)
    read_seq = 0
    entries = []
    for _ in range(draw(st.integers(0, 60))):
        read_seq += draw(st.sampled_from([1, 1, 1, 2, 3]))
        origin = draw(st.sampled_from([*ORIGINS, UNKNOWN_ORIGIN]))
        if origin == UNKNOWN_ORIGIN:
            entries.append(DataEntry(read_seq, origin, 0))
            continue
        next_origin[origin] += draw(st.sampled_from([0, 0, 0, 1, 2]))
        entries.append(DataEntry(read_seq, origin, next_origin[origin]))
        next_origin[origin] += 1
    return entries


def build(entries: list[DataEntry], trim_at: int | None = None) -> OriginIndex:
    index = OriginIndex()
    index.add(entries)
    if trim_at is not None:
        index.trim(trim_at)
    return index


@settings(max_examples=300)
@given(read_streams(), st.data())
def test_vector_position_and_exposure_match_the_definitions(
    entries: list[DataEntry], data: st.DataObject
) -> None:
    end = entries[-1].read_seq if entries else 0
    index = build(entries)
    assert index.indexed_through == end
    mark_delete = data.draw(st.integers(0, end + 2))
    vector = index.vector_at(mark_delete)
    assert vector == brute_vector(entries, mark_delete)

    other = {o: data.draw(st.integers(0, 30)) for o in ORIGINS}
    after = data.draw(st.integers(0, end + 2))
    assert index.position_for(other, after) == brute_position(entries, other, after)
    exposure = sum(1 for e in entries if e.read_seq > after and covered(e, other))
    assert index.covered_above(after, other) == exposure


@settings(max_examples=300)
@given(read_streams(), st.data())
def test_trimming_keeps_every_answer_at_or_above_the_trim_point(
    entries: list[DataEntry], data: st.DataObject
) -> None:
    end = entries[-1].read_seq if entries else 0
    trim_at = data.draw(st.integers(0, end + 1))
    index = build(entries, trim_at)
    full = build(entries)
    for mark_delete in range(trim_at, end + 2):
        assert index.vector_at(mark_delete) == full.vector_at(mark_delete)
    other = {o: data.draw(st.integers(0, 30)) for o in ORIGINS}
    for after in range(0, end + 2):
        got = index.position_for(other, after)
        if after >= trim_at:
            assert got == full.position_for(other, after)
        else:
            assert got is None or got == full.position_for(other, after)


def test_trimming_drops_runs_once_enough_can_go() -> None:
    index = OriginIndex()
    index.add(DataEntry(2 * i + 1 + o, ORIGINS[o], i + 1) for i in range(5000) for o in (0, 1))
    assert index.runs == 10_000
    index.trim(8000)
    assert index.runs < 3000
    assert index.trimmed_through == 8000  # the last message dropped
    assert index.vector_at(8000) == {"west": 4000, "east": 4000}
    assert index.position_for({"west": 4000, "east": 3999}, 0) is None
    assert index.position_for({"west": 4500, "east": 4400}, 8000) == 8801  # (east, 4401)


def test_a_trim_that_drops_nothing_leaves_every_answer_exact() -> None:
    index = OriginIndex()
    index.add(DataEntry(i, ORIGINS[i % 2], (i + 1) // 2) for i in range(1, 101))
    index.trim(80)  # too few runs to be worth dropping
    assert (index.runs, index.trimmed_through) == (100, 0)
    assert index.vector_at(10) == {"west": 5, "east": 5}


def test_a_burst_from_one_origin_is_one_run() -> None:
    index = OriginIndex()
    index.add(DataEntry(i, "west", i + 10) for i in range(1, 100_001))
    assert index.runs == 1
    assert index.vector_at(500) == {"west": 510}
    assert index.position_for({"west": 600}) == 590


def test_a_message_whose_origin_sequence_does_not_rise_is_never_covered() -> None:
    index = OriginIndex()
    index.add([DataEntry(1, "west", 5), DataEntry(2, "west", 1), DataEntry(3, "west", 6)])
    assert index.vector_at(3) == {"west": 6}
    assert index.position_for({"west": 10}) == 1


def test_replayed_entries_are_skipped() -> None:
    index = OriginIndex()
    assert index.add([DataEntry(1, "west", 1), DataEntry(2, "west", 2)]) == 2
    assert index.add([DataEntry(2, "west", 2), DataEntry(3, "east", 1)]) == 1
    assert index.vector_at(3) == {"west": 2, "east": 1}


def test_trimming_a_busy_stream_matches_the_reference() -> None:
    """Thousands of interleaved messages, trimmed at many positions: the trim point and the
    runs kept are the reference's, and every answer at or above the trim point is exact."""
    rng = random.Random(20_231)
    entries = busy_read_stream(rng, 16_000, ORIGINS)
    end = entries[-1].read_seq
    for position in trim_positions(rng, entries, 16):
        index = build(entries, position)
        trim_point, kept = brute_trim(entries, position)
        assert 0 < trim_point <= position  # this trim drops runs, never past the position
        assert (index.trimmed_through, index.runs) == (trim_point, kept)
        marks = {trim_point, trim_point + 1, position, position + 1, end}
        for mark_delete in sorted(marks | set(rng.sample(range(trim_point, end + 1), 12))):
            assert index.vector_at(mark_delete) == brute_vector(entries, mark_delete)
        vector = brute_vector(entries, rng.randint(position, end))
        for after in (trim_point, position, rng.randint(trim_point, end)):
            assert index.position_for(vector, after) == brute_position(entries, vector, after)
