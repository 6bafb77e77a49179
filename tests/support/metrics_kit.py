"""A `SidecarMetrics` registry with a series of every metric, for tests that check names."""

from __future__ import annotations

from sidecar.metrics import SidecarMetrics


def touch_every_metric(metrics: SidecarMetrics) -> None:
    """Record one event of each kind, so every metric has a series (labels included)."""
    metrics.snapshot_started("s")
    metrics.snapshot_completed("s", 0.05)
    metrics.snapshot_timed_out("s")
    metrics.update_sent("s")
    metrics.update_applied("s", "east")
    metrics.marker_rejected("s", "stale_epoch")
    metrics.marker_seen("s", "east")
    metrics.set_replay_gap("s", "billing", "east", 12)
    metrics.set_failover_exposure("s", "billing", 4)
    metrics.set_consumed_in("s", "billing", 2)
    metrics.set_failback_held("s", 1)
    metrics.failback_released("s", 12.5, expired=False)
    metrics.set_origin_index_bytes("s", 48)
    metrics.set_durables_receiving_markers("s", 1)
    metrics.data_unknown_origin("s")
    metrics.set_leader("s", False, 3)
    metrics.set_nats_connected(False)
    metrics.set_streams("discovered", 2)
    metrics.stream_discovered()
    metrics.discovery_round(listed=True)
    metrics.discovery_round(listed=False)
    metrics.track_readiness(lambda: False)
    metrics.cursor_commit("s", "unavailable")
