"""`StreamObserver.machine_stepped` against a real `StreamMachine`: what the replay-gap gauge
measures once updates carry progress vectors (pure: no NATS, no clock); and the one time the
observer reads, from the clock it is given."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.metrics import SidecarMetrics
from sidecar.protocol import (
    MachineConfig,
    Marker,
    MarkerRead,
    Output,
    PublishLocal,
    PublishReplicated,
    Request,
    StreamMachine,
    SubscriptionInfo,
    Update,
)
from sidecar.protocol.origins import DataEntry
from sidecar.runtime.observer import StreamObserver

STREAM = "V"
INTERVAL_MS = 1_000
GAP = "rsub_subscription_replay_gap_messages"


def never() -> int:
    raise AssertionError("the gauges read no clock")


def leader(region: str) -> StreamMachine:
    m = StreamMachine(MachineConfig(region, STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    m.subscriptions_changed({"d": SubscriptionInfo(config=b"cfg-d")})
    m.became_leader(1)
    return m


def published(outputs: Sequence[Output]) -> list[Marker]:
    return [o.marker for o in outputs if isinstance(o, PublishReplicated | PublishLocal)]


def snapshotted() -> StreamMachine:
    """Leader `a` of regions `a` and `b`, with one snapshot completed at local position 12
    over its data 1-10."""
    a, b = leader("a"), leader("b")
    a.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 11)])
    a.read_stream_advanced(10)
    (request,) = published(a.tick(1_000))
    assert isinstance(request.body, Request)
    (response,) = published(b.marker_seen(20, request))
    a.marker_seen(11, request)
    a.marker_seen(12, response)
    assert len(a.completed_snapshots()) == 1
    return a


def gap(metrics: SidecarMetrics) -> float | None:
    return metrics.registry.get_sample_value(
        GAP, {"stream": STREAM, "subscription": "d", "region": "b"}
    )


def test_the_replay_gap_grows_past_the_last_snapshot_sent_while_vectors_go_out() -> None:
    """East (`b`) stopped answering: no snapshot completes, yet `a` keeps sending vectors as
    `d` is consumed. The gauge stays measured from the last update with a snapshot (what a
    failover to `b` replays by snapshots alone), so it grows with the consumption: a vector
    sent must not reset it (that would hide the fault `RsubReplayGapHigh` is for)."""
    a = snapshotted()
    metrics = SidecarMetrics()
    observer = StreamObserver(STREAM, metrics, never)
    a.positions_read({"d": 12}, 12)  # past the snapshot (local position 12): an update
    observer.machine_stepped(a)
    assert gap(metrics) == 0

    # `b` is gone: the next snapshot never completes; `d` is consumed to 90 meanwhile.
    a.data_indexed([DataEntry(seq, "a", seq) for seq in range(13, 91)])
    a.read_stream_advanced(90)
    a.tick(2_500)
    (vector,) = [m.body for m in published(a.positions_read({"d": 90}, 90))]
    assert a.pending() is not None  # the snapshot started at 2 500 waits for `b`
    # The update carries the vector and, again, the last snapshot sent (local position 12).
    assert isinstance(vector, Update)
    assert (dict(vector.progress), vector.local_position) == ({"a": 90}, 12)
    observer.machine_stepped(a)
    assert gap(metrics) == 90 - 12


def test_the_gauges_follow_each_step_and_go_with_their_subscription() -> None:
    """The observer sets only what changed since its last look: a value that changes after
    steps that changed nothing still reaches the gauge, and a deleted subscription's series go."""
    a = snapshotted()
    metrics = SidecarMetrics()
    observer = StreamObserver(STREAM, metrics, never)
    a.positions_read({"d": 12}, 12)
    for _ in range(2):  # unchanged: nothing to set
        observer.machine_stepped(a)
    assert gap(metrics) == 0
    a.data_indexed([DataEntry(seq, "a", seq) for seq in range(13, 41)])
    a.read_stream_advanced(40)
    a.positions_read({"d": 40}, 40)
    observer.machine_stepped(a)
    assert gap(metrics) == 40 - 12
    a.subscriptions_changed({})
    observer.machine_stepped(a)
    assert gap(metrics) is None


def test_a_marker_read_is_stamped_by_the_clock_the_observer_is_given() -> None:
    """The runtime reads the time only from its handles' clock (a simulation's virtual time
    under simulation), never the wall clock behind its back."""
    now = 5_000
    observer = StreamObserver(STREAM, SidecarMetrics(), lambda: now)
    assert observer.last_marker_age_ms("b", now) is None
    observer.event(MarkerRead(read_seq=3, region="b"))
    assert observer.last_marker_age_ms("b", 5_250) == 250
