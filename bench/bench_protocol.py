"""Protocol core throughput: markers processed per second for 1,000 streams x 10 subscriptions,
and simulator schedules checked per second. Run: `.venv/bin/python bench/bench_protocol.py`.

Every round of every stream (3 regions, this is region a) feeds the machine what a real
sidecar sees: data arriving, a tick that starts a snapshot, its two-round request/response
exchange, the completed snapshot's echo, two remote requests (answered), positions passing
the snapshot (10 updates sent, and their echoes), and 10 remote updates naming a (moves).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from rsub_dev.sim import SimParams, run
from sidecar.protocol import (
    MachineConfig,
    Marker,
    PublishLocal,
    PublishReplicated,
    Request,
    Response,
    SnapshotId,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    decode,
    encode,
)

REGIONS = ("a", "b", "c")
STREAM = "V"


def _remote(round_no: int, subs: list[str]) -> list[Marker]:
    """Markers of regions b and c for round `round_no` (same for every stream)."""
    own = SnapshotId("a", 1, round_no)
    markers = [
        Marker(r, STREAM, 1, Response(own, rnd, 100 * round_no + i))
        for rnd in (1, 2)
        for i, r in enumerate(("b", "c"), start=1)
    ]
    markers += [Marker(r, STREAM, 1, Request(SnapshotId(r, 1, round_no), 1)) for r in ("b", "c")]
    sid_b = SnapshotId("b", 1, round_no)
    markers += [
        Marker(
            "b",
            STREAM,
            1,
            Update(s, SubscriptionKind.DURABLE, sid_b, 50 * round_no, {"a": 40 * round_no}, b""),
        )
        for s in subs
    ]
    return markers


def bench_markers(streams: int, subs_per_stream: int, rounds: int, with_codec: bool) -> None:
    subs = [f"d{i}" for i in range(subs_per_stream)]
    infos = {s: SubscriptionInfo(config=b"x" * 64) for s in subs}
    machines = []
    for _ in range(streams):
        m = StreamMachine(MachineConfig("a", STREAM, REGIONS))
        m.subscriptions_changed(infos)
        m.positions_read(dict.fromkeys(subs, 0), 0)
        m.became_leader(1)
        machines.append(m)
    remote = {k: _remote(k, subs) for k in range(1, rounds + 1)}
    wire = {k: [encode(x) for x in ms] for k, ms in remote.items()}
    seqs = [0] * streams
    seen = 0
    t0 = time.perf_counter()

    def feed(m: StreamMachine, i: int, marker: Marker, raw: bytes | None = None) -> list[object]:
        """Own markers are encoded (as publishing does); every marker seen is decoded."""
        nonlocal seen
        seqs[i] += 1
        seen += 1
        if with_codec:
            decoded = decode(raw or encode(marker), stream=STREAM, regions=REGIONS)
            assert isinstance(decoded, Marker)
            marker = decoded
        return list(m.marker_seen(seqs[i], marker))

    for k in range(1, rounds + 1):
        now = 1_000 * k
        for i, m in enumerate(machines):
            seqs[i] += 5
            m.read_stream_advanced(seqs[i])
            own = [o.marker for o in m.tick(now) if isinstance(o, PublishReplicated)]
            resp = remote[k]
            raw = wire[k]
            out = feed(m, i, own[0])  # own round-1 request
            for j in (0, 1):  # round-1 responses -> round-2 request
                out += feed(m, i, resp[j], raw[j])
            r2 = [o.marker for o in out if isinstance(o, PublishReplicated)]
            out = feed(m, i, r2[0])
            for j in (2, 3):
                out += feed(m, i, resp[j], raw[j])
            local = [o.marker for o in out if isinstance(o, PublishLocal)]
            feed(m, i, local[0])
            for j in (4, 5):  # remote requests, answered
                feed(m, i, resp[j], raw[j])
            sent = m.positions_read(dict.fromkeys(subs, seqs[i]), seqs[i])
            for o in sent:
                if isinstance(o, PublishReplicated):
                    feed(m, i, o.marker)
            for marker, data in zip(resp[6:], raw[6:], strict=True):  # remote updates -> moves
                feed(m, i, marker, data)
    elapsed = time.perf_counter() - t0
    label = "with protobuf codec" if with_codec else "machine only"
    print(
        f"markers: {streams} streams x {subs_per_stream} subs, {rounds} rounds, {label}: "
        f"{seen} markers in {elapsed:.2f}s = {seen / elapsed:,.0f} markers/s"
    )


def bench_sim(seconds: float, safety_only: bool) -> None:
    t0 = time.perf_counter()
    runs = events = 0
    seed = 0
    while time.perf_counter() - t0 < seconds:
        params = SimParams.draw(random.Random(seed ^ 0x5EED))
        if safety_only:
            params = dataclasses.replace(params, chaos_ms=1_200, heal_ms=0)
        result = run(seed, params)
        assert result.violation is None, result.report()
        runs += 1
        events += result.stats["events"]
        seed += 1
    elapsed = time.perf_counter() - t0
    kind = "1.2 s chaos, safety only (as in CI)" if safety_only else "chaos + 5 s healed"
    print(
        f"simulator ({kind}): {runs} schedules in {elapsed:.1f}s = {runs / elapsed:.1f} "
        f"schedules/s, {events / elapsed:,.0f} events/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=1_000)
    parser.add_argument("--subscriptions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sim-seconds", type=float, default=5.0)
    args = parser.parse_args()
    bench_markers(args.streams, args.subscriptions, args.rounds, with_codec=False)
    bench_markers(args.streams, args.subscriptions, args.rounds, with_codec=True)
    bench_sim(args.sim_seconds, safety_only=True)
    bench_sim(args.sim_seconds, safety_only=False)


if __name__ == "__main__":
    main()
