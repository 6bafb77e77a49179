"""The snapshot cache: Pulsar's cache scenarios and the spread of survivors after pruning."""

from __future__ import annotations

import random

import pytest

from sidecar.protocol import SnapshotCache


def test_advance_below_every_entry_returns_nothing() -> None:
    cache: SnapshotCache[str] = SnapshotCache(10)
    cache.add(10, "s10")
    cache.add(20, "s20")
    assert cache.advance(5) is None
    assert cache.positions() == [10, 20]


def test_advance_returns_newest_at_or_below_and_drops_consumed() -> None:
    cache: SnapshotCache[str] = SnapshotCache(10)
    for p in (10, 20, 30, 40):
        cache.add(p, f"s{p}")
    assert cache.advance(25) == "s20"
    assert cache.positions() == [30, 40]
    assert cache.advance(30) == "s30"
    assert cache.advance(30) is None
    assert cache.advance(1000) == "s40"
    assert len(cache) == 0


def test_duplicate_and_out_of_order_insertions() -> None:
    cache: SnapshotCache[int] = SnapshotCache(10)
    for p in (30, 10, 20, 20):
        cache.add(p, p)
    assert cache.positions() == [10, 20, 30]
    assert cache.floor(25) == 20 and cache.floor(9) is None


def test_pruning_keeps_oldest_newest_and_drops_the_smallest_gap() -> None:
    cache: SnapshotCache[int] = SnapshotCache(4)
    for p in (0, 10, 11, 30):
        cache.add(p, p)
    cache.add(40, 40)
    # Removing 10 leaves gap 0..11 (11), removing 11 leaves 10..30 (20), removing 30: 11..40.
    assert cache.positions() == [0, 11, 30, 40]
    cache.add(41, 41)
    assert cache.positions()[0] == 0 and cache.positions()[-1] == 41
    assert len(cache) == 4


def test_capacity_is_validated() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SnapshotCache(1)


def _check_spread(inserts: int, capacity: int, seed: int) -> None:
    rng = random.Random(seed)
    cache: SnapshotCache[int] = SnapshotCache(capacity)
    position = 0
    for i in range(inserts):
        position += rng.randint(1, 20)
        cache.add(position, position)
        if i % (inserts // 20) == 0 or i == inserts - 1:
            positions = cache.positions()
            assert positions[0] == 1 or positions[0] <= 20  # the oldest is never dropped
            if len(positions) < capacity:
                continue
            spacing = (positions[-1] - positions[0]) / (len(positions) - 1)
            for _ in range(200):
                mark_delete = rng.randint(positions[0], positions[-1])
                found = cache.floor(mark_delete)
                assert found is not None
                assert mark_delete - found <= 2 * spacing, (mark_delete, found, spacing)


def test_many_insertions_keep_lookups_within_two_spacings() -> None:
    _check_spread(100_000, 1_000, seed=7)


@pytest.mark.slow
def test_a_million_insertions_into_ten_thousand() -> None:
    _check_spread(1_000_000, 10_000, seed=11)
