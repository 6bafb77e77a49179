"""`StreamObserver`: what one virtual stream's machine reports, as metrics and structured logs.

Nothing here changes the protocol's course: the driver hands it every marker read (decoded
or rejected) and every event the machine returns, and the state after each step (for the
replay-gap gauges). A recurring warning (a rejected marker, a stale epoch) is logged as a
warning the first time per cause and at debug level after that, so a region replaying
junk cannot flood the log; the counters count every occurrence.
"""

from __future__ import annotations

from typing import Any, assert_never

import structlog

from sidecar.api.metrics import SidecarMetrics
from sidecar.protocol import (
    Event,
    IgnoreReason,
    LeadershipLost,
    Marker,
    MarkerIgnored,
    MarkerRejected,
    Rejected,
    SnapshotCompleted,
    SnapshotStarted,
    SnapshotTimedOut,
    StreamMachine,
    UpdateApplied,
    UpdateSent,
)
from sidecar.runtime.clock import now_ms

log = structlog.get_logger(__name__)


class StreamObserver:
    def __init__(self, name: str, metrics: SidecarMetrics) -> None:
        self._name = name
        self._metrics = metrics
        self._reported: set[str] = set()
        self._gap_series: set[str] = set()
        self._last_marker_ms: dict[str, int] = {}

    def marker_read(self, seq: int, decoded: Marker | Rejected) -> None:
        """A marker read from the read stream (replayed or tailed), before the machine sees it."""
        if isinstance(decoded, Rejected):
            reason = decoded.reason.value
            self._metrics.marker_rejected(self._name, reason)
            self._report_once(
                f"rejected:{reason}",
                "marker_rejected",
                seq=seq,
                reason=reason,
                detail=decoded.detail,
            )
            return
        self._last_marker_ms[decoded.region] = now_ms()
        self._metrics.marker_seen(self._name, decoded.region)

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
            case UpdateApplied():
                metrics.update_applied(name, event.from_region)
                log.info(
                    "update_applied",
                    stream=name,
                    subscription=event.subscription,
                    origin=event.from_region,
                    position=event.position,
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
            case LeadershipLost():
                log.warning(
                    "leadership_lost", stream=name, epoch=event.epoch, newer=event.newer_epoch
                )
            case MarkerRejected():
                pass  # counted and logged when read (`marker_read`), replayed markers included
            case _:
                assert_never(event)

    def machine_stepped(self, machine: StreamMachine) -> None:
        """Replay-gap gauges of the replicated subscriptions that sent an update; the series
        of a subscription that no longer qualifies are dropped, not left at a stale value."""
        live: set[str] = set()
        for sub in machine.subscriptions():
            sent = sub.last_update_sent
            if not sub.replicated or sent is None or sub.mark_delete is None:
                continue
            live.add(sub.name)
            gap = max(0, sub.mark_delete - sent.local_position)
            for region in sent.positions:
                self._metrics.set_replay_gap(self._name, sub.name, region, gap)
        for gone in self._gap_series - live:
            self._metrics.forget_subscription(self._name, gone)
        self._gap_series = live

    def _report_once(self, key: str, event: str, **fields: Any) -> None:
        if key in self._reported:
            log.debug(event, stream=self._name, **fields)
        else:
            self._reported.add(key)
            log.warning(event, stream=self._name, **fields)
