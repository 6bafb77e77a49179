"""Protocol core throughput: markers processed per second for 1,000 streams x 10 subscriptions,
per-stage costs, and simulator schedules checked per second.

Run: `.venv/bin/python bench/bench_protocol.py`; to compare with another checkout side by side
(for example `git worktree add --detach /tmp/perf-base main`), add `--baseline /tmp/perf-base`:
each repetition then runs this file once against each tree, in alternating order, in separate
processes, and the table shows both.

Every round of every stream (3 regions, this is region a) feeds the machine what a real
sidecar sees: data arriving, a tick that starts a snapshot, its two-round request/response
exchange, the completed snapshot's echo, two remote requests (answered), positions passing
the snapshot (10 updates sent, and their echoes), and 10 remote updates naming a (moves).
One run records these inputs; every stage then replays them on fresh machines, timed in CPU
seconds of this process (`time.process_time`: one core's work, less bent by other load than
wall time):

- parse: protobuf `ParseFromString` of every marker seen;
- decode: `markers.decode` (parse, validation, building the dataclasses); validate = decode
  minus parse; building = the decoded dataclasses alone, built again from plain values;
- check_writer: the subject check the driver applies after decoding;
- encode: `markers.encode` of the markers this region publishes (about half of those seen);
- machine: the state machine alone, fed the decoded markers and the other inputs;
- pipeline: all of it as a sidecar does it per marker: encode what it publishes, decode and
  check every marker it sees, feed the machine. `markers/s with codec` is this one;
- the machine per input kind: each call timed alone (`perf_counter_ns`, wall time, so it
  includes the other load's interference; garbage collector off), with its share of the
  machine's time. An input's cost includes the outputs it produces (a response that
  completes a snapshot sends the updates of every subscription that passed it).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from sidecar._gen.rsub.v1 import markers_pb2
from sidecar.protocol import (
    MachineConfig,
    Marker,
    Output,
    PublishLocal,
    PublishReplicated,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    check_writer,
    decode,
    encode,
)
from sidecar.protocol.markers import Body

REGIONS = ("a", "b", "c")
STREAM = "V"


def _subject(marker: Marker) -> str:
    kind = "snapshot" if isinstance(marker.body, Snapshot) else "marker"
    return f"_rsub.{STREAM}.{kind}.{marker.region}"


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


@dataclasses.dataclass(slots=True)
class Seen:
    """A marker at `seq` of machine `stream`'s read stream, as stored (`raw`, `subject`);
    `own` when this region published it (so the sidecar encoded it first)."""

    stream: int
    seq: int
    marker: Marker
    raw: bytes
    subject: str
    own: bool


@dataclasses.dataclass(slots=True)
class Other:
    """Any other input: `call(machine)` on machine `stream`."""

    stream: int
    call: Callable[[StreamMachine], list[Output]]


Step = Seen | Other


class Script:
    """The recorded inputs of every stream, in order, and a fresh set of machines to replay
    them on (the machine is deterministic: a replay sees the recorded run's outputs)."""

    def __init__(self, streams: int, subs_per_stream: int, rounds: int) -> None:
        self.subs = [f"d{i}" for i in range(subs_per_stream)]
        self.streams = streams
        self.steps: list[Step] = []
        self.outputs = 0
        self._record(rounds)

    def machines(self) -> list[StreamMachine]:
        infos = {s: SubscriptionInfo(config=b"x" * 64) for s in self.subs}
        machines = []
        for _ in range(self.streams):
            m = StreamMachine(MachineConfig("a", STREAM, REGIONS))
            m.subscriptions_changed(infos)
            m.positions_read(dict.fromkeys(self.subs, 0), 0)
            m.became_leader(1)
            machines.append(m)
        return machines

    @property
    def seen(self) -> list[Seen]:
        return [s for s in self.steps if isinstance(s, Seen)]

    def _record(self, rounds: int) -> None:
        machines = self.machines()
        remote = {k: _remote(k, self.subs) for k in range(1, rounds + 1)}
        wire = {k: [encode(x) for x in ms] for k, ms in remote.items()}
        seqs = [0] * self.streams

        def other(i: int, call: Callable[[StreamMachine], list[Output]]) -> list[Output]:
            self.steps.append(Other(i, call))
            out = call(machines[i])
            self.outputs += len(out)
            return out

        def feed(i: int, marker: Marker, raw: bytes | None = None) -> list[Output]:
            seqs[i] += 1
            own = raw is None
            data = encode(marker) if raw is None else raw
            self.steps.append(Seen(i, seqs[i], marker, data, _subject(marker), own))
            out = machines[i].marker_seen(seqs[i], marker)
            self.outputs += len(out)
            return out

        for k in range(1, rounds + 1):
            now = 1_000 * k
            for i in range(self.streams):
                seqs[i] += 5
                other(i, partial(StreamMachine.read_stream_advanced, last_seq=seqs[i]))
                tick = other(i, partial(StreamMachine.tick, now_ms=now))
                own = [o.marker for o in tick if isinstance(o, PublishReplicated)]
                resp, raw = remote[k], wire[k]
                out = feed(i, own[0])  # own round-1 request
                for j in (0, 1):  # round-1 responses -> round-2 request
                    out += feed(i, resp[j], raw[j])
                r2 = [o.marker for o in out if isinstance(o, PublishReplicated)]
                out = feed(i, r2[0])
                for j in (2, 3):
                    out += feed(i, resp[j], raw[j])
                local = [o.marker for o in out if isinstance(o, PublishLocal)]
                feed(i, local[0])
                for j in (4, 5):  # remote requests, answered
                    feed(i, resp[j], raw[j])
                positions = dict.fromkeys(self.subs, seqs[i])
                read = partial(
                    StreamMachine.positions_read, positions=positions, read_last_seq=seqs[i]
                )
                sent = other(i, read)
                for o in sent:
                    if isinstance(o, PublishReplicated):
                        feed(i, o.marker)
                for marker, data in zip(resp[6:], raw[6:], strict=True):  # remote updates
                    feed(i, marker, data)


def _cpu(work: Callable[[], object]) -> float:
    return _timed(work)[0]


def _timed(work: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall-clock seconds of `work()`."""
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(streams: int, subs_per_stream: int, rounds: int) -> dict[str, float]:
    """One repetition of every stage; figures per marker seen unless named otherwise."""
    script = Script(streams, subs_per_stream, rounds)
    seen = script.seen
    own = [s.marker for s in seen if s.own]
    n = len(seen)

    def parse() -> None:
        for s in seen:
            markers_pb2.Marker.FromString(s.raw)

    def decode_all() -> None:
        for s in seen:
            decode(s.raw, stream=STREAM, regions=REGIONS)

    decoded = [decode(s.raw, stream=STREAM, regions=REGIONS) for s in seen]
    assert decoded == [s.marker for s in seen], "decode(encode(m)) != m"

    def check_all() -> None:
        for s, d in zip(seen, decoded, strict=True):
            check_writer(d, s.subject)

    def encode_all() -> None:
        for m in own:
            encode(m)

    builds = [_build_args(s.marker) for s in seen]

    def build_all() -> None:
        """The decoded dataclasses alone, from plain values (what `decode` builds)."""
        for body_cls, before, sid, after, envelope in builds:
            Marker(*envelope, body_cls(*before, SnapshotId(*sid) if sid else None, *after))

    def replay(codec: bool) -> None:
        machines = script.machines()
        outputs = 0
        for step in script.steps:
            m = machines[step.stream]
            if isinstance(step, Other):
                outputs += len(step.call(m))
                continue
            marker = step.marker
            if codec:
                raw = encode(marker) if step.own else step.raw
                got = check_writer(decode(raw, stream=STREAM, regions=REGIONS), step.subject)
                assert isinstance(got, Marker)
                marker = got
            outputs += len(m.marker_seen(step.seq, marker))
        assert outputs == script.outputs, "the replay did not follow the recorded run"

    parse_s, decode_s, build_s = _cpu(parse), _cpu(decode_all), _cpu(build_all)
    check_s, encode_s = _cpu(check_all), _cpu(encode_all)
    machine_s, (pipeline_s, pipeline_wall_s) = (
        _cpu(lambda: replay(False)),
        _timed(lambda: replay(True)),
    )
    us = 1e6 / n
    return {
        "markers": n,
        "machine_markers_per_s": n / machine_s,
        "pipeline_markers_per_s": n / pipeline_s,
        "pipeline_wall_markers_per_s": n / pipeline_wall_s,
        "parse_us": parse_s * us,
        "validate_us": (decode_s - parse_s) * us,
        "build_us": build_s * us,
        "decode_us": decode_s * us,
        "check_writer_us": check_s * us,
        "encode_us_per_own": encode_s * 1e6 / len(own),
        "encode_us": encode_s * us,
        "machine_us": machine_s * us,
        "pipeline_us": pipeline_s * us,
    } | _machine_by_kind(script)


def _kind(step: Step) -> str:
    if isinstance(step, Other):
        call = step.call
        return call.func.__name__ if isinstance(call, partial) else "other"
    return f"{'own' if step.own else 'remote'} {type(step.marker.body).__name__.lower()}"


def _machine_by_kind(script: Script) -> dict[str, float]:
    """The machine's cost per input kind: `us:<kind>` per call and `share:<kind>` of the
    machine's time (each call timed alone, so the timer adds ~0.1 us per call). The garbage
    collector is off for this pass: a collection would be charged to whichever call happened
    to trigger it (the other figures include collections)."""
    machines = script.machines()
    spent: dict[str, int] = {}
    calls: dict[str, int] = {}
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for step in script.steps:
            m = machines[step.stream]
            if isinstance(step, Other):
                t0 = clock()
                step.call(m)
            else:
                t0 = clock()
                m.marker_seen(step.seq, step.marker)
            elapsed = clock() - t0
            kind = _kind(step)
            spent[kind] = spent.get(kind, 0) + elapsed
            calls[kind] = calls.get(kind, 0) + 1
    finally:
        gc.enable()
    total = sum(spent.values())
    out: dict[str, float] = {}
    for kind in spent:
        out[f"us:{kind}"] = spent[kind] / calls[kind] / 1e3
        out[f"share:{kind}"] = 100 * spent[kind] / total
        out[f"calls:{kind}"] = calls[kind]
    return out


_Build = tuple[
    Callable[..., Body],
    tuple[Any, ...],
    tuple[str, int, int] | None,
    tuple[Any, ...],
    tuple[str, str, int],
]


def _build_args(marker: Marker) -> _Build:
    """How to build `marker` again from plain values: its body's class, the body's fields
    before and after its snapshot id, the id's fields, and the envelope's fields."""
    body = marker.body
    values = [getattr(body, f.name) for f in dataclasses.fields(body)]
    at = 2 if isinstance(body, Update) else 0
    sid: SnapshotId | None = values[at]
    sid_args = None if sid is None else (sid.region, sid.epoch, sid.counter)
    envelope = (marker.region, marker.stream, marker.epoch)
    return type(body), tuple(values[:at]), sid_args, tuple(values[at + 1 :]), envelope


ROWS = [
    ("machine_markers_per_s", "markers/s, state machine only", "{:,.0f}"),
    ("pipeline_markers_per_s", "markers/s, with codec (encode+decode+check+machine)", "{:,.0f}"),
    ("pipeline_wall_markers_per_s", "markers/s, with codec, wall clock", "{:,.0f}"),
    ("parse_us", "us/marker: protobuf parse", "{:.2f}"),
    ("validate_us", "us/marker: validation + dataclasses", "{:.2f}"),
    ("build_us", "us/marker: of which building dataclasses", "{:.2f}"),
    ("decode_us", "us/marker: decode (parse + validate)", "{:.2f}"),
    ("check_writer_us", "us/marker: check_writer", "{:.2f}"),
    ("encode_us", "us/marker: encode (own markers, spread)", "{:.2f}"),
    ("encode_us_per_own", "us per own marker: encode", "{:.2f}"),
    ("machine_us", "us/marker: state machine (all inputs)", "{:.2f}"),
    ("pipeline_us", "us/marker: pipeline", "{:.2f}"),
]


def _summary(values: Sequence[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def report(results: dict[str, list[dict[str, float]]]) -> None:
    labels = list(results)
    first = results[labels[0]][0]
    print(
        f"protocol core, CPU time of one process (unless wall clock), median [min-max] of "
        f"{len(results[labels[0]])} repetitions, {first['markers']:,.0f} markers each:"
    )
    width = max(len(title) for _, title, _ in ROWS)
    print(f"  {'':<{width}}" + "".join(f"  {label:>30}" for label in labels))
    for key, title, fmt in ROWS:
        cells = [_summary([r[key] for r in results[label]], fmt) for label in labels]
        print(f"  {title:<{width}}" + "".join(f"  {c:>30}" for c in cells))
    print("  state machine per input kind: us per call, and its share of the machine's time")
    kinds = sorted(
        (k[3:] for k in first if k.startswith("us:")), key=lambda k: -first[f"share:{k}"]
    )
    rounds = first["calls:tick"]
    for kind in kinds:
        title = f"    {kind} (x{first[f'calls:{kind}'] / rounds:g} per stream-round)"
        cells = [
            f"{_summary([r[f'us:{kind}'] for r in results[label]], '{:.2f}')} "
            f"{statistics.median(r[f'share:{kind}'] for r in results[label]):4.1f}%"
            for label in labels
        ]
        print(f"  {title:<{width}}" + "".join(f"  {c:>30}" for c in cells))


def _worker(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """One repetition against the checkout at `tree`, in its own process."""
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'devtools'}")
    cmd = [sys.executable, __file__, "--worker", "--streams", str(args.streams)]
    cmd += ["--subscriptions", str(args.subscriptions), "--rounds", str(args.rounds)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    source, figures = done.stdout.splitlines()
    if not Path(source).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the worker for {tree} imported the protocol from {source}")
    result: dict[str, float] = json.loads(figures)
    return result


def bench_markers(args: argparse.Namespace) -> None:
    if args.baseline is None:
        runs = [measure(args.streams, args.subscriptions, args.rounds) for _ in range(args.repeat)]
        report({"this tree": runs})
        return
    trees = {"this tree": Path(__file__).resolve().parents[1], "baseline": args.baseline}
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for rep in range(args.repeat):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        for label in order:
            results[label].append(_worker(trees[label], args))
    report(results)
    for key, title, _ in ROWS[:3]:
        ratios = [
            new[key] / old[key]
            for new, old in zip(results["this tree"], results["baseline"], strict=True)
        ]
        print(f"  {title}: this tree / baseline = {_summary(ratios, '{:.2f}')}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1_000)
    parser.add_argument("--subscriptions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median and range)")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure side by side")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(sys.modules[StreamMachine.__module__].__file__)
        print(json.dumps(measure(args.streams, args.subscriptions, args.rounds)))
        return
    bench_markers(args)


if __name__ == "__main__":
    main()
