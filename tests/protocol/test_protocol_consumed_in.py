"""Which regions consume a subscription (docs/protocol.md §8): a region counts as consuming
it for `MachineConfig.active_window_ms` after its own consumers passed its data (seen by a
positions read, not a move of the machine's, not markers alone), and tells the others with
its updates (`Update.consuming`)."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.naming import VirtualStream
from sidecar.protocol import (
    Acks,
    MachineConfig,
    Marker,
    MoveConsumer,
    Output,
    PositionsListing,
    PublishReplicated,
    StoredMarker,
    StreamMachine,
    SubscriptionInfo,
    Update,
    decode,
    encode,
)
from sidecar.protocol.origins import DataEntry

STREAM = "V"
SUBS = {"d": SubscriptionInfo(config=b"cfg")}
INTERVAL_MS = 1_000
WINDOW_MS = 10 * INTERVAL_MS


def machine() -> StreamMachine:
    """Region a, leading; data of origin a at read sequences 1-10, markers at 11-13."""
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    m.tick(1_000)
    m.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 11)])
    m.became_leader(1)
    read(m, 0, 1_000)
    return m


def read(m: StreamMachine, position: int, now: int) -> list[Output]:
    m.tick(now)
    return m.read_done(PositionsListing(m.generation, SUBS, {"d": position}, 13, False))


def updates(outputs: Sequence[Output]) -> list[Update]:
    return [
        o.marker.body
        for o in outputs
        if isinstance(o, PublishReplicated) and isinstance(o.marker.body, Update)
    ]


def consumed_in(m: StreamMachine) -> tuple[str, ...]:
    view = m.subscription("d")
    assert view is not None
    return view.consumed_in


def test_its_consumers_passing_data_make_a_region_consuming_and_its_update_says_so() -> None:
    m = machine()
    assert consumed_in(m) == ()
    (update,) = updates(read(m, 4, 3_000))
    assert consumed_in(m) == ("a",)
    assert update.consuming
    (update,) = updates(read(m, 10, 5_000))
    assert update.progress == {"a": 10} and update.consuming
    # On to the stream's end, over markers alone: nothing new consumed, nothing to send.
    assert updates(read(m, 13, 7_000)) == []
    (g,) = m.gauges()
    assert g.consumed_in == 1


def test_markers_alone_are_not_consumption() -> None:
    m = machine()
    read(m, 10, 2_000)
    assert consumed_in(m) == ("a",)
    m.tick(2_000 + WINDOW_MS)
    assert consumed_in(m) == ()
    assert not updates(read(m, 13, 2_000 + WINDOW_MS + 1))
    assert consumed_in(m) == (), "an idle durable following the stream's end over markers"


def test_a_move_of_the_machines_own_is_not_consumption() -> None:
    m = machine()
    m.marker_seen(
        11,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 8}, 8)),
    )
    (move,) = [o for o in read(m, 0, 2_000) if isinstance(o, MoveConsumer)]
    assert move == MoveConsumer("d", 8)
    m.action_done(move, 8)
    read(m, 8, 3_000)
    assert consumed_in(m) == ()
    read(m, 9, 4_000)
    assert consumed_in(m) == ("a",)


def test_consumption_while_a_move_is_under_way_is_consumption() -> None:
    """A move's outcome reads the durable back beyond its target when its consumers passed
    data meanwhile: taken as the machine's own, the next read would not see it (two regions
    consuming at once, each moved at every read by the other's progress, went unreported:
    the shell simulation's seed 6 of `_both`, tests/dev/test_shell_failback.py)."""
    m = machine()
    m.marker_seen(
        11,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 5}, 5)),
    )
    (move,) = [o for o in read(m, 0, 2_000) if isinstance(o, MoveConsumer)]
    assert move == MoveConsumer("d", 5) and consumed_in(m) == ()
    m.action_done(move, 5)  # read back at its target: the move alone
    assert consumed_in(m) == ()
    m.marker_seen(
        12,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 6}, 6)),
    )
    (move,) = [o for o in read(m, 5, 3_000) if isinstance(o, MoveConsumer)]
    m.action_done(move, 8)  # read back two data messages beyond it
    assert consumed_in(m) == ("a",)
    (update,) = updates(read(m, 8, 4_000))
    assert update.consuming


