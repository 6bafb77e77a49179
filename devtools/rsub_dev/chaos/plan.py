"""Everything a chaos run does, drawn from its seed (`random.Random(seed)`), before it starts.

Timings during the run still depend on the machine (how fast servers elect leaders, how far
consumers get), so a replay repeats the schedule, not every interleaving.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

REGION_NAMES = ("west", "central", "east", "north")
LEASE_TTL_S = 3.0
SNAPSHOT_WAIT_S = 5.0
"""How long a mid-snapshot `sidecar_kill` waits at most for a snapshot in flight."""

# Fault kinds, most valuable first, with their weight in the draw.
KINDS: dict[str, int] = {
    "sidecar_kill": 4,  # SIGKILL (mid-snapshot when drawn so), restart after a downtime
    "region_kill": 2,  # every server of a region and its sidecar, restarted after a downtime
    "link_cut": 3,  # gateway links between two regions cut (both directions), then restored
    "link_delay": 2,  # latency added on the gateway links between two regions
    "server_kill": 3,  # one server of a region SIGKILLed (stream leader change), restarted
    "sidecar_freeze": 2,  # SIGSTOP past the lease TTL, then SIGCONT
    "durable_delete": 2,  # a replicated durable's copy deleted by its user (not where consumed)
    "read_purge": 2,  # a read stream's oldest data removed (a purge, as limits would)
}
LINK_KINDS = ("link_cut", "link_delay")


@dataclass(frozen=True)
class Event:
    at: float
    kind: str
    target: str
    """A region, or `a<->b` for a link."""
    duration: float
    amount: float = 0.0
    """link_delay: seconds of latency; read_purge: fraction removed; server_kill: server
    index; sidecar_kill: 1.0 when it waits for a snapshot in flight."""

    def regions(self) -> tuple[str, ...]:
        return tuple(self.target.split("<->"))


@dataclass(frozen=True)
class DurablePlan:
    """A replicated subscription and the application consuming it: a JetStream durable
    (`kind="durable"`) or a Spark-style external cursor (`kind="cursor"`: reads the read
    stream by direct gets and commits through gRPC `CommitCursor`)."""

    name: str
    home: str
    pause_s: float
    """Mean pause after each message (random pacing, exponential)."""
    batch: int
    kind: str = "durable"


@dataclass(frozen=True)
class FailoverPlan:
    at: float
    durable: str
    target: str


@dataclass(frozen=True)
class Plan:
    seed: int
    seconds: float
    regions: tuple[str, ...]
    rates: dict[str, float]
    durables: tuple[DurablePlan, ...]
    failovers: tuple[FailoverPlan, ...]
    events: tuple[Event, ...]
    interval_ms: int
    timeout_s: float


def draw(seed: int, seconds: float, max_regions: int = 3) -> Plan:
    rng = random.Random(seed)
    regions = REGION_NAMES[: rng.randint(2, max(2, min(max_regions, len(REGION_NAMES))))]
    rates = {r: float(rng.randint(4, 12)) for r in regions}
    durables = (
        *(
            DurablePlan(
                f"app{i}", rng.choice(regions), rng.choice((0.0, 0.01, 0.03)), rng.randint(1, 50)
            )
            for i in range(rng.randint(1, 2))
        ),
        DurablePlan("spark", rng.choice(regions), rng.choice((0.0, 0.01)), 20, "cursor"),
    )
    failovers = tuple(
        sorted(
            (
                FailoverPlan(round(rng.uniform(3, seconds - 3), 1), d.name, rng.choice(regions))
                for d in durables
                for _ in range(rng.randint(1, max(1, int(seconds // 15))))
            ),
            key=lambda f: f.at,
        )
    )
    events = _events(rng, regions, seconds)
    return Plan(
        seed,
        seconds,
        regions,
        rates,
        durables,
        failovers,
        events,
        interval_ms=rng.choice((200, 300, 500)),
        timeout_s=rng.choice((3.0, 5.0)),
    )


def _events(rng: random.Random, regions: tuple[str, ...], seconds: float) -> tuple[Event, ...]:
    kinds, weights = zip(*KINDS.items(), strict=True)
    busy: dict[str, float] = {r: 0.0 for r in regions}
    region_down_until = 0.0
    events: list[Event] = []
    at = rng.uniform(2, 5)
    while at < seconds - 3:
        kind = rng.choices(kinds, weights)[0]
        if kind in LINK_KINDS:
            a, b = rng.sample(regions, 2)
            target = f"{a}<->{b}"
        else:
            target = rng.choice(regions)
        duration, amount = _shape(rng, kind)
        involved = target.split("<->")
        one_region_at_a_time = kind == "region_kill" and at < region_down_until
        if all(busy[r] <= at for r in involved) and not one_region_at_a_time:
            events.append(Event(round(at, 1), kind, target, round(duration, 1), round(amount, 2)))
            # A kill waiting for a snapshot in flight starts up to 5 s late.
            late = SNAPSHOT_WAIT_S if kind == "sidecar_kill" and amount else 0.0
            for r in involved:
                busy[r] = at + late + duration + 1
            if kind == "region_kill":
                region_down_until = at + duration + 5
        at += rng.uniform(2, 7)
    return tuple(events)


def _shape(rng: random.Random, kind: str) -> tuple[float, float]:
    """(duration, amount) of a fault of `kind`."""
    match kind:
        case "sidecar_kill":
            return rng.uniform(0.5, 6), float(rng.random() < 0.5)
        case "region_kill":
            return rng.uniform(4, 15), 0.0
        case "link_cut":
            return rng.uniform(2, 12), 0.0
        case "link_delay":
            return rng.uniform(2, 10), rng.uniform(0.1, 1.0)
        case "server_kill":
            return rng.uniform(2, 10), float(rng.randrange(3))
        case "sidecar_freeze":
            return LEASE_TTL_S * rng.uniform(1.5, 3), 0.0
        case "durable_delete":
            return 0.0, 0.0
        case "read_purge":
            return 0.0, rng.uniform(0.2, 0.6)
    raise ValueError(f"unknown fault kind {kind!r}")
