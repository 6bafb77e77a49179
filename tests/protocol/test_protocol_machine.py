"""StreamMachine unit tests: Pulsar's builder scenarios, start rules, updates, fencing, restore."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sidecar.naming import VirtualStream
from sidecar.protocol import (
    AppliedUpdate,
    CreateConsumer,
    CreateCursor,
    IgnoreReason,
    LeadershipLost,
    MachineConfig,
    Marker,
    MarkerIgnored,
    MarkerRead,
    MarkerRejected,
    MoveConsumer,
    MoveCursor,
    Output,
    PublishLocal,
    PublishReplicated,
    Rejected,
    RejectReason,
    Request,
    Response,
    SentUpdate,
    Snapshot,
    SnapshotCompleted,
    SnapshotId,
    SnapshotStarted,
    SnapshotTimedOut,
    StoredMarker,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    UpdateApplied,
    UpdateSent,
    encode,
)

STREAM = "V"
SUBS = {"d": SubscriptionInfo(config=b"cfg-d")}


def machine(region: str, regions: Sequence[str], *, leader: bool = True) -> StreamMachine:
    m = StreamMachine(MachineConfig(region, STREAM, tuple(regions), timeout_ms=30_000))
    m.subscriptions_changed(SUBS)
    if leader:
        m.became_leader(1)
    return m


def stored(seq: int, marker: Marker) -> StoredMarker:
    """`marker` as the runtime reads it from the read stream: encoded, under its writer's subject."""
    subject = VirtualStream(STREAM, ("a", "b", "c")).marker_subject(marker.region)
    return StoredMarker(seq, subject, encode(marker))


def published(outputs: Sequence[Output]) -> list[Marker]:
    return [o.marker for o in outputs if isinstance(o, PublishReplicated | PublishLocal)]


def only(outputs: Sequence[Output], kind: type) -> list[object]:
    return [o for o in outputs if isinstance(o, kind)]


def start(m: StreamMachine, data_seq: int, now: int = 1_000) -> Marker:
    m.read_stream_advanced(data_seq)
    out = m.tick(now)
    assert only(out, SnapshotStarted)
    (request,) = published(out)
    assert isinstance(request.body, Request) and request.body.round == 1
    return request


def ignored(outputs: Sequence[Output]) -> list[IgnoreReason]:
    return [o.reason for o in outputs if isinstance(o, MarkerIgnored)]


def test_two_clusters_response_completes_at_its_own_position() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    request = start(a, data_seq=10)
    (response,) = published(b.marker_seen(20, request))
    assert response.body == Response(request.body.id, 1, 20)  # type: ignore[union-attr]
    assert a.marker_seen(11, request) == []  # own request seen; still waiting for b
    a.tick(1_250)
    out = a.marker_seen(15, response)
    (local,) = [o.marker for o in out if isinstance(o, PublishLocal)]
    snap = local.body
    assert isinstance(snap, Snapshot)
    assert (snap.local_position, dict(snap.positions)) == (15, {"b": 20})
    (done,) = only(out, SnapshotCompleted)
    assert done.duration_ms == 250  # type: ignore[attr-defined]
    assert a.pending() is None and a.last_completed_ms == 1_250


def test_two_clusters_local_position_waits_for_own_request() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    request = start(a, data_seq=10)
    (response,) = published(b.marker_seen(20, request))
    assert published(a.marker_seen(12, response)) == []  # own request not seen yet
    out = a.marker_seen(14, request)
    (snap,) = [o.marker.body for o in out if isinstance(o, PublishLocal)]
    assert isinstance(snap, Snapshot) and snap.local_position == 14


