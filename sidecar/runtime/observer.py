"""`StreamObserver`: what one virtual stream's machine reports, as metrics and structured logs.

Nothing here changes the protocol's course: the driver hands it every event the machine
returns (a marker read or rejected among them, replayed ones included), every data message
read without a usable origin, and the state after each step (for the replay-gap, exposure and index gauges). A
recurring warning (a rejected marker, a stale epoch, data of unknown origin) is logged as a
warning the first time per cause and at debug level after that, so a region replaying
junk cannot flood the log; the counters count every occurrence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, assert_never

import structlog

from sidecar.metrics import SidecarMetrics
from sidecar.naming import data_filter_of
from sidecar.protocol import (
    Event,
    FailbackHeld,
    FailbackReleased,
    IgnoreReason,
    LeadershipLost,
    MarkerIgnored,
    MarkerRead,
    MarkerRejected,
    RejectReason,
    SnapshotCompleted,
    SnapshotId,
    SnapshotStarted,
    SnapshotTimedOut,
    StreamMachine,
    UpdateApplied,
    UpdateSent,
)
from sidecar.runtime.clock import Clock

log = structlog.get_logger(__name__)

# Memory of one run of the origin index: three array('q') columns (`origins.OriginIndex`).
_INDEX_RUN_BYTES = 24


class StreamObserver:
    def __init__(self, name: str, metrics: SidecarMetrics, clock: Clock) -> None:
        self._name = name
        self._metrics = metrics
        self._clock = clock
        metrics.stream_added(
            name, [*(r.value for r in RejectReason), IgnoreReason.STALE_EPOCH.value]
        )
        self._reported: set[str] = set()
        # The values last set, per subscription (`machine_stepped`).
        self._index_bytes = -1
        self._held = 0
        self._gaps: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._exposures: dict[str, int] = {}
        self._consumed_in: dict[str, int] = {}  # nonzero only
        self._last_marker_ms: dict[str, int] = {}
        self._receiving_markers: frozenset[str] | None = None  # None: no positions read yet

    def unknown_origin(self, read_seq: int) -> None:
        """A data message read (replayed or tailed) without a usable origin: counted, and
        logged the first time only (data can be plenty; not even a debug line per message)."""
        self._metrics.data_unknown_origin(self._name)
        if "unknown_origin" not in self._reported:
            self._reported.add("unknown_origin")
            log.warning(
                "data_unknown_origin",
                stream=self._name,
                seq=read_seq,
                detail="no Nats-Stream-Source header naming a write stream of a known region",
            )

    def consumer_creation_asked_again(self) -> None:
        """A creation of one of the stream's tail or replay consumers asked again (logged
        where it is asked: `consumer_creation_asked_again`): counted, for the region."""
        self._metrics.consumer_creation_asked_again()

    def durables_receiving_markers(self, filters: Mapping[str, tuple[str, ...]]) -> None:
        """The replicated durables whose filter lets the markers through, with their filter
        subjects, as a positions read found them: the gauge, and a warning for each the first
        time it is found so (again if it was fixed since)."""
        names = frozenset(filters)
        for name in sorted(names - (self._receiving_markers or frozenset())):
            log.warning(
                "durable_receives_markers",
                stream=self._name,
                subscription=name,
                filters=list(filters[name]),
                detail="its filter lets the stream's markers through, so its client receives "
                f"them: filter it on {data_filter_of(self._name)!r} (docs/topology.md)",
            )
        if names != self._receiving_markers:
            self._metrics.set_durables_receiving_markers(self._name, len(names))
            self._receiving_markers = names

    def last_marker_age_ms(self, origin: str, now: int) -> int | None:
        """How long ago a marker written by `origin` was last read here (None: never)."""
        seen = self._last_marker_ms.get(origin)
        return now - seen if seen is not None else None

    def event(self, event: Event) -> None:
        name, metrics = self._name, self._metrics
        match event:
            case SnapshotStarted():
                metrics.snapshot_started(name)
            case SnapshotCompleted():
                metrics.snapshot_completed(name, event.duration_ms / 1000)
                log.debug("snapshot_completed", stream=name, id=str(event.snapshot.id))
            case SnapshotTimedOut():
                metrics.snapshot_timed_out(name)
                log.warning(
                    "snapshot_timed_out", stream=name, id=str(event.id), missing=event.missing
                )
            case UpdateSent():
                metrics.update_sent(name)
                log.debug(
                    "update_sent",
                    stream=name,
                    subscription=event.subscription,
                    snapshot_id=_id(event.snapshot_id),
                    progress=dict(event.progress),
                )
            case UpdateApplied():
                metrics.update_applied(name, event.from_region)
                log.info(
                    "update_applied",
                    stream=name,
                    subscription=event.subscription,
                    origin=event.from_region,
                    snapshot_id=_id(event.snapshot_id),
                    position=event.position,
                    progress=dict(event.progress),
                )
            case MarkerIgnored(reason=IgnoreReason.STALE_EPOCH):
                metrics.marker_rejected(name, event.reason.value)
                self._report_once(
                    f"ignored:{event.region}",
                    "marker_stale_epoch",
                    origin=event.region,
                    detail=event.detail,
                )
            case MarkerIgnored():
                log.debug(
                    "marker_ignored", stream=name, reason=event.reason.value, detail=event.detail
                )
            case FailbackHeld():
                log.warning(
                    "failback_held",
                    stream=name,
                    subscriptions=list(event.subscriptions),
                    waiting=list(event.waiting),
                    adopted=event.adopted,
                )
            case FailbackReleased():
                metrics.failback_released(name, event.held_ms / 1000, bool(event.missing))
                log.log(
                    logging.WARNING if event.missing else logging.INFO,
                    "failback_released",
                    stream=name,
                    subscription=event.subscription,
                    held_ms=event.held_ms,
                    missing=list(event.missing),
                )
            case LeadershipLost():
                log.warning(
                    "leadership_lost", stream=name, epoch=event.epoch, newer=event.newer_epoch
                )
            case MarkerRead():  # replayed or tailed
                self._last_marker_ms[event.region] = self._clock()
                metrics.marker_seen(name, event.region)
            case MarkerRejected():  # replayed or tailed
                reason = event.rejected.reason.value
                metrics.marker_rejected(name, reason)
                self._report_once(
                    f"rejected:{reason}",
                    "marker_rejected",
                    seq=event.read_seq,
                    reason=reason,
                    detail=event.rejected.detail,
                )
            case _:
                assert_never(event)

    def machine_stepped(self, machine: StreamMachine) -> None:
        """Replay-gap gauges of the replicated subscriptions that sent an update, exposure
        gauges of those that received progress, the regions consuming each, the durables
        the failback guard holds, the origin index's size; the series of a
        subscription that no longer qualifies are dropped, not left at a stale value. Only
        values that changed are set (building every subscription's full view and setting every
        series showed in the profiles at a thousand loaded streams: docs/benchmarks.md, "Many
        streams")."""
        metrics, name = self._metrics, self._name
        if machine.held != self._held:
            self._held = machine.held
            metrics.set_failback_held(name, self._held)
        index_bytes = machine.origin_index_runs * _INDEX_RUN_BYTES
        if index_bytes != self._index_bytes:
            self._index_bytes = index_bytes
            metrics.set_origin_index_bytes(name, index_bytes)
        gaps: dict[str, tuple[int, tuple[str, ...]]] = {}
        exposures: dict[str, int] = {}
        consumed_in: dict[str, int] = {}
        for sub in machine.gauges():
            if sub.consumed_in:
                consumed_in[sub.name] = sub.consumed_in
            if sub.exposure is not None:
                exposures[sub.name] = sub.exposure
            if sub.replay_gap is not None:
                gaps[sub.name] = (sub.replay_gap, sub.regions)
        for sub_name, exposure in exposures.items():
            if self._exposures.get(sub_name) != exposure:
                metrics.set_failover_exposure(name, sub_name, exposure)
        for gone in self._exposures.keys() - exposures.keys():
            metrics.set_failover_exposure(name, gone, None)
        for sub_name, (gap, regions) in gaps.items():
            if self._gaps.get(sub_name) != (gap, regions):
                for region in regions:
                    metrics.set_replay_gap(name, sub_name, region, gap)
        for gone in self._gaps.keys() - gaps.keys():
            metrics.forget_subscription(name, gone)
        for sub_name, count in consumed_in.items():
            if self._consumed_in.get(sub_name) != count:
                metrics.set_consumed_in(name, sub_name, count)
        for gone in self._consumed_in.keys() - consumed_in.keys():
            metrics.set_consumed_in(name, gone, 0)
        self._gaps, self._exposures, self._consumed_in = gaps, exposures, consumed_in

    def _report_once(self, key: str, event: str, **fields: Any) -> None:
        if key in self._reported:
            log.debug(event, stream=self._name, **fields)
        else:
            self._reported.add(key)
            log.warning(event, stream=self._name, **fields)


def _id(snapshot_id: SnapshotId | None) -> str | None:
    return str(snapshot_id) if snapshot_id is not None else None
