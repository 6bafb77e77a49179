"""What the acks above a floor cost (docs/protocol.md §6): the update's size on the wire and
the leader's CPU to build its ranges.

Usage: .venv/bin/python bench/bench_acked_ranges.py

Sizes: an update of one durable carrying `n` ranges of one message each (the worst case:
every other message acked), its sequences near 10^9 and near 2^62 (varints grow with them).
CPU: a leader whose durable's floor is held by one message while its workers ack the next
`k` ones (acks heard in a shuffled order, as parallel workers send them, data of one origin
interleaved with a marker every 50 messages), timed per positions read that sends the
update (`time.process_time`, the best of five).
"""

from __future__ import annotations

import random
import time

from sidecar.protocol import (
    MAX_ACKED_RANGES,
    Acks,
    MachineConfig,
    Marker,
    PositionsListing,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    encode,
)
from sidecar.protocol.origins import DataEntry

SUBS = {"d": SubscriptionInfo(config=b"{}")}


def update_bytes(ranges: int, base: int) -> int:
    pairs = tuple((base + 2 * i, base + 2 * i) for i in range(ranges))
    body = Update(
        "billing", SubscriptionKind.DURABLE, None, 0, {}, b"{}", {"west": base - 1}, base,
        False, {"west": pairs},
    )  # fmt: skip
    return len(encode(Marker("west", "orders", 1, body)))


def read_cpu_s(acked: int) -> float:
    """CPU seconds of the positions read that takes `acked` acks above a held floor."""
    best = float("inf")
    for _ in range(5):
        m = StreamMachine(MachineConfig("west", "orders", ("west", "east")))
        m.tick(1_000)
        entries = [DataEntry(s, "west", s + s // 50) for s in range(1, acked + 3)]
        m.data_indexed(entries)
        m.became_leader(1)
        m.read_done(PositionsListing(m.generation, SUBS, {"d": 0}, acked + 2, False))
        seqs = list(range(3, acked + 3))
        random.Random(acked).shuffle(seqs)
        m.tick(2_000)
        listing = PositionsListing(
            m.generation, SUBS, {"d": 1}, acked + 2, False, acked={"d": Acks(2_000, tuple(seqs))}
        )
        started = time.process_time()
        m.read_done(listing)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    for ranges in (1, 100, MAX_ACKED_RANGES):
        print(
            f"{ranges:>5} ranges: update of {update_bytes(ranges, 10**9):>6,} bytes near "
            f"sequence 1e9, {update_bytes(ranges, 2**62):>6,} near 2^62"
        )
    for acked in (100, 1_000, 10_000):
        cpu = read_cpu_s(acked)
        print(
            f"{acked:>6,} acked above a held floor: {1e3 * cpu:.2f} ms of CPU for the read "
            f"that sends them ({1e6 * cpu / acked:.2f} us per ack)"
        )


if __name__ == "__main__":
    main()