def test_three_clusters_two_rounds_keep_round_one_positions() -> None:
    a, b, c = machine("a", "abc"), machine("b", "abc"), machine("c", "abc")
    req1 = start(a, data_seq=10)
    (rb1,) = published(b.marker_seen(30, req1))
    (rc1,) = published(c.marker_seen(40, req1))
    assert a.marker_seen(11, req1) == []
    assert a.marker_seen(12, rb1) == []
    (req2,) = published(a.marker_seen(13, rc1))
    assert isinstance(req2.body, Request) and req2.body.round == 2
    assert a.pending().round == 2  # type: ignore[union-attr]
    (rb2,) = published(b.marker_seen(50, req2))
    (rc2,) = published(c.marker_seen(60, req2))
    assert published(a.marker_seen(18, req2)) == []
    assert published(a.marker_seen(20, rb2)) == []
    (local,) = published(a.marker_seen(25, rc2))
    assert isinstance(local.body, Snapshot)
    assert local.body.local_position == 25
    assert dict(local.body.positions) == {"b": 30, "c": 40}


def test_timeout_drops_attempt_and_ignores_late_responses() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    request = start(a, data_seq=10, now=1_000)
    a.marker_seen(11, request)
    assert a.tick(30_999) == []
    out = a.tick(31_000)
    (timed_out,) = only(out, SnapshotTimedOut)
    assert timed_out.missing == ("b",)  # type: ignore[attr-defined]
    (retry,) = only(out, SnapshotStarted)  # new data (10 > baseline 0): retried at once
    assert retry.id.counter == 2  # type: ignore[attr-defined]
    (response,) = published(b.marker_seen(20, request))
    assert ignored(a.marker_seen(12, response)) == [IgnoreReason.LATE_RESPONSE]
    assert a.completed_snapshots() == []


def test_start_rules() -> None:
    a = StreamMachine(MachineConfig("a", STREAM, ("a", "b")))
    a.became_leader(1)
    a.read_stream_advanced(5)
    assert a.tick(1_000) == []  # no replicated subscription
    a.subscriptions_changed({"x": SubscriptionInfo(replicated=False)})
    assert a.tick(2_000) == []
    a.subscriptions_changed({"x": SubscriptionInfo(replicated=True)})
    request = start(a, data_seq=5, now=3_000)
    assert a.tick(10_000) == []  # at most one pending attempt
    b = machine("b", "ab")
    a.marker_seen(6, request)
    (response,) = published(b.marker_seen(9, request))
    assert published(a.marker_seen(7, response))
    # Only markers arrived since the attempt started (request 6, response 7, snapshot 8).
    a.marker_seen(8, Marker("a", STREAM, 1, a.completed_snapshots()[0]))
    a.read_stream_advanced(8)
    assert a.tick(20_000) == []
    a.read_stream_advanced(9)  # data at 9
    assert only(a.tick(21_000), SnapshotStarted)


def test_follower_never_starts_or_answers() -> None:
    a = machine("a", "ab")
    b = machine("b", "ab", leader=False)
    request = start(a, data_seq=10)
    assert b.marker_seen(20, request) == []
    b.read_stream_advanced(30)
    assert b.tick(5_000) == []


def test_duplicate_request_and_response_change_nothing() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    request = start(a, data_seq=10)
    (response,) = published(b.marker_seen(20, request))
    assert ignored(b.marker_seen(21, request)) == [IgnoreReason.DUPLICATE]
    a.marker_seen(11, request)
    assert published(a.marker_seen(12, response))
    assert ignored(a.marker_seen(13, response)) == [IgnoreReason.LATE_RESPONSE]
    assert len(a.completed_snapshots()) == 1


def complete_two_region_snapshot(a: StreamMachine, b: StreamMachine) -> Snapshot:
    request = start(a, data_seq=10)
    (response,) = published(b.marker_seen(20, request))
    a.marker_seen(11, request)
    a.marker_seen(15, response)
    (snap,) = a.completed_snapshots()
    return snap


