"""The outcome of moves and creations (issue 12, seeds 7, 18, 524): the machine reports a
position only as read or as an action reported done left it, and asks again for one that
failed or was dropped, one action per subscription at a time."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.protocol import (
    CreateConsumer,
    CreateCursor,
    MachineConfig,
    Marker,
    MoveConsumer,
    MoveCursor,
    Output,
    SnapshotId,
    StreamMachine,
    SubscriptionAction,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
)

STREAM = "V"
REGIONS = ("a", "b")
SUBS = {"d": SubscriptionInfo(config=b"cfg-d")}


def leader(subscriptions: dict[str, SubscriptionInfo] | None = None) -> StreamMachine:
    m = StreamMachine(MachineConfig("b", STREAM, REGIONS))
    m.subscriptions_changed(SUBS if subscriptions is None else subscriptions)
    m.became_leader(1)
    return m


def update(
    position: int,
    counter: int = 1,
    kind: SubscriptionKind = SubscriptionKind.DURABLE,
    config: bytes = b"cfg-d",
) -> Marker:
    """An update from `a` naming `position` in `b` (snapshot `a-1-counter`)."""
    sid = SnapshotId("a", 1, counter)
    return Marker("a", STREAM, 1, Update("d", kind, sid, 10, {"b": position}, config))


def actions(outputs: Sequence[Output]) -> list[Output]:
    kinds = (MoveConsumer, MoveCursor, CreateConsumer, CreateCursor)
    return [o for o in outputs if isinstance(o, kinds)]


def mark_delete(m: StreamMachine, name: str = "d") -> int | None:
    view = m.subscription(name)
    assert view is not None
    return view.mark_delete


def test_a_move_changes_the_position_reported_only_once_it_is_done() -> None:
    """Seeds 7 and 524: the API answered the move's target while the durable stood below
    it (the move failed, or was still being carried out)."""
    b = leader()
    b.positions_read({"d": 5}, 30)
    assert actions(b.marker_seen(31, update(20))) == [MoveConsumer("d", 20)]
    assert mark_delete(b) == 5  # asked for, not done
    b.action_done(MoveConsumer("d", 20), 20)
    assert mark_delete(b) == 20
    # A later read is taken as it is; nothing is asked for again (the target was reached).
    assert actions(b.positions_read({"d": 20}, 40)) == []


def test_a_failed_move_is_asked_for_again_at_the_next_read_one_at_a_time() -> None:
    b = leader()
    b.positions_read({"d": 5}, 30)
    move = MoveConsumer("d", 20)
    assert actions(b.marker_seen(31, update(20))) == [move]
    # While its outcome is not reported, nothing more is asked for this subscription.
    assert actions(b.positions_read({"d": 5}, 32)) == []
    assert actions(b.marker_seen(33, update(22, counter=2))) == []
    assert b.action_failed(move) == []
    assert mark_delete(b) == 5
    # Asked for again at the next read, to the furthest target applied meanwhile.
    again = MoveConsumer("d", 22)
    assert actions(b.positions_read({"d": 5}, 34)) == [again]
    b.action_done(again, 22)
    assert mark_delete(b) == 22
    assert actions(b.positions_read({"d": 22}, 35)) == []


def test_a_move_done_short_of_its_target_reports_where_the_consumer_stands() -> None:
    """The runtime leaves a consumer alone that delivered up to the target already: its
    ack floor, read back, is what the machine reports. Never backwards either."""
    b = leader()
    b.positions_read({"d": 5}, 30)
    b.marker_seen(31, update(20))
    b.action_done(MoveConsumer("d", 20), 12)
    assert mark_delete(b) == 12
    b.positions_read({"d": 14}, 32)
    b.action_done(MoveConsumer("d", 20), 13)  # an outcome read before the last positions
    assert mark_delete(b) == 14


def test_a_dropped_creation_keeps_the_subscription_and_is_asked_for_again() -> None:
    """Seed 18: a creation dropped (not the leader) was taken for done: the subscription
    counted as existing, the next listing (without it) forgot it, and nothing asked again."""
    b = leader({})
    create = CreateConsumer("d", b"cfg-d", 20)
    assert actions(b.marker_seen(31, update(20))) == [create]
    view = b.subscription("d")
    assert view is not None and not view.exists and view.mark_delete is None
    b.action_failed(create)
    # The listing does not hold it: the record stays (the update's target with it), and the
    # creation is asked for again, once per read while its outcome is unknown.
    assert actions(b.subscriptions_changed({})) == [create]
    assert actions(b.subscriptions_changed({})) == []
    b.action_failed(create)
    view = b.subscription("d")
    assert view is not None and [a.position for a in view.applied] == [20]
    assert actions(b.subscriptions_changed({})) == [create]
    b.action_done(create, 20)
    view = b.subscription("d")
    assert view is not None and view.exists and view.mark_delete == 20
    # Created: listed from now on, and not created again.
    assert actions(b.subscriptions_changed(SUBS)) == []


def test_a_creation_dropped_by_a_deposed_leader_is_asked_for_by_the_next_term() -> None:
    b = leader({})
    create = CreateConsumer("d", b"cfg-d", 20)
    assert actions(b.marker_seen(31, update(20))) == [create]
    b.action_failed(create)  # dropped: the lease had moved on
    b.became_follower()
    assert actions(b.subscriptions_changed({})) == []  # a follower asks for nothing
    assert actions(b.became_leader(2)) == [create]


def test_an_outcome_never_reported_does_not_block_the_next_term() -> None:
    b = leader()
    b.positions_read({"d": 5}, 30)
    assert actions(b.marker_seen(31, update(20))) == [MoveConsumer("d", 20)]
    b.became_follower()
    assert actions(b.became_leader(2)) == [MoveConsumer("d", 20)]


def test_an_absent_subscription_is_created_with_the_newest_configuration() -> None:
    b = leader({})
    cursor = SubscriptionKind.EXTERNAL
    first = CreateCursor("d", b"old", 20)
    assert actions(b.marker_seen(31, update(20, kind=cursor, config=b"old"))) == [first]
    b.action_failed(first)
    assert actions(b.marker_seen(32, update(25, 2, cursor, b"new"))) == [
        CreateCursor("d", b"new", 25)
    ]


def test_an_outcome_for_a_forgotten_subscription_changes_nothing() -> None:
    b = leader()
    b.positions_read({"d": 5}, 30)
    move: SubscriptionAction = MoveConsumer("d", 20)
    assert actions(b.marker_seen(31, update(20))) == [move]
    b.subscriptions_changed({})  # its user deleted it meanwhile
    assert b.subscription("d") is None
    assert b.action_done(move, 20) == [] and b.action_failed(move) == []
    assert b.subscription("d") is None
