"""Progress vectors in the machine (DESIGN §7): sent without snapshots, applied exactly."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.protocol import (
    CreateConsumer,
    MachineConfig,
    Marker,
    MoveConsumer,
    Output,
    PublishReplicated,
    SnapshotId,
    StreamMachine,
    SubscriptionInfo,
    Update,
    UpdateApplied,
    decode,
    encode,
    marker_msg_id,
)
from sidecar.protocol.origins import DataEntry

STREAM = "V"
REGIONS = ("a", "b", "c")
SUBS = {"d": SubscriptionInfo(config=b"cfg-d")}
INTERVAL = 1000


def machine(region: str, *, subs: bool = True) -> StreamMachine:
    m = StreamMachine(MachineConfig(region, STREAM, REGIONS, interval_ms=INTERVAL))
    if subs:
        m.subscriptions_changed(SUBS)
    m.became_leader(1)
    return m


def updates(outputs: Sequence[Output]) -> list[Marker]:
    return [
        o.marker
        for o in outputs
        if isinstance(o, PublishReplicated) and isinstance(o.marker.body, Update)
    ]


def entries(*spec: tuple[int, str, int]) -> list[DataEntry]:
    return [DataEntry(*e) for e in spec]


# Q_a: a1 b1 a2 c1 b2 a3 ; Q_b: b1 b2 a1 a2 c1 a3 (the same messages, other interleaving)
Q_A = entries((1, "a", 1), (2, "b", 1), (3, "a", 2), (4, "c", 1), (5, "b", 2), (6, "a", 3))
Q_B = entries((1, "b", 1), (2, "b", 2), (3, "a", 1), (4, "a", 2), (5, "c", 1), (6, "a", 3))


def test_a_vector_goes_out_without_any_snapshot_and_at_most_once_per_interval() -> None:
    a = machine("a")
    a.data_indexed(Q_A)
    a.tick(1_000)
    (marker,) = updates(a.positions_read({"d": 3}, 6))
    body = marker.body
    assert isinstance(body, Update) and body.snapshot_id is None
    assert (dict(body.progress), body.progress_position) == ({"a": 2, "b": 1}, 3)
    assert decode(encode(marker), stream=STREAM, regions=REGIONS) == marker

    a.tick(1_500)
    assert updates(a.positions_read({"d": 5}, 6)) == []  # changed, but within the interval
    a.tick(2_000)
    (later,) = updates(a.positions_read({"d": 5}, 6))
    assert isinstance(later.body, Update)
    assert dict(later.body.progress) == {"a": 2, "b": 2, "c": 1}
    a.tick(3_000)
    assert updates(a.positions_read({"d": 5}, 6)) == []  # unchanged: nothing to send


def test_applying_moves_to_the_last_position_every_message_below_is_covered() -> None:
    a, b = machine("a"), machine("b")
    a.data_indexed(Q_A)
    b.data_indexed(Q_B)
    b.positions_read({"d": 0}, 6)
    a.tick(1_000)
    (marker,) = updates(a.positions_read({"d": 5}, 6))  # a1 b1 a2 c1 b2 consumed
    out = b.marker_seen(7, marker)
    applied = [o for o in out if isinstance(o, UpdateApplied)]
    assert applied and applied[0].position is None
    # A vector alone moves at the next positions read (one move per interval at most)...
    assert [o for o in out if isinstance(o, MoveConsumer)] == []
    out = b.positions_read({"d": 0}, 6)
    # ... to the end of what it covers: b1 b2 a1 a2 c1 covered; a3 (at 6) is not.
    assert [o for o in out if isinstance(o, MoveConsumer)] == [MoveConsumer("d", 5)]
    view = b.subscription("d")
    assert view is not None and dict(view.progress) == {"a": 2, "b": 2, "c": 1}


def test_one_uncovered_origin_holds_the_position_before_its_first_message() -> None:
    a, b = machine("a"), machine("b")
    a.data_indexed(Q_A)
    b.data_indexed(Q_B)
    b.positions_read({"d": 0}, 6)
    a.tick(1_000)
    (marker,) = updates(a.positions_read({"d": 1}, 6))  # only a1 consumed
    out = b.marker_seen(7, marker)
    # b1 at 1 is not covered: b stays where it is.
    assert [o for o in out if isinstance(o, MoveConsumer)] == []
    b.tick(2_000)
    view = b.subscription("d")
    assert view is not None and view.mark_delete == 0
    b.positions_read({"d": 0}, 6)
    view = b.subscription("d")
    assert view is not None and view.exposure == 1  # a1 at 3 would come again


def test_an_absent_subscription_is_created_where_the_vector_places_it() -> None:
    a, b = machine("a"), machine("b", subs=False)
    a.data_indexed(Q_A)
    b.data_indexed(Q_B)
    a.tick(1_000)
    (marker,) = updates(a.positions_read({"d": 6}, 6))
    out = b.marker_seen(7, marker)
    assert [o for o in out if isinstance(o, CreateConsumer)] == [CreateConsumer("d", b"cfg-d", 6)]


def test_the_further_of_the_snapshot_and_the_vector_wins() -> None:
    b = machine("b")
    b.data_indexed(Q_B)
    b.positions_read({"d": 0}, 6)
    sid = SnapshotId("a", 1, 1)
    snapshot_only_far = Update("d", SUBS["d"].kind, sid, 4, {"b": 4, "c": 4}, b"cfg-d", {"a": 1}, 1)
    out = b.marker_seen(7, Marker("a", STREAM, 1, snapshot_only_far))
    assert [o for o in out if isinstance(o, MoveConsumer)] == [MoveConsumer("d", 4)]
    b.action_done(MoveConsumer("d", 4), 4)
    sid2 = SnapshotId("a", 1, 2)
    vector_far = Update(
        "d", SUBS["d"].kind, sid2, 5, {"b": 2, "c": 2}, b"cfg-d", {"a": 3, "b": 2, "c": 1}, 6
    )
    out = b.marker_seen(8, Marker("a", STREAM, 1, vector_far))
    assert [o for o in out if isinstance(o, MoveConsumer)] == [MoveConsumer("d", 6)]


def test_no_vector_is_read_below_the_trim_point() -> None:
    a = machine("a")
    many = [DataEntry(i, "a" if i % 2 else "b", (i + 1) // 2) for i in range(1, 20_001)]
    a.data_indexed(many)
    a.tick(1_000)
    assert updates(a.positions_read({"d": 15_000}, 20_000))
    assert a.origin_index_runs < 20_000  # trimmed below d's mark-delete
    # The user resets d far back: below the trim point no vector can be read exactly.
    a.tick(5_000)
    assert updates(a.positions_read({"d": 100}, 20_000)) == []


def test_a_subscription_below_a_trim_that_dropped_nothing_still_sends_its_vector() -> None:
    """A subscription appearing behind the others (created by its user, or by an update) is
    below the point the index was trimmed to; nothing was dropped there, so its vector is
    exact and goes out."""
    a = machine("a")
    a.data_indexed(Q_A)
    a.tick(1_000)
    assert updates(a.positions_read({"d": 6}, 6))  # the index is trimmed up to 6
    a.subscriptions_changed(SUBS | {"e": SubscriptionInfo(config=b"cfg-e")})
    (marker,) = updates(a.positions_read({"d": 6, "e": 3}, 6))
    assert isinstance(marker.body, Update) and marker.body.subscription == "e"
    assert (dict(marker.body.progress), marker.body.progress_position) == ({"a": 2, "b": 1}, 3)


def test_an_older_vector_never_moves_back() -> None:
    b = machine("b")
    b.data_indexed(Q_B)
    b.positions_read({"d": 5}, 6)
    old = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg-d", {"b": 1}, 2)
    assert [
        o for o in b.marker_seen(7, Marker("a", STREAM, 1, old)) if isinstance(o, MoveConsumer)
    ] == []


def test_with_progress_off_vectors_are_neither_sent_nor_applied() -> None:
    config = MachineConfig("b", STREAM, REGIONS, interval_ms=INTERVAL, progress=False)
    b = StreamMachine(config)
    b.became_leader(1)
    b.data_indexed(Q_B)
    b.tick(1_000)
    vector_only = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg-d", {"a": 3, "b": 2, "c": 1}, 6)
    assert b.marker_seen(7, Marker("a", STREAM, 1, vector_only)) == []
    b.subscriptions_changed(SUBS)
    assert updates(b.positions_read({"d": 6}, 6)) == []


def test_a_vector_that_grew_at_the_same_position_gets_its_own_message_id() -> None:
    """The origin index may lag: at one mark-delete the vector grows as it catches up. The
    write stream de-duplicates by `Nats-Msg-Id`, so the ids must differ or the larger
    vector is dropped while the sender believes it sent."""
    a = machine("a")
    a.data_indexed(Q_A[:3])
    a.tick(1_000)
    (first,) = updates(a.positions_read({"d": 6}, 6))
    a.data_indexed(Q_A[3:])
    a.tick(2_000)
    (second,) = updates(a.positions_read({"d": 6}, 6))
    assert isinstance(first.body, Update) and isinstance(second.body, Update)
    assert first.body.progress_position == second.body.progress_position == 6
    assert first.body.progress != second.body.progress
    assert marker_msg_id(first) != marker_msg_id(second)
