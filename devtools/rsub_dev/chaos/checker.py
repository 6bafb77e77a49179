"""Decide a chaos run from its history alone (`history.History`), rule by rule.

Rules (docs/reliability.md explains each against docs/protocol.md and docs/design.md):

- `no_loss`: every acknowledged publish is delivered to every durable at least once, except
  the messages a purge removed from some read stream before the durable was delivered them
  (docs/protocol.md §6, Claim 2: such a removal counts as consumed there and may be carried
  to the other regions).
- `no_marker`: no delivery is on a marker subject (`_rsub.>`).
- `duplicates`: after a failover into region `b`, no message is delivered again from at or
  below the position `b`'s sidecar reported just before (`mark_delete`): what is delivered
  again is the consumed messages above it, covered by `b`'s progress or not
  (docs/protocol.md §6 "Duplicates"). `failover_counts` also measures how many covered ones
  came again beyond the `failover_exposure` reported then (see docs/reliability.md).
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
    if history.healed_at is None:
        return []  # a run stopped before its heal never drained: `survived` reports it
    published = sorted(p for payloads in history.published.values() for p in payloads)
    found: list[Violation] = []
    for durable in history.durables:
        delivered = {d.payload for d in history.deliveries if d.durable == durable}
        excused = {p for removal in history.removals for p in removal.undelivered.get(durable, [])}
        missing = [p for p in published if p not in delivered and p not in excused]
        stalled = any("drain deadline passed" in n for n in history.notes)
        if missing:
            found.append(
                Violation(
                    "no_loss",
                    f"durable {durable}: {len(missing)} acknowledged messages never delivered "
                    f"and not removed by limits: {_sample(missing)}"
                    + (" (the drain's deadline passed: skipped or stalled)" if stalled else ""),
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
    """Distinct messages consumed before the failover and delivered again after it."""
    rewound: list[str]
    """Of those, the ones delivered again from at or below the view's `mark_delete`."""
    uncovered: int
    """Of those, the ones `b`'s progress did not cover (consumed after the last vector)."""
    beyond_exposure: int
    """Covered ones delivered again beyond the `failover_exposure` the view reported."""


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
        again = [d for d in deliveries if d.stint == f.stint and d.payload in first]
        payloads = {d.payload for d in again}
        if f.view is None:
            counts.append(FailoverCount(f, len(payloads), [], 0, 0))
            continue
        view = f.view
        rewound = sorted({d.payload for d in again if d.read_seq <= view.mark_delete})
        uncovered = {p for p in payloads if not covered(first[p].origin, view.progress)}
        covered_again = len(payloads) - len(uncovered)
        beyond = max(0, covered_again - max(view.exposure or 0, 0))
        counts.append(FailoverCount(f, len(payloads), rewound, len(uncovered), beyond))
    return counts


def check_duplicates(history: History) -> list[Violation]:
    return [
        Violation(
            "duplicates",
            f"durable {c.failover.durable}, failover {c.failover.source}->{c.failover.target} "
            f"at {c.failover.at:.1f}s (stint {c.failover.stint}): {len(c.rewound)} messages "
            f"delivered again from at or below mark_delete {c.failover.view.mark_delete if c.failover.view else '?'}: "
            f"{_sample(c.rewound)}",
        )
        for c in failover_counts(history)
        if c.rewound
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
                u.durable == durable
                and u.region == region
                and before.started <= (u.at if u.until is None else u.until)
                and u.at <= after.at
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
        why = [n for n in history.notes if "run stopped early" in n]
        return [Violation("survived", f"the run never reached its heal {why}")]
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
        "failover_duplicates_uncovered": sum(c.uncovered for c in counts),
        "failover_duplicates_beyond_exposure": sum(c.beyond_exposure for c in counts),
        "failovers_beyond_exposure": sum(1 for c in counts if c.beyond_exposure),
        "failovers_without_view": sum(1 for f in history.failovers if f.view is None),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "fault_errors": sum(1 for f in history.faults if f.detail.startswith("error:")),
        "removed": sum(len(r.payloads) for r in history.removals),
    }