def test_update_sent_when_mark_delete_passes_snapshot() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    snap = complete_two_region_snapshot(a, b)
    assert a.positions_read({"d": 14}, 20) == []
    out = a.positions_read({"d": 15}, 20)
    (update,) = published(out)
    assert update.body == Update("d", SubscriptionKind.DURABLE, snap.id, 15, {"b": 20}, b"cfg-d")
    assert only(out, UpdateSent)
    assert a.positions_read({"d": 16}, 20) == []  # nothing newer
    view = a.subscription("d")
    assert view is not None and view.last_update_sent is not None
    assert view.last_update_sent.snapshot_id == snap.id and view.cached == 0


def test_update_applied_forward_only_and_create_if_absent() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    complete_two_region_snapshot(a, b)
    (update,) = published(a.positions_read({"d": 15}, 20))
    b.positions_read({"d": 5}, 30)
    out = b.marker_seen(31, update)
    assert only(out, UpdateApplied)
    assert only(out, MoveConsumer) == [MoveConsumer("d", 20)]
    assert b.action_done(MoveConsumer("d", 20), 20) == []  # test_protocol_actions.py
    assert b.subscription("d").mark_delete == 20  # type: ignore[union-attr]
    assert ignored(b.marker_seen(32, update)) == [IgnoreReason.DUPLICATE]
    # A consumer already past the position is not moved back.
    c = machine("b", "ab")
    c.positions_read({"d": 25}, 30)
    assert only(c.marker_seen(31, update), MoveConsumer) == []
    # Absent: created with the origin's configuration.
    e = StreamMachine(MachineConfig("b", STREAM, ("a", "b")))
    e.became_leader(1)
    assert only(e.marker_seen(31, update), CreateConsumer) == [CreateConsumer("d", b"cfg-d", 20)]
    applied = e.subscription("d").applied  # type: ignore[union-attr]
    assert [(x.from_region, x.position) for x in applied] == [("a", 20)]


def test_query_views_hold_the_last_update_sent_seen_and_applied() -> None:
    """`last_update_sent` and `applied` as the API shows them: the update this leader sent,
    or its predecessor's seen in the read stream, and the update applied, with their times."""
    a, b = machine("a", "ab"), machine("b", "ab")
    snap = complete_two_region_snapshot(a, b)
    a.tick(2_000)
    (update,) = published(a.positions_read({"d": 15}, 20))
    view = a.subscription("d")
    assert view is not None
    assert view.last_update_sent == SentUpdate(snap.id, 15, {"b": 20}, 2_000, {}, 0)
    follower = machine("a", "ab", leader=False)
    follower.tick(3_000)
    assert follower.marker_seen(21, update) == []
    seen = follower.subscription("d")
    assert seen is not None
    assert seen.last_update_sent == SentUpdate(snap.id, 15, {"b": 20}, 3_000, {}, 0)
    b.tick(4_000)
    b.positions_read({"d": 5}, 30)
    assert only(b.marker_seen(31, update), MoveConsumer) == [MoveConsumer("d", 20)]
    b.tick(5_000)
    assert ignored(b.marker_seen(32, update)) == [IgnoreReason.DUPLICATE]
    applied = b.subscription("d")
    assert applied is not None
    assert applied.applied == (AppliedUpdate("a", snap.id, 20, 4_000),)


def test_update_not_naming_region_older_or_not_replicated_is_ignored() -> None:
    sid1, sid2 = SnapshotId("a", 1, 1), SnapshotId("a", 1, 2)
    b = machine("b", "abc")
    b.positions_read({"d": 1}, 100)

    def upd(sid: SnapshotId, positions: dict[str, int], name: str = "d") -> Marker:
        return Marker(
            "a", STREAM, 1, Update(name, SubscriptionKind.DURABLE, sid, 9, positions, b"")
        )

    assert ignored(b.marker_seen(10, upd(sid1, {"c": 5}))) == [IgnoreReason.NOT_NAMED]
    assert only(b.marker_seen(11, upd(sid2, {"b": 50})), MoveConsumer)
    assert ignored(b.marker_seen(12, upd(sid1, {"b": 60}))) == [IgnoreReason.OLDER_UPDATE]
    b.subscriptions_changed({**SUBS, "plain": SubscriptionInfo(replicated=False)})
    assert ignored(b.marker_seen(13, upd(sid2, {"b": 9}, "plain"))) == [IgnoreReason.NOT_REPLICATED]


