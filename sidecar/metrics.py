"""Prometheus metrics of one sidecar, in a registry of its own (never the global one).

The runtime calls the methods of `SidecarMetrics` as things happen; ages ("seconds since the
last ...") are computed at scrape time from recorded instants, so they keep growing while
nothing happens, which is exactly when they matter. docs/api.md lists every metric.

A scrape collects the registry in another thread than the event loop that records
(sidecar/api/http_server.py): prometheus_client's metrics lock their values and children,
`_AgeCollector` its instants, and `track_readiness`'s function only reads flags.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import sidecar

# 10 ms .. 60 s: two regions on one host answer in milliseconds, distant regions in
# hundreds of milliseconds, and the default snapshot timeout is 30 s.
SNAPSHOT_DURATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
# Sourcing between regions resumes 30-45 s after a region returns (docs/operations.md).
FAILBACK_HOLD_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300)


class _AgeCollector(Collector):
    """A gauge of seconds elapsed since an instant recorded per label set."""

    def __init__(
        self, name: str, documentation: str, labels: tuple[str, ...], clock: Callable[[], float]
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._clock = clock
        self._instants: dict[tuple[str, ...], float] = {}
        # Held for a dict operation at most: touched on the loop, collected in a thread.
        self._lock = threading.Lock()

    def touch(self, *label_values: str) -> None:
        with self._lock:
            self._instants[label_values] = self._clock()

    def forget(self, first_label: str) -> None:
        """Drop every series whose first label value is `first_label`."""
        with self._lock:
            for labels in [k for k in self._instants if k[:1] == (first_label,)]:
                del self._instants[labels]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        with self._lock:
            instants = list(self._instants.items())
        now = self._clock()
        for label_values, instant in sorted(instants):
            family.add_metric(label_values, max(0.0, now - instant))
        yield family


class SidecarMetrics:
    """All metrics of one sidecar; `registry` is what /metrics serves."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        # No `*_created` series: one per counter and label set, and nothing reads them.
        # (A process-wide switch of prometheus_client; this process has no other registry.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(
            registry=r
        )  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        Info("rsub_build", "The running rsub build.", registry=r).info(
            {"version": sidecar.__version__, "python": platform.python_version()}
        )
        self._snapshots_started = Counter(
            "rsub_snapshots_started_total", "Snapshot attempts started.", ["stream"], registry=r
        )
        self._snapshots_completed = Counter(
            "rsub_snapshots_completed_total",
            "Snapshots completed (every region answered).",
            ["stream"],
            registry=r,
        )
        self._snapshots_timed_out = Counter(
            "rsub_snapshots_timed_out_total",
            "Snapshot attempts dropped after the timeout.",
            ["stream"],
            registry=r,
        )
        self._snapshot_duration = Histogram(
            "rsub_snapshot_duration_seconds",
            "Time from a snapshot's first request to its completion.",
            ["stream"],
            buckets=SNAPSHOT_DURATION_BUCKETS_S,
            registry=r,
        )
        self._updates_sent = Counter(
            "rsub_updates_sent_total",
            "Subscription updates written for other regions.",
            ["stream"],
            registry=r,
        )
        self._position_reads = Counter(
            "rsub_position_reads_total",
            "Reads of a stream's subscription positions (consumer listing, cursors).",
            ["stream"],
            registry=r,
        )
        self._updates_applied = Counter(
            "rsub_updates_applied_total",
            "Subscription updates from other regions that moved a subscription here.",
            ["stream", "origin"],
            registry=r,
        )
        self._failback_held = Gauge(
            "rsub_failback_held_durables",
            "Replicated durables held (paused) by the failback guard while their region "
            "catches up with what the other regions consumed (docs/protocol.md §7).",
            ["stream"],
            registry=r,
        )
        self._failback_hold = Histogram(
            "rsub_failback_hold_seconds",
            "How long the failback guard held a durable, by how it ended: released once "
            "every region answered (caught_up) or at the hold's limit (expired).",
            ["stream", "outcome"],
            buckets=FAILBACK_HOLD_BUCKETS_S,
            registry=r,
        )
        self._markers_rejected = Counter(
            "rsub_markers_rejected_total",
            "Markers skipped (malformed, unknown region, stale epoch, ...).",
            ["stream", "reason"],
            registry=r,
        )
        self._replay_gap = Gauge(
            "rsub_subscription_replay_gap_messages",
            "Read-stream sequences between a subscription's mark-delete here and the local "
            "position of the snapshot in the last update sent to a region (updates with a "
            "progress vector only leave it): what a failover there replays at most by "
            "snapshots alone.",
            ["stream", "subscription", "region"],
            registry=r,
        )
        self._replay_gap_series: set[tuple[str, str, str]] = set()
        self._failover_exposure = Gauge(
            "rsub_failover_exposure_messages",
            "Data messages above a subscription's mark-delete here that the progress received "
            "for it covers: what a consumer here would receive again if the region it is "
            "consumed in were lost now (absent until progress arrives).",
            ["stream", "subscription"],
            registry=r,
        )
        self._exposure_series: set[tuple[str, str]] = set()
        self._consumed_in = Gauge(
            "rsub_subscription_consumed_in_regions",
            "Regions whose consumers passed a replicated subscription's data in the last ten "
            "snapshot intervals, as this region knows them: above 1, it is consumed in two "
            "regions at once and each delivers every message (absent when 0).",
            ["stream", "subscription"],
            registry=r,
        )
        self._origin_index_bytes = Gauge(
            "rsub_origin_index_bytes",
            "Memory held by the origin index of the stream's read stream (24 bytes per run).",
            ["stream"],
            registry=r,
        )
        self._durables_receiving_markers = Gauge(
            "rsub_durables_receiving_markers",
            "Replicated durables of the stream here whose filter lets its markers through, so "
            "their clients receive them (filter them on the stream's data subjects).",
            ["stream"],
            registry=r,
        )
        self._data_unknown_origin = Counter(
            "rsub_data_unknown_origin_total",
            "Data messages of the read stream without a usable origin (no Nats-Stream-Source "
            "header, or one naming a stream of no known region): no progress covers them.",
            ["stream"],
            registry=r,
        )
        self._leader = Gauge(
            "rsub_leader", "1 when this sidecar leads the stream.", ["stream"], registry=r
        )
        self._epoch = Gauge(
            "rsub_leader_epoch",
            "The stream's leader epoch (its shard lease's revision) last seen.",
            ["stream"],
            registry=r,
        )
        self._nats_connected = Gauge(
            "rsub_nats_connected", "1 while connected to the region's NATS.", registry=r
        )
        self._ready = Gauge(
            "rsub_ready",
            "1 while the sidecar is ready (/readyz answers 200): connected, topology applied, "
            "leadership known, every stream rebuilt.",
            registry=r,
        )
        self._cursor_commits = Counter(
            "rsub_cursor_commits_total",
            "CommitCursor calls answered, by result: ok, or the gRPC status of the failure "
            "(unavailable, not_found, invalid_argument, ...).",
            ["stream", "result"],
            registry=r,
        )
        self._creations_asked_again = Counter(
            "rsub_consumer_creations_asked_again_total",
            "Creations of a tail's or a replay's consumer the server left unanswered (timed "
            "out, no responders, JetStream unavailable) and asked again under the same name: "
            "the region's servers are overloaded, or without a JetStream meta leader.",
            registry=r,
        )
        self._last_snapshot = _AgeCollector(
            "rsub_last_snapshot_age_seconds",
            "Seconds since the last snapshot completed (absent before the first one).",
            ("stream",),
            clock,
        )
        self._last_marker = _AgeCollector(
            "rsub_origin_last_marker_age_seconds",
            "Seconds since a marker written by the origin region was last seen here.",
            ("stream", "origin"),
            clock,
        )
        self._streams = Gauge(
            "rsub_streams",
            "Virtual streams this sidecar runs, by source: listed in the configuration, or "
            "discovered.",
            ["source"],
            registry=r,
        )
        self._streams_rebuilt = Gauge(
            "rsub_streams_rebuilt",
            "Virtual streams rebuilt and running: each answers the API from then on (the "
            "progress of a start, against rsub_streams summed over its sources).",
            registry=r,
        )
        self._streams_discovered = Counter(
            "rsub_streams_discovered_total",
            "Virtual streams taken up because discovery found them.",
            registry=r,
        )
        self._streams_dropped = Counter(
            "rsub_streams_dropped_total",
            "Discovered virtual streams stopped and forgotten because their read stream here "
            "was deleted.",
            registry=r,
        )
        self._discovery_failures = Counter(
            "rsub_discovery_rounds_failed_total",
            "Discovery rounds that could not list the account's streams (retried next round; "
            "no stream is dropped for it).",
            registry=r,
        )
        self._last_discovery = _AgeCollector(
            "rsub_discovery_last_round_age_seconds",
            "Seconds since the last discovery round that listed the account's streams "
            "(absent with discovery off, or before the first round).",
            (),
            clock,
        )
        r.register(self._last_snapshot)
        r.register(self._last_marker)
        r.register(self._last_discovery)

    def stream_added(self, stream: str, rejection_reasons: Iterable[str]) -> None:
        """The stream's counters at 0 from the start: Prometheus' rate() and increase() see
        no increase in a series' first sample, so one that appeared at 1 (the first timeout,
        the first rejected marker) would never make an alert fire."""
        for counter in (
            self._snapshots_started,
            self._snapshots_completed,
            self._snapshots_timed_out,
            self._updates_sent,
            self._data_unknown_origin,
        ):
            counter.labels(stream)
        for reason in rejection_reasons:
            self._markers_rejected.labels(stream, reason)
        self._cursor_commits.labels(stream, "ok")

    def snapshot_started(self, stream: str) -> None:
        self._snapshots_started.labels(stream).inc()

    def snapshot_completed(self, stream: str, duration_s: float) -> None:
        self._snapshots_completed.labels(stream).inc()
        self._snapshot_duration.labels(stream).observe(duration_s)
        self._last_snapshot.touch(stream)

    def snapshot_timed_out(self, stream: str) -> None:
        self._snapshots_timed_out.labels(stream).inc()

    def update_sent(self, stream: str) -> None:
        self._updates_sent.labels(stream).inc()

    def position_read(self, stream: str) -> None:
        self._position_reads.labels(stream).inc()

    def update_applied(self, stream: str, origin: str) -> None:
        self._updates_applied.labels(stream, origin).inc()

    def set_failback_held(self, stream: str, durables: int) -> None:
        self._failback_held.labels(stream).set(durables)

    def failback_released(self, stream: str, held_s: float, expired: bool) -> None:
        outcome = "expired" if expired else "caught_up"
        self._failback_hold.labels(stream, outcome).observe(held_s)

    def marker_rejected(self, stream: str, reason: str) -> None:
        """`reason` is a short fixed word (e.g. malformed, unknown_region, stale_epoch)."""
        self._markers_rejected.labels(stream, reason).inc()

    def marker_seen(self, stream: str, origin: str) -> None:
        self._last_marker.touch(stream, origin)

    def set_replay_gap(self, stream: str, subscription: str, region: str, messages: int) -> None:
        self._replay_gap.labels(stream, subscription, region).set(messages)
        self._replay_gap_series.add((stream, subscription, region))

    def forget_subscription(self, stream: str, subscription: str) -> None:
        """Drop the series of a deleted (or no longer replicated) subscription."""
        for labels in [k for k in self._replay_gap_series if k[:2] == (stream, subscription)]:
            self._replay_gap.remove(*labels)
            self._replay_gap_series.discard(labels)

    def set_failover_exposure(self, stream: str, subscription: str, messages: int | None) -> None:
        """`None` (no progress received, or the subscription is gone) removes the series."""
        labels = (stream, subscription)
        if messages is not None:
            self._failover_exposure.labels(*labels).set(messages)
            self._exposure_series.add(labels)
        elif labels in self._exposure_series:
            self._failover_exposure.remove(*labels)
            self._exposure_series.discard(labels)

    def set_consumed_in(self, stream: str, subscription: str, regions: int) -> None:
        """0 (no region consumes it now, or it is gone) removes the series."""
        if regions:
            self._consumed_in.labels(stream, subscription).set(regions)
        else:
            self._consumed_in.remove(stream, subscription)

    def set_origin_index_bytes(self, stream: str, size: int) -> None:
        self._origin_index_bytes.labels(stream).set(size)

    def set_durables_receiving_markers(self, stream: str, durables: int) -> None:
        self._durables_receiving_markers.labels(stream).set(durables)

    def data_unknown_origin(self, stream: str) -> None:
        self._data_unknown_origin.labels(stream).inc()

    def set_leader(self, stream: str, leader: bool, epoch: int) -> None:
        self._leader.labels(stream).set(int(leader))
        self._epoch.labels(stream).set(epoch)

    def set_nats_connected(self, connected: bool) -> None:
        self._nats_connected.set(int(connected))

    def set_streams(self, source: str, count: int) -> None:
        """`source` is `listed` or `discovered`."""
        self._streams.labels(source).set(count)

    def set_streams_rebuilt(self, count: int) -> None:
        self._streams_rebuilt.set(count)

    def stream_discovered(self) -> None:
        self._streams_discovered.inc()

    def stream_dropped(self, stream: str) -> None:
        """A discovered stream is gone: count it and drop its gauges' series, which would
        otherwise stay frozen (and its snapshot age grow) for a stream that no longer is.
        Its counters stay: they only ever count what happened."""
        self._streams_dropped.inc()
        for gauge in (
            self._leader,
            self._epoch,
            self._origin_index_bytes,
            self._durables_receiving_markers,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(stream)
        for subscription in {sub for st, sub, _ in self._replay_gap_series if st == stream}:
            self.forget_subscription(stream, subscription)
        for labels in [k for k in self._exposure_series if k[0] == stream]:
            self.set_failover_exposure(*labels, None)
        self._last_snapshot.forget(stream)
        self._last_marker.forget(stream)

    def discovery_round(self, listed: bool) -> None:
        """A discovery round listed the streams (`listed`), or failed to."""
        if listed:
            self._last_discovery.touch()
        else:
            self._discovery_failures.inc()

    def consumer_creation_asked_again(self) -> None:
        self._creations_asked_again.inc()

    def track_readiness(self, ready: Callable[[], bool]) -> None:
        """`rsub_ready` reads `ready()` at every scrape (readiness is computed, not an event),
        in the scrape's thread: `ready` must only read (the runtime's flags)."""
        self._ready.set_function(lambda: float(ready()))

    def cursor_commit(self, stream: str, result: str) -> None:
        """`stream` is "" when the request named no configured stream (no series per bad
        name); `result` is "ok" or a gRPC status code's name in lower case."""
        self._cursor_commits.labels(stream, result).inc()
