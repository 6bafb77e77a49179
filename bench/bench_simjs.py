"""How fast the simulated JetStream (`rsub_dev.simjs`) runs a virtual-stream workload.

Usage: .venv/bin/python bench/bench_simjs.py [--regions 3] [--seconds 60] [--rate 100]
       [--tick-ms 10] [--rounds 3]

The layout of docs/topology.md for one virtual stream over `--regions` regions (a write
stream per region, a read stream per region sourcing every write stream through two subject
transforms, 20 ms per link, a 10 min de-duplication window and 1 min `max_age` on the read
streams), two durables per read stream, both on `V.>`: one consuming, one idle (a copy of a
subscription whose home is elsewhere). Every `--tick-ms` of virtual time each region
publishes its share of `--rate` messages a second (with a `Nats-Msg-Id`), then its
consuming durable fetches what arrived and acks it, and the read stream's consumers are
listed (as a sidecar reads positions). Printed per round: virtual seconds per wall second and per CPU second (this
machine is shared: CPU time varies less), operations (publish, fetch, ack, listing) per CPU
second, and the messages every read stream ended with.
"""

from __future__ import annotations

import argparse
import time

from rsub_dev.simjs import (
    ConsumerConfig,
    ManualClock,
    SimJetStream,
    SourceConfig,
    StreamConfig,
    SubjectTransform,
)
from sidecar.naming import VirtualStream


def build(js: SimJetStream, vs: VirtualStream) -> None:
    for r in vs.regions:
        subjects = (f"{vs.name}.{r}.>", vs.marker_subject(r))
        js.stream_create(StreamConfig(vs.write_stream(r), subjects, placement=r))
    for r in vs.regions:
        sources = tuple(
            SourceConfig(
                vs.write_stream(x),
                subject_transforms=(
                    SubjectTransform(f"{vs.name}.{x}.>", f"{vs.name}.>"),
                    SubjectTransform(vs.marker_subject(x), vs.marker_subject(x)),
                ),
            )
            for x in vs.regions
        )
        config = StreamConfig(
            vs.read_stream(r),
            (vs.snapshot_subject(r),),
            max_age_ms=60_000,
            duplicate_window_ms=600_000,
            sources=sources,
            placement=r,
        )
        js.stream_create(config)
        for x in vs.regions:
            js.set_delay(vs.read_stream(r), vs.write_stream(x), 20)
        for name in ("data", "copy"):
            js.consumer_create(vs.read_stream(r), ConsumerConfig(name, (f"{vs.name}.>",)))


def run(regions: int, seconds: int, rate: int, tick_ms: int) -> tuple[float, float, int, list[int]]:
    """Wall and CPU seconds, operations, and the messages each read stream holds at the end."""
    clock = ManualClock()
    js = SimJetStream(clock)
    vs = VirtualStream("V", tuple(f"r{i}" for i in range(regions)))
    build(js, vs)
    per_tick = rate * tick_ms / 1000 / regions
    owed = dict.fromkeys(vs.regions, 0.0)
    ops, sent = 0, 0
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(seconds * 1000 // tick_ms):
        clock.advance(tick_ms)
        for r in vs.regions:
            owed[r] += per_tick
            while owed[r] >= 1:
                owed[r] -= 1
                sent += 1
                js.publish(f"V.{r}.orders", b"x" * 100, {"Nats-Msg-Id": str(sent)})
                ops += 1
            for delivery in js.fetch(vs.read_stream(r), "data", 256):
                js.ack(vs.read_stream(r), "data", delivery.stream_seq)
                ops += 1
            js.consumer_list(vs.read_stream(r))
            ops += 2
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    held = [js.stream_info(vs.read_stream(r)).state.messages for r in vs.regions]
    return wall, cpu, ops, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=60, help="virtual seconds per round")
    parser.add_argument("--rate", type=int, default=100, help="messages a second, all regions")
    parser.add_argument("--tick-ms", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{args.regions} regions, {args.rate} msg/s for {args.seconds} virtual s, "
        f"a step every {args.tick_ms} ms"
    )
    for i in range(args.rounds):
        wall, cpu, ops, held = run(args.regions, args.seconds, args.rate, args.tick_ms)
        print(
            f"round {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU; virtual s per wall s "
            f"{args.seconds / wall:.1f}, per CPU s {args.seconds / cpu:.1f}; "
            f"{ops / cpu:,.0f} operations per CPU s; read streams hold {held}"
        )


if __name__ == "__main__":
    main()