def test_another_regions_consuming_update_makes_it_consuming_until_the_window_ends() -> None:
    m = machine()
    body = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 2}, 2, consuming=True)
    m.tick(5_000)
    m.marker_seen(11, Marker("b", STREAM, 1, body))
    assert consumed_in(m) == ("b",)
    read(m, 4, 6_000)
    assert consumed_in(m) == ("a", "b")
    (g,) = m.gauges()
    assert g.consumed_in == 2
    m.tick(5_000 + WINDOW_MS)
    assert consumed_in(m) == ("a",)
    m.tick(6_000 + WINDOW_MS)
    assert consumed_in(m) == ()


def test_the_machine_asks_to_be_called_when_a_region_stops_counting() -> None:
    follower = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    follower.tick(1_000)
    follower.subscriptions_changed(SUBS)
    body = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 2}, 2, consuming=True)
    follower.marker_seen(11, Marker("b", STREAM, 1, body))
    assert follower.needs().deadline_ms == 1_000 + WINDOW_MS  # its gauge changes then
    follower.tick(1_000 + WINDOW_MS)
    assert follower.needs().deadline_ms is None


def test_an_update_not_consuming_says_nothing_of_its_region() -> None:
    m = machine()
    m.marker_seen(
        11, Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"", {"a": 2}, 2))
    )
    assert consumed_in(m) == ()


def test_the_flag_travels_on_the_wire() -> None:
    regions = ("a", "b")
    for consuming in (True, False):
        body = Update("d", SUBS["d"].kind, None, 0, {}, b"", {"a": 2}, 2, consuming)
        marker = Marker("a", STREAM, 1, body)
        decoded = decode(encode(marker), stream=STREAM, regions=regions)
        assert isinstance(decoded, Marker) and decoded.body == body


def test_a_new_leaders_first_read_is_its_baseline_and_followers_tell_nothing() -> None:
    """The moves of the leader before it look like consumption from a follower's reads."""
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    m.tick(1_000)
    m.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 11)])
    read(m, 0, 1_000)
    read(m, 6, 2_000)  # a follower: another replica leads and moves it
    assert consumed_in(m) == ()
    m.became_leader(1)
    read(m, 8, 3_000)  # the leader's first read
    assert consumed_in(m) == ()
    read(m, 9, 4_000)
    assert consumed_in(m) == ("a",)


def test_a_replayed_sign_is_not_news() -> None:
    """A machine rebuilt from the read stream (a restarted sidecar) replays every update
    stored there, those saying a region consumed long ago included: a marker carries no
    time, so the replay counts none, and the region counts again from an update read live
    (the shell simulation's seed 0 of `_back`, tests/dev/test_shell_failback.py)."""
    body = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"b": 2}, 2, consuming=True)
    stored = StoredMarker(
        11,
        VirtualStream(STREAM, ("a", "b")).marker_subject("b"),
        encode(Marker("b", STREAM, 1, body)),
    )
    config = MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS)
    m, read_markers = StreamMachine.restore(config, [stored], SUBS, {"d": 0}, 13, 50_000)
    assert len(read_markers) == 1
    assert consumed_in(m) == ()
    m.marker_seen(14, Marker("b", STREAM, 1, body))
    assert consumed_in(m) == ("b",)


def test_a_floor_that_followed_the_streams_removals_is_not_consumption() -> None:
    """Limits or a purge removed the read stream's messages up to 6: the durable's floor
    follows by itself (JetStream moves it to the first stored message), no consumer of the
    region passed them (the shell simulation at the edges: read_max_msgs, seed 0). Data
    passed above the first stored message still counts."""
    m = machine()
    m.tick(2_000)
    removed = PositionsListing(m.generation, SUBS, {"d": 6}, 13, False, first_seq=7)
    # Its vector moves with the floor (nothing left there to deliver), with no sign.
    assert not any(u.consuming for u in updates(m.read_done(removed)))
    assert consumed_in(m) == ()
    m.tick(3_000)
    passed = PositionsListing(m.generation, SUBS, {"d": 8}, 13, False, first_seq=7)
    (update,) = updates(m.read_done(passed))
    assert update.consuming and consumed_in(m) == ("a",)


def test_a_moves_outcome_a_purge_moved_is_not_consumption() -> None:
    """A purge (1 to 8) lands between the move's look at the durable and its outcome, read
    back at 8 beyond the target 5: the runtime reads the first sequence after it (9), and
    the floor that only followed the purge is no sign (the shell simulation's seed 21,
    `make soak` seed 1067974121501). Beyond the first sequence it still is one."""
    m = machine()
    m.marker_seen(
        11,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 5}, 5)),
    )
    (move,) = [o for o in read(m, 0, 2_000) if isinstance(o, MoveConsumer)]
    assert move == MoveConsumer("d", 5)
    m.action_done(move, 8, first_seq=9)
    assert consumed_in(m) == ()
    assert not any(u.consuming for u in updates(read(m, 8, 3_000)))
    m.marker_seen(
        12,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 9}, 9)),
    )
    (move,) = [o for o in read(m, 8, 4_000) if isinstance(o, MoveConsumer)]
    m.action_done(move, 10, first_seq=9)  # one data message beyond the first stored one
    assert consumed_in(m) == ("a",)


