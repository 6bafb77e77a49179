"""The origin index (DESIGN §7): memory per backlog message and query speed.

Run: `.venv/bin/python bench/bench_origin_index.py [--messages N]`.

For each traffic shape it indexes N data messages of a read stream sourcing 3 regions and
prints the bytes held per message (tracemalloc, everything the index allocates), the runs
held, and how many `vector_at` / `position_for` / `covered_above` queries run per second over
the full backlog:

- `burst`: each region publishes 1,000 messages at a time (long runs);
- `round-robin`: the regions interleave one message at a time (one run per message, the worst
  case);
- `random`: each message comes from a random region, 10 % of origin sequences skipped
  (filters or markers of the write stream).
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Callable, Iterator

from sidecar.protocol.origins import DataEntry, OriginIndex

REGIONS = ("west", "east", "central")


def burst(n: int, rng: random.Random) -> Iterator[DataEntry]:
    origin_seq = dict.fromkeys(REGIONS, 0)
    for read_seq in range(1, n + 1):
        origin = REGIONS[(read_seq - 1) // 1000 % len(REGIONS)]
        origin_seq[origin] += 1
        yield DataEntry(read_seq, origin, origin_seq[origin])


def round_robin(n: int, rng: random.Random) -> Iterator[DataEntry]:
    for read_seq in range(1, n + 1):
        yield DataEntry(read_seq, REGIONS[read_seq % 3], (read_seq + 2) // 3)


def scattered(n: int, rng: random.Random) -> Iterator[DataEntry]:
    origin_seq = dict.fromkeys(REGIONS, 0)
    for read_seq in range(1, n + 1):
        origin = rng.choice(REGIONS)
        origin_seq[origin] += 2 if rng.random() < 0.1 else 1
        yield DataEntry(read_seq, origin, origin_seq[origin])


SHAPES: dict[str, Callable[[int, random.Random], Iterator[DataEntry]]] = {
    "burst": burst,
    "round-robin": round_robin,
    "random": scattered,
}


def measure(name: str, n: int, queries: int) -> None:
    entries = list(SHAPES[name](n, random.Random(7)))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = OriginIndex()
    start = time.perf_counter()
    index.add(entries)
    add_s = time.perf_counter() - start
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    rng = random.Random(11)
    marks = [rng.randint(1, n) for _ in range(queries)]
    start = time.perf_counter()
    vectors = [index.vector_at(m) for m in marks]
    vector_s = time.perf_counter() - start
    start = time.perf_counter()
    for v, m in zip(vectors, marks, strict=True):
        index.position_for(v, m // 2)
    position_s = time.perf_counter() - start
    start = time.perf_counter()
    for v, m in zip(vectors, marks, strict=True):
        index.covered_above(m // 2, v)
    covered_s = time.perf_counter() - start
    print(
        f"{name:12} {n:>10,} msgs  {held / n:6.2f} B/msg  {index.runs:>10,} runs  "
        f"add {n / add_s:>10,.0f}/s  vector_at {queries / vector_s:>9,.0f}/s  "
        f"position_for {queries / position_s:>9,.0f}/s  covered_above {queries / covered_s:>9,.0f}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=20_000)
    args = parser.parse_args()
    for name in SHAPES:
        measure(name, args.messages, args.queries)


if __name__ == "__main__":
    main()
