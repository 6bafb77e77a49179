"""What a chaos run saw, recorded through public contracts only, and kept as JSON.

Times are seconds since the run's start (`time.monotonic()` based). Payloads are text
(`<region>-<n>`, as `rsub_dev.workload.Producer` publishes them).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """One message handed to the application on durable `durable` in `region`."""

    durable: str
    stint: int
    """Which stay of the durable in one region (0 before the first failover, +1 each)."""
    region: str
    payload: str
    subject: str
    read_seq: int
    origin: tuple[str, int] | None
    """(origin region, sequence there) from `Nats-Stream-Source`; None when unusable."""
    at: float


@dataclass(frozen=True)
class View:
    """A sidecar's view of a subscription (gRPC `GetSubscription`)."""

    mark_delete: int
    progress: dict[str, int]
    exposure: int | None
    """`failover_exposure`; None when no progress came."""


@dataclass(frozen=True)
class Failover:
    """The consumer of `durable` stopped in `source` and resumes in `target` as `stint`."""

    durable: str
    stint: int
    source: str
    target: str
    at: float
    view: View | None
    """`target`'s sidecar view read just before consuming there (None: not answering)."""
    target_last_seq: int
    """The last sequence of `target`'s read stream read just before consuming there."""


@dataclass(frozen=True)
class Position:
    """A durable's ack floor (stream sequence) in a region, read between `started` and `at`."""

    durable: str
    region: str
    started: float
    at: float
    floor: int
    source: str
    """"consumer" (JetStream consumer info) or "sidecar" (gRPC mark_delete)."""


@dataclass(frozen=True)
class Removal:
    """Data removed from `region`'s read stream by a purge (limits) at `at`."""

    region: str
    at: float
    below_seq: int
    payloads: list[str]
    undelivered: dict[str, list[str]]
    """Per durable: the removed payloads it had not been delivered yet when they went."""


@dataclass(frozen=True)
class UserDeletion:
    """A durable deleted by its user: between `at` (the request sent) and `until` (seen done;
    None: at `at`). A request that failed (timed out) may still have deleted it."""

    durable: str
    region: str
    at: float
    until: float | None = None


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    at: float
    healed_at: float | None
    detail: str = ""


@dataclass
class History:
    seed: int
    regions: list[str]
    durables: list[str]
    stream: str
    published: dict[str, list[str]] = field(default_factory=dict)
    """Per region: the payloads whose publish was acknowledged."""
    deliveries: list[Delivery] = field(default_factory=list)
    failovers: list[Failover] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    deletions: list[UserDeletion] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    healed_at: float | None = None
    sidecars_ready: dict[str, bool] = field(default_factory=dict)
    """Per region: /readyz answered 200 after the heal, without a restart by hand."""
    snapshots_after_heal: dict[str, bool] = field(default_factory=dict)
    """Per region: a snapshot completed after the heal (gRPC `ListSnapshots`)."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str) -> History:
        raw: dict[str, Any] = json.loads(text)

        def origin(value: list[Any] | None) -> tuple[str, int] | None:
            return None if value is None else (str(value[0]), int(value[1]))

        return cls(
            seed=raw["seed"],
            regions=raw["regions"],
            durables=raw["durables"],
            stream=raw["stream"],
            published=raw["published"],
            deliveries=[Delivery(**d | {"origin": origin(d["origin"])}) for d in raw["deliveries"]],
            failovers=[
                Failover(**f | {"view": View(**f["view"]) if f["view"] else None})
                for f in raw["failovers"]
            ],
            positions=[Position(**p) for p in raw["positions"]],
            removals=[Removal(**r) for r in raw["removals"]],
            deletions=[UserDeletion(**d) for d in raw["deletions"]],
            faults=[Fault(**f) for f in raw["faults"]],
            healed_at=raw["healed_at"],
            sidecars_ready=raw["sidecars_ready"],
            snapshots_after_heal=raw["snapshots_after_heal"],
            notes=raw["notes"],
        )