def test_external_cursor_moves_and_creates_cursors() -> None:
    sid = SnapshotId("a", 1, 1)
    marker = Marker(
        "a", STREAM, 1, Update("q", SubscriptionKind.EXTERNAL, sid, 9, {"b": 40}, b"spark")
    )
    b = machine("b", "ab")
    assert only(b.marker_seen(10, marker), CreateCursor) == [CreateCursor("q", b"spark", 40)]
    b2 = machine("b", "ab")
    b2.subscriptions_changed({"q": SubscriptionInfo(SubscriptionKind.EXTERNAL)})
    b2.positions_read({"q": 3}, 50)
    assert only(b2.marker_seen(10, marker), MoveCursor) == [MoveCursor("q", 40)]


def test_follower_records_update_and_new_leader_carries_it_out() -> None:
    sid = SnapshotId("a", 1, 1)
    marker = Marker("a", STREAM, 1, Update("d", SubscriptionKind.DURABLE, sid, 9, {"b": 40}, b""))
    b = machine("b", "ab", leader=False)
    b.positions_read({"d": 3}, 50)
    out = b.marker_seen(10, marker)
    assert only(out, UpdateApplied) and not only(out, MoveConsumer)
    assert only(b.became_leader(2), MoveConsumer) == [MoveConsumer("d", 40)]


def test_epoch_fencing() -> None:
    a = machine("a", "ab")
    b = machine("b", "ab")
    sid_new, sid_old = SnapshotId("a", 5, 1), SnapshotId("a", 4, 9)
    assert published(b.marker_seen(10, Marker("a", STREAM, 5, Request(sid_new, 1))))
    out = b.marker_seen(11, Marker("a", STREAM, 4, Request(sid_old, 1)))
    assert ignored(out) == [IgnoreReason.STALE_EPOCH] and not published(out)
    # A leader seeing its own region's newer epoch steps down.
    out = a.marker_seen(12, Marker("a", STREAM, 7, Request(SnapshotId("a", 7, 1), 1)))
    assert only(out, LeadershipLost) and not a.is_leader
    with pytest.raises(ValueError, match="older"):
        a.became_leader(6)


def test_rejected_markers_are_reported() -> None:
    a = machine("a", "ab")
    rejection = Rejected(RejectReason.MALFORMED, "not a marker")
    assert a.marker_rejected(4, rejection) == [MarkerRejected(4, rejection)]


def test_restore_from_stored_snapshots_then_lead() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    snap = complete_two_region_snapshot(a, b)
    stored_snap = stored(16, Marker("a", STREAM, 1, snap))
    config = MachineConfig("a", STREAM, ("a", "b"))
    restored, read = StreamMachine.restore(config, [stored_snap], SUBS, {"d": 3}, 40, 9_000)
    assert read == [MarkerRead(16, "a")]
    assert not restored.is_leader and restored.completed_snapshots() == [snap]
    assert restored.subscription("d").cached == 1  # type: ignore[union-attr]
    assert restored.became_leader(2) == []
    (update,) = published(restored.positions_read({"d": 16}, 40))
    assert isinstance(update.body, Update) and update.body.snapshot_id == snap.id
    assert update.epoch == 2
    # Ids stay unique after the restart: the new epoch is part of them.
    restored.read_stream_advanced(45)
    (req,) = published(restored.tick(10_000))
    assert req.body.id == SnapshotId("a", 2, 1)  # type: ignore[union-attr]