def test_an_ack_is_consumption_where_the_floor_only_followed_the_removals() -> None:
    """An application at the edge of a read stream's age limit: each message it acks is
    removed before the next read, so its floor only ever follows the first stored message
    (no sign from the positions). Its acks, heard with the read, are the sign (`make soak`
    seed 931780330598, tests/dev/test_shell_failback.py)."""
    m = machine()
    m.tick(2_000)
    at_the_edge = PositionsListing(m.generation, SUBS, {"d": 6}, 13, False, first_seq=7)
    assert not any(u.consuming for u in updates(m.read_done(at_the_edge)))
    m.tick(3_000)
    acked = PositionsListing(
        m.generation,
        SUBS,
        {"d": 7},
        13,
        False,
        first_seq=8,
        acked={"d": Acks(2_900, ()), "other": Acks(2_950, ())},
    )
    (update,) = updates(m.read_done(acked))
    assert update.consuming and consumed_in(m) == ("a",)


def test_acks_of_a_follower_or_of_a_durable_not_replicated_are_no_sign() -> None:
    """Only a leader takes its region's signs (a follower's view of the floors includes the
    leader's moves), and only of replicated durables, its first read included."""
    subs = {**SUBS, "local": SubscriptionInfo(replicated=False)}
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    m.tick(1_000)
    m.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 11)])
    m.read_done(PositionsListing(m.generation, subs, {"d": 0}, 13, False))
    m.tick(2_000)
    m.read_done(
        PositionsListing(m.generation, subs, {"d": 0}, 13, False, acked={"d": Acks(1_900, ())})
    )
    assert consumed_in(m) == ()
    m.became_leader(1)
    m.tick(3_000)
    listing = PositionsListing(
        m.generation, subs, {"d": 0}, 13, False, acked={"local": Acks(2_900, ())}
    )
    m.read_done(listing)
    assert consumed_in(m) == ()
    m.tick(4_000)
    m.read_done(
        PositionsListing(m.generation, subs, {"d": 0}, 13, False, acked={"d": Acks(3_900, ())})
    )
    assert consumed_in(m) == ("a",)


def test_an_ack_heard_long_before_the_read_is_a_sign_of_then() -> None:
    """A replica that read nothing for a while (a follower until now) hears of acks at its
    next read: a sign of when they were heard, none when that is past the window (the shell
    simulation: a restarted replica that led four seconds after its application stopped)."""
    m = machine()
    m.tick(20_000)
    stale = PositionsListing(m.generation, SUBS, {"d": 0}, 13, False, acked={"d": Acks(9_000, ())})
    assert not any(u.consuming for u in updates(m.read_done(stale)))
    assert consumed_in(m) == ()
    m.tick(21_000)
    recent = PositionsListing(
        m.generation, SUBS, {"d": 0}, 13, False, acked={"d": Acks(12_000, ())}
    )
    m.read_done(recent)
    assert consumed_in(m) == ("a",)
    m.tick(12_000 + WINDOW_MS - 1)
    assert consumed_in(m) == ("a",)
    m.tick(12_000 + WINDOW_MS)
    assert consumed_in(m) == ()


def test_what_a_machine_sees_a_lease_after_it_last_heard_the_clock_is_no_sign() -> None:
    """A leader frozen longer than its lease (a GC pause, a stalled VM) wakes with its state:
    another replica led meanwhile and moved the durable, and the first outcomes the frozen
    one reads (its move read back, a positions read) come a lease or more after its last
    tick. Taken as its consumers', they were a false sign (`make soak` seed 161639543428,
    tests/dev/test_shell_failback.py); until then a positions read at that distance is a
    baseline, as a leader's first."""
    lease = MachineConfig("a", STREAM, ("a", "b")).lease_ttl_ms
    m = machine()
    m.marker_seen(
        11,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 5}, 5)),
    )
    (move,) = [o for o in read(m, 0, 2_000) if isinstance(o, MoveConsumer)]
    # Frozen after asking; the move's outcome read back a lease later, far beyond its target.
    m.action_done(move, 8, done_ms=2_000 + lease)
    assert consumed_in(m) == ()
    listing = PositionsListing(m.generation, SUBS, {"d": 9}, 13, False, read_ms=2_000 + lease)
    assert not any(u.consuming for u in updates(m.read_done(listing)))
    assert consumed_in(m) == ()
    # Awake (its clock heard again), a read just after is a sign as usual.
    m.tick(2_000 + lease)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 10}, 13, False, read_ms=2_100 + lease))
    assert consumed_in(m) == ("a",)


