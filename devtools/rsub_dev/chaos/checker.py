"""Decide a chaos run from its history alone (`history.History`), rule by rule.

Rules (docs/reliability.md explains each against docs/protocol.md and docs/design.md):

- `no_loss`: every acknowledged publish is delivered to every durable at least once, except
  the messages a purge removed from some read stream before the durable was delivered them
  (docs/protocol.md §6, Claim 2: such a removal counts as consumed there and may be carried
  to the other regions).
- `no_marker`: no delivery is on a marker subject (`_rsub.>`).
- `duplicates`: after a failover into region `b`, the messages delivered again are at most
  `failover_exposure` read in `b` just before + the messages consumed before that `b`'s
  progress did not cover + those that reached `b`'s read stream after that read (late
  arrivals, docs/protocol.md §6 "A region that comes back"). With no view from `b` (its
  sidecar down), the bound is PIP-33's worst case: everything consumed before.
- `forward_only`: a durable's ack floor in a region never moves backward, except across a
  deletion of that durable by its user.
- `survived`: after the heal every sidecar answers ready and completes a snapshot again,
  without any restart by hand.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

from rsub_dev.chaos.history import Delivery, Failover, History, Position
from sidecar.exact import covered
from sidecar.naming import MARKER_PREFIX


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def _sample(items: list[str], n: int = 8) -> str:
    shown = ", ".join(items[:n])
    return shown + (f" ... ({len(items)} in all)" if len(items) > n else "")


def check_loss(history: History) -> list[Violation]:
    published = sorted(p for payloads in history.published.values() for p in payloads)
    found: list[Violation] = []
    for durable in history.durables:
        delivered = {d.payload for d in history.deliveries if d.durable == durable}
        excused = {p for removal in history.removals for p in removal.undelivered.get(durable, [])}
        missing = [p for p in published if p not in delivered and p not in excused]
        if missing:
            found.append(
                Violation(
                    "no_loss",
                    f"durable {durable}: {len(missing)} acknowledged messages never delivered "
                    f"and not removed by limits: {_sample(missing)}",
                )
            )
    return found


def check_markers(history: History) -> list[Violation]:
    markers = [d for d in history.deliveries if d.subject.startswith(f"{MARKER_PREFIX}.")]
    return [
        Violation(
            "no_marker",
            f"durable {d.durable} in {d.region} was delivered marker {d.subject} "
            f"(read seq {d.read_seq})",
        )
        for d in markers
    ]


@dataclass(frozen=True)
class FailoverCount:
    failover: Failover
    duplicates: int
    bound: int


def failover_counts(history: History) -> list[FailoverCount]:
    """Per failover: distinct messages delivered again in the new stint, and their bound."""
    by_durable: dict[str, list[Delivery]] = defaultdict(list)
    for d in history.deliveries:
        by_durable[d.durable].append(d)
    counts: list[FailoverCount] = []
    for f in history.failovers:
        deliveries = by_durable[f.durable]
        first: dict[str, Delivery] = {}
        for d in deliveries:
            if d.stint < f.stint:
                first.setdefault(d.payload, d)
        again = {d.payload for d in deliveries if d.stint == f.stint and d.payload in first}
        if f.view is None:
            bound = len(first)
        else:
            progress = f.view.progress
            uncovered = sum(1 for d in first.values() if not covered(d.origin, progress))
            late = {
                d.payload
                for d in deliveries
                if d.stint == f.stint and d.payload in first and d.read_seq > f.target_last_seq
            }
            bound = max(f.view.exposure, 0) + uncovered + len(late)
        counts.append(FailoverCount(f, len(again), bound))
    return counts


def check_duplicates(history: History) -> list[Violation]:
    return [
        Violation(
            "duplicates",
            f"durable {c.failover.durable}, failover {c.failover.source}->{c.failover.target} "
            f"at {c.failover.at:.1f}s (stint {c.failover.stint}): {c.duplicates} messages "
            f"delivered again, bound {c.bound} (view {c.failover.view})",
        )
        for c in failover_counts(history)
        if c.duplicates > c.bound
    ]


def check_forward_only(history: History) -> list[Violation]:
    series: dict[tuple[str, str, str], list[Position]] = defaultdict(list)
    for p in history.positions:
        series[(p.durable, p.region, p.source)].append(p)
    found: list[Violation] = []
    for (durable, region, source), positions in series.items():
        positions.sort(key=lambda p: (p.started, p.at))
        for before, after in itertools.pairwise(positions):
            if after.floor >= before.floor:
                continue
            by_user = any(
                u.durable == durable and u.region == region and before.started <= u.at <= after.at
                for u in history.deletions
            )
            if not by_user:
                found.append(
                    Violation(
                        "forward_only",
                        f"durable {durable} in {region} ({source}): floor {before.floor} "
                        f"read at {before.at:.1f}s, then {after.floor} at {after.at:.1f}s",
                    )
                )
    return found


def check_survived(history: History) -> list[Violation]:
    if history.healed_at is None:
        return [Violation("survived", "the run never reached its heal")]
    found = [
        Violation("survived", f"sidecar of {r} not ready after the heal")
        for r in history.regions
        if not history.sidecars_ready.get(r, False)
    ]
    found += [
        Violation("survived", f"no snapshot of {r} completed after the heal")
        for r in history.regions
        if not history.snapshots_after_heal.get(r, False)
    ]
    return found


def check(history: History) -> list[Violation]:
    """Every violation of the rules in `history` (empty: the run passed)."""
    return (
        check_survived(history)
        + check_loss(history)
        + check_markers(history)
        + check_duplicates(history)
        + check_forward_only(history)
    )


def summary(history: History) -> dict[str, object]:
    """Figures of a run for the campaign's table."""
    counts = failover_counts(history)
    redelivered = sum(
        n - 1 for n in Counter((d.durable, d.payload) for d in history.deliveries).values()
    )
    return {
        "regions": len(history.regions),
        "published": sum(len(p) for p in history.published.values()),
        "deliveries": len(history.deliveries),
        "delivered_again": redelivered,
        "failovers": len(history.failovers),
        "failover_duplicates": sum(c.duplicates for c in counts),
        "failover_bound": sum(c.bound for c in counts),
        "failovers_without_view": sum(1 for f in history.failovers if f.view is None),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "fault_errors": sum(1 for f in history.faults if f.detail.startswith("error:")),
        "removed": sum(len(r.payloads) for r in history.removals),
    }
