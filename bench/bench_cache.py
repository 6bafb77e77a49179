"""Snapshot cache throughput at capacities 30 and 10,000: `.venv/bin/python bench/bench_cache.py`.

Insertions run with the cache full (every insertion evicts one entry); lookups are `floor`
(newest entry at or below a position, left in place) at random positions over the backlog.
"""

from __future__ import annotations

import random
import time

from sidecar.protocol import SnapshotCache


def bench(capacity: int, inserts: int, lookups: int) -> None:
    rng = random.Random(capacity)
    cache: SnapshotCache[int] = SnapshotCache(capacity)
    position = 0
    for _ in range(capacity):
        position += rng.randint(1, 20)
        cache.add(position, position)
    steps = [rng.randint(1, 20) for _ in range(inserts)]
    t0 = time.perf_counter()
    for step in steps:
        position += step
        cache.add(position, position)
    insert_s = time.perf_counter() - t0
    positions = cache.positions()
    probes = [rng.randint(positions[0], positions[-1]) for _ in range(lookups)]
    t0 = time.perf_counter()
    for probe in probes:
        cache.floor(probe)
    lookup_s = time.perf_counter() - t0
    print(
        f"cache capacity {capacity:>6}: {inserts / insert_s:>10,.0f} insertions/s (full, evicting), "
        f"{lookups / lookup_s:>10,.0f} lookups/s"
    )


def main() -> None:
    bench(30, 200_000, 200_000)
    bench(10_000, 200_000, 200_000)


if __name__ == "__main__":
    main()