def test_cache_bounded_and_leader_echo_is_not_a_new_snapshot() -> None:
    a = StreamMachine(MachineConfig("a", STREAM, ("a",), cache_size=3))
    a.subscriptions_changed(SUBS)
    a.became_leader(1)
    seq = 0
    for i in range(6):
        seq += 2
        a.read_stream_advanced(seq - 1)
        (req,) = published(a.tick(1_000 * (i + 1)))
        (local,) = published(a.marker_seen(seq, req))
        assert a.marker_seen(seq + 1, local) == []
        seq += 1
    assert len(a.completed_snapshots()) == 6
    assert a.subscription("d").cached == 3  # type: ignore[union-attr]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="region 'x'"):
        MachineConfig("x", STREAM, ("a", "b"))
    with pytest.raises(ValueError, match="timeout_ms"):
        MachineConfig("a", STREAM, ("a", "b"), timeout_ms=0)


def test_snapshot_ids_never_repeat_when_an_epoch_is_reused() -> None:
    a = machine("a", "ab")
    first = start(a, data_seq=10)
    a.became_follower()
    a.became_leader(1)  # the same term handed back
    a.read_stream_advanced(20)
    (second,) = published(a.tick(2_000))
    # A restarted sidecar given the same epoch again still continues after the stored ids.
    config = MachineConfig("a", STREAM, ("a", "b"))
    markers = [stored(11, first), stored(21, second)]
    restored, _ = StreamMachine.restore(config, markers, SUBS, {}, 30, 3_000)
    restored.became_leader(1)
    restored.read_stream_advanced(35)
    (third,) = published(restored.tick(4_000))
    ids = [m.body.id for m in (first, second, third)]  # type: ignore[union-attr]
    assert len(set(ids)) == 3 and [i.counter for i in ids] == [1, 2, 3]


def test_trigger_starts_at_once_without_new_data_or_waiting_for_the_interval() -> None:
    a, b = machine("a", "ab"), machine("b", "ab")
    complete_two_region_snapshot(a, b)  # started at 1_000; only its markers since
    assert a.tick(1_100) == []  # neither the interval passed nor new data arrived
    out = a.trigger(1_100)
    (started,) = only(out, SnapshotStarted)
    (request,) = published(out)
    assert request.body == Request(started.id, 1)  # type: ignore[attr-defined]
    pending = a.pending()
    assert pending is not None and pending.id == started.id  # type: ignore[attr-defined]
    assert pending.started_ms == 1_100


def test_trigger_never_starts_a_second_attempt_while_one_is_pending() -> None:
    a = machine("a", "ab")
    request = start(a, data_seq=10, now=1_000)
    assert a.trigger(1_500) == []
    pending = a.pending()
    assert pending is not None and pending.id == request.body.id  # type: ignore[union-attr]


def test_trigger_after_a_timeout_starts_exactly_one_attempt() -> None:
    a = machine("a", "ab")
    start(a, data_seq=10, now=1_000)
    out = a.trigger(31_000)  # the tick part times the attempt out and retries at once
    assert len(only(out, SnapshotTimedOut)) == 1 and len(only(out, SnapshotStarted)) == 1
    assert len(published(out)) == 1


def test_trigger_needs_a_leader_and_a_replicated_subscription() -> None:
    a = StreamMachine(MachineConfig("a", STREAM, ("a", "b")))
    a.became_leader(1)
    a.read_stream_advanced(5)
    assert a.trigger(1_000) == []  # no subscription at all
    a.subscriptions_changed({"x": SubscriptionInfo(replicated=False)})
    assert a.trigger(2_000) == [] and a.pending() is None
    follower = machine("b", "ab", leader=False)
    assert follower.trigger(3_000) == [] and follower.pending() is None
    a.subscriptions_changed({"x": SubscriptionInfo(kind=SubscriptionKind.EXTERNAL)})
    assert only(a.trigger(4_000), SnapshotStarted)