def test_a_read_not_wholly_under_the_machines_epoch_is_no_sign() -> None:
    """A replica frozen past its lease wakes still leading in its machine; its loop ticks
    the machine and reads positions before its lease loop reports the loss, while another
    replica of the region has led and moved the durable (`make soak` seed 702622929322:
    four resets taken for the region's consumption). Its lease no longer held the epoch
    over that read (`PositionsListing.lease_epoch` 0), so it is no sign, and no baseline
    either: what the next held read sees is measured from there."""
    m = machine()  # epoch 1, its first read (no lease epoch given) the baseline
    m.tick(2_000)
    held = PositionsListing(m.generation, SUBS, {"d": 2}, 13, False, lease_epoch=1)
    (update,) = updates(m.read_done(held))
    assert update.consuming and consumed_in(m) == ("a",)
    m.tick(2_000 + WINDOW_MS)  # frozen; its clock heard again just before the read
    assert consumed_in(m) == ()
    lapsed = PositionsListing(m.generation, SUBS, {"d": 8}, 13, False, lease_epoch=0)
    assert not any(u.consuming for u in updates(m.read_done(lapsed)))
    assert consumed_in(m) == ()
    taken_again = PositionsListing(m.generation, SUBS, {"d": 9}, 13, False, lease_epoch=2)
    m.read_done(taken_again)  # under another epoch than the machine's: neither
    assert consumed_in(m) == ()
    m.tick(3_000 + WINDOW_MS)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 9}, 13, False, lease_epoch=1))
    assert consumed_in(m) == (), "the first held read after a lapse is a baseline"
    m.tick(4_000 + WINDOW_MS)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 10}, 13, False, lease_epoch=1))
    assert consumed_in(m) == ("a",)


def test_a_leaders_first_read_begun_before_it_led_is_no_baseline() -> None:
    """A read begun as a follower and done once the replica leads may have seen the durable
    before the last move of the leader before it: measured from it, the next read would
    take that move for consumption. Only a read wholly under the epoch is a baseline."""
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=INTERVAL_MS))
    m.tick(1_000)
    m.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 11)])
    read(m, 0, 1_000)
    m.became_leader(3)
    m.tick(2_000)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 2}, 13, False, lease_epoch=0))
    m.tick(3_000)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 6}, 13, False, lease_epoch=3))
    assert consumed_in(m) == ()
    m.tick(4_000)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 7}, 13, False, lease_epoch=3))
    assert consumed_in(m) == ("a",)


def test_a_moves_outcome_read_back_after_the_lease_lapsed_is_no_sign() -> None:
    """A move's outcome read back beyond its target is a sign only when the lease still held
    the machine's epoch then: after a pause shorter than the lease (so the machine's clock
    shows no lease's gap) that outlasted its validity, another replica may have moved it."""
    m = machine()
    m.marker_seen(
        11,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 5}, 5)),
    )
    (move,) = [o for o in read(m, 0, 2_000) if isinstance(o, MoveConsumer)]
    m.action_done(move, 8, done_ms=2_500, lease_epoch=0)
    assert consumed_in(m) == ()
    m.marker_seen(
        12,
        Marker("b", STREAM, 1, Update("d", SUBS["d"].kind, None, 0, {}, b"cfg", {"a": 9}, 9)),
    )
    (move,) = [o for o in read(m, 8, 3_000) if isinstance(o, MoveConsumer)]
    m.action_done(move, 10, done_ms=3_100, lease_epoch=1)
    assert consumed_in(m) == ("a",)


def test_a_sign_not_sent_before_stepping_down_is_not_sent_in_the_next_term() -> None:
    """A leader took a sign, lost its lease before its next update went out and led again:
    the sign is dropped with the term that took it (shell simulation, seed 31 of `make soak`
    seed 161639543428's parameters: sent 4 s old after a freeze). The new term's first read
    is its baseline, so its first update says nothing of consumption."""
    m = machine()
    (update,) = updates(read(m, 4, 3_000))
    assert update.consuming
    assert updates(read(m, 6, 3_100)) == []  # a sign taken, the vector not due yet
    m.became_follower()
    m.became_leader(2)
    (update,) = updates(read(m, 6, 8_000))
    assert update.progress == {"a": 6} and not update.consuming
