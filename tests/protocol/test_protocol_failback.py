"""The failback guard (docs/protocol.md §7): a region that returns holds its replicated
durables until every other region has answered a catch-up request, which each answers only
after publishing the progress it read after seeing the request; or until the hold expires."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from sidecar.protocol import (
    FailbackHeld,
    FailbackReleased,
    HoldConsumer,
    MachineConfig,
    Marker,
    MoveConsumer,
    Output,
    PositionsListing,
    PublishReplicated,
    ReadPositions,
    ReadReason,
    Rejected,
    RejectReason,
    ReleaseConsumer,
    Request,
    Response,
    SnapshotId,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
)
from sidecar.protocol.origins import DataEntry

STREAM = "V"
HOLD_MS = 60_000
WINDOW_MS = 10_000  # ten intervals of 1 s: `MachineConfig.active_window_ms`
DURABLE = {"d": SubscriptionInfo(config=b"cfg-d")}
SILENT: Mapping[str, int | None] = {"b": None, "c": None}


def machine(
    region: str, regions: tuple[str, ...] = ("a", "b"), timeout_ms: int = 30_000
) -> StreamMachine:
    config = MachineConfig(
        region, STREAM, regions, interval_ms=1_000, timeout_ms=timeout_ms, hold_ms=HOLD_MS
    )
    m = StreamMachine(config)
    m.tick(1_000)
    # Ten data messages of `b` at read sequences 1-10 in every region's read stream.
    m.data_indexed([DataEntry(seq, "b", seq) for seq in range(1, 11)])
    return m


def listing(
    m: StreamMachine,
    position: int,
    sources: Mapping[str, int | None],
    subs: Mapping[str, SubscriptionInfo] = DURABLE,
    leader_age_ms: int | None = None,
    stream_age_ms: int | None = None,
    paused: Mapping[str, int] | None = None,
) -> PositionsListing:
    return PositionsListing(
        m.generation,
        subs,
        {n: position for n in subs},
        12,
        follows_end=False,
        sources=sources,
        leader_age_ms=leader_age_ms,
        stream_age_ms=stream_age_ms,
        paused=paused or {},
    )


def lead(
    m: StreamMachine,
    position: int,
    sources: Mapping[str, int | None],
    now: int = 1_000,
    subs: Mapping[str, SubscriptionInfo] = DURABLE,
    leader_age_ms: int | None = None,
    stream_age_ms: int | None = None,
    paused: Mapping[str, int] | None = None,
) -> list[Output]:
    """Leadership, and the first listing a leader reads."""
    m.became_leader(1)
    assert reads(m.interval(now, 12)) == [ReadReason.LEADERSHIP]
    return m.read_done(listing(m, position, sources, subs, leader_age_ms, stream_age_ms, paused))


def reads(outputs: Sequence[Output]) -> list[ReadReason]:
    return [o.reason for o in outputs if isinstance(o, ReadPositions)]


def published(outputs: Sequence[Output]) -> list[Marker]:
    return [o.marker for o in outputs if isinstance(o, PublishReplicated)]


def markers_at(m: StreamMachine, *seqs: int) -> None:
    """Markers of no consequence at `seqs` of `m`'s read stream (junk, rejected), so that no
    gap between the data and an answer stands for data the origin index never saw: the guard
    releases only once the index reached the data before the answers."""
    for seq in seqs:
        m.marker_rejected(seq, Rejected(RejectReason.MALFORMED, "junk"))


def catch_up_request(outputs: Sequence[Output]) -> Marker:
    (marker,) = published(outputs)
    assert isinstance(marker.body, Request) and marker.body.catch_up
    return marker


def test_a_region_that_heard_from_no_other_since_its_server_started_holds_its_durables() -> None:
    a = machine("a")
    out = lead(a, 0, {"a": 5, "b": None})
    assert HoldConsumer("d", HOLD_MS) in out
    assert FailbackHeld(("d",), ("b",)) in out
    assert a.held == 1
    # The next interval asks every other region to catch up (there is no new data).
    catch_up_request(a.interval(1_100, 12))


@pytest.mark.parametrize(
    ("sources", "why"),
    [
        ({"b": 40_000}, "heard from b before (b went away while a stayed up)"),
        ({"b": 300}, "a healthy region (a sidecar restarting in it)"),
        ({}, "the sources are not known"),
        ({"a": None}, "b's source is not known"),
    ],
)
def test_no_hold_unless_the_region_returned(sources: Mapping[str, int | None], why: str) -> None:
    a = machine("a")
    out = lead(a, 0, sources)
    assert not [o for o in out if isinstance(o, HoldConsumer)], why
    assert a.held == 0


def test_only_replicated_durables_are_held_and_a_zero_hold_turns_the_guard_off() -> None:
    subs = {
        "d": SubscriptionInfo(config=b"cfg"),
        "local": SubscriptionInfo(replicated=False),
        "cursor": SubscriptionInfo(SubscriptionKind.EXTERNAL),
    }
    out = lead(machine("a"), 0, SILENT, subs=subs)
    assert [o for o in out if isinstance(o, HoldConsumer)] == [HoldConsumer("d", HOLD_MS)]
    off = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), hold_ms=0))
    assert not [o for o in lead(off, 0, SILENT) if isinstance(o, HoldConsumer)]


def answered(consumed: int, a_at: int = 0) -> tuple[StreamMachine, Marker, Marker]:
    """Region a returned (its durable at `a_at`, held) and asked; b, its durable at
    `consumed` (its own data beyond 10 indexed), published its update, read a's catch-up
    request and answered: a, and b's update and answer, not read by a yet."""
    a, (update,), response = answered_of(DURABLE, consumed, a_at)
    return a, update, response


def answered_of(
    subs: Mapping[str, SubscriptionInfo], consumed: int, a_at: int = 0
) -> tuple[StreamMachine, list[Marker], Marker]:
    """`answered`, for the durables `subs`: b's updates, one per durable."""
    b = machine("b")
    b.data_indexed([DataEntry(seq, "b", seq) for seq in range(11, consumed + 1)])
    updates = published(lead(b, consumed, {"a": 100}, subs=subs))
    a = machine("a")
    lead(a, a_at, SILENT, subs=subs)
    request = catch_up_request(a.interval(1_600, 12))
    at = max(13, consumed + 1)
    b.marker_seen(at, request)
    b.interval(1_700, at)
    (response,) = published(b.read_done(listing(b, consumed, {"a": 100}, subs)))
    return a, updates, response


def test_an_answer_to_a_catch_up_request_follows_the_progress_read_after_it() -> None:
    b = machine("b")
    lead(b, 10, {"a": 100})  # its vector {b: 10} goes out now ...
    a = machine("a")
    lead(a, 0, SILENT)
    request = catch_up_request(a.interval(1_600, 12))
    # ... and its next one would wait an interval; a catch-up request does not.
    assert b.marker_seen(13, request) == []  # answered only after a positions read
    assert reads(b.interval(1_700, 13)) == [ReadReason.CATCH_UP]
    # b's durable consumed two more meanwhile.
    b.data_indexed([DataEntry(seq, "b", seq) for seq in range(11, 13)])
    markers = published(b.read_done(listing(b, 12, {"a": 100})))
    assert [type(m.body) for m in markers] == [Update, Response]
    update, response = markers[0].body, markers[1].body
    assert isinstance(update, Update) and update.progress == {"b": 12}
    assert isinstance(response, Response) and response.position == 13


def test_the_hold_ends_once_every_region_answered_and_the_move_it_asked_for_is_done() -> None:
    a, update, response = answered(10)  # b's progress, sent before the request
    markers_at(a, 11, 12, 13)
    a.marker_seen(14, update)
    out = a.marker_seen(15, response)
    assert not [o for o in out if isinstance(o, ReleaseConsumer)]
    assert reads(a.interval(1_800, 15)) == [ReadReason.VECTOR]  # first asked, one read
    # The read finds the durable behind what b consumed: moved first, still held.
    out = a.read_done(listing(a, 0, {"b": 50}))
    assert MoveConsumer("d", 10) in out
    assert not [o for o in out if isinstance(o, ReleaseConsumer)] and a.held == 1
    a.action_done(MoveConsumer("d", 10), 10)
    assert reads(a.interval(1_900, 15)) == [ReadReason.OUTCOME]
    out = a.read_done(listing(a, 10, {"b": 50}))
    assert ReleaseConsumer("d") in out
    assert FailbackReleased("d", 900, ()) in out
    assert a.held == 0


def test_the_release_waits_for_the_origin_index_to_reach_the_data_before_the_answers() -> None:
    """The data tail may lag the marker tail: an answer read at 15 after b's data at 11-13
    proves b's update was read, not that the index holds those messages, and positions from
    an index short of them would release the durable before b's backlog (the shell
    simulation's seed 108, tests/dev/test_shell_failback.py)."""
    a, update, response = answered(13)  # b consumed through its 13th
    a.marker_seen(14, update)  # b's data at 11-13 came before: a gap, not yet indexed
    a.marker_seen(15, response)
    a.interval(1_800, 15)
    out = a.read_done(listing(a, 0, {"b": 50}))
    assert not [o for o in out if isinstance(o, ReleaseConsumer)] and a.held == 1
    assert MoveConsumer("d", 10) in out  # as far as the index knows
    a.action_done(MoveConsumer("d", 10), 10)
    # The read after the move, asked for again since the index is short (either reason).
    assert reads(a.interval(1_900, 15)) == [ReadReason.CATCH_UP]
    out = a.read_done(listing(a, 10, {"b": 50}))
    assert not [o for o in out if isinstance(o, ReleaseConsumer)], "the index is at 10 of 13"
    a.data_indexed([DataEntry(seq, "b", seq) for seq in range(11, 14)])
    assert reads(a.interval(2_000, 15)) == [ReadReason.CATCH_UP]
    out = a.read_done(listing(a, 10, {"b": 50}))
    assert MoveConsumer("d", 13) in out and a.held == 1
    a.action_done(MoveConsumer("d", 13), 13)
    a.interval(2_100, 15)
    out = a.read_done(listing(a, 13, {"b": 50}))
    assert ReleaseConsumer("d") in out and a.held == 0


def asked_to_reach_the_progress() -> StreamMachine:
    """`a` held, every region answered (b's progress calls for 10): its read asks the move."""
    a, update, response = answered(10)
    markers_at(a, 11, 12, 13)
    a.marker_seen(14, update)
    a.marker_seen(15, response)
    a.interval(1_800, 15)
    assert MoveConsumer("d", 10) in a.read_done(listing(a, 0, {"b": 50}))
    return a


def test_a_region_still_consuming_does_not_keep_the_hold() -> None:
    """Once every region answered, the durable must reach what the progress then calls for,
    not what later updates call for: b consuming on (an application left running there)
    would otherwise ask for a move at every read, and no read would find none in flight
    (the shell simulation's seed 2 of `_back`, tests/dev/test_shell_failback.py)."""
    a = asked_to_reach_the_progress()
    # b consumed two more, and says so before the move is done.
    a.data_indexed([DataEntry(seq, "b", seq) for seq in range(11, 13)])
    later = Update("d", SubscriptionKind.DURABLE, None, 0, {}, b"cfg-d", {"b": 12}, 12)
    a.marker_seen(16, Marker("b", STREAM, 1, later))
    a.action_done(MoveConsumer("d", 10), 10)
    a.interval(1_900, 16)
    out = a.read_done(listing(a, 10, {"b": 50}))
    # Released at this read; what b's later progress calls for goes first (under the hold).
    actions = [o for o in out if isinstance(o, MoveConsumer | ReleaseConsumer)]
    assert actions == [MoveConsumer("d", 12), ReleaseConsumer("d")] and a.held == 0


def test_an_update_applied_once_the_durable_reached_the_progress_is_carried_out_at_release() -> (
    None
):
    """The durable reached what the progress called for once every region answered, so no
    move is asked before its release; b's snapshot update naming a's position 12 arrives
    then. The release read asks that move first: asked at the read after, it came too late
    (`make soak` seed 31537660956, applied: the released durable delivered what the update
    said was consumed, tests/dev/test_shell_failback.py)."""
    a = asked_to_reach_the_progress()
    a.action_done(MoveConsumer("d", 10), 10)
    snapshot = SnapshotId("b", 1, 1)
    later = Update("d", SubscriptionKind.DURABLE, snapshot, 12, {"a": 12}, b"cfg-d")
    out = a.marker_seen(16, Marker("b", STREAM, 1, later))
    assert not [o for o in out if isinstance(o, MoveConsumer)]  # reached `needed`: held
    a.interval(1_900, 16)
    out = a.read_done(listing(a, 10, {"b": 50}))
    actions = [o for o in out if isinstance(o, MoveConsumer | ReleaseConsumer)]
    assert actions == [MoveConsumer("d", 12), ReleaseConsumer("d")] and a.held == 0


def test_a_durable_released_before_another_is_moved_as_its_updates_call_for() -> None:
    """Two durables held, both moved once every region answered; d's move done, e's still in
    flight: the read releases d, not e. b's update naming a's position 12 for d arrives then:
    d is moved. Before, d was asked no move until e was released too (it counted as at its
    `_Return.needed` as long as any durable stayed held), and delivered 11 and 12, which b
    had consumed (found by reading the code, not yet by a seed)."""
    two = {"d": SubscriptionInfo(config=b"cfg-d"), "e": SubscriptionInfo(config=b"cfg-e")}
    a, updates, response = answered_of(two, 10)
    markers_at(a, 11, 12)
    for seq, update in enumerate(updates, start=13):
        a.marker_seen(seq, update)
    a.marker_seen(15, response)
    a.interval(1_800, 15)
    out = a.read_done(listing(a, 0, {"b": 50}, two))
    assert {MoveConsumer("d", 10), MoveConsumer("e", 10)} <= set(out)
    a.action_done(MoveConsumer("d", 10), 10)
    a.interval(1_900, 15)
    out = a.read_done(PositionsListing(a.generation, two, {"d": 10, "e": 0}, 15, False, {"b": 50}))
    assert ReleaseConsumer("d") in out and ReleaseConsumer("e") not in out and a.held == 1
    snapshot = SnapshotId("b", 1, 1)
    later = Update("d", SubscriptionKind.DURABLE, snapshot, 12, {"a": 12}, b"cfg-d")
    out = a.marker_seen(16, Marker("b", STREAM, 1, later))
    assert out and MoveConsumer("d", 12) in out, "d is released: moved as its update calls for"


def test_a_durable_listed_where_the_progress_called_for_it_is_released_without_more_moves() -> None:
    """The move asked once every region answered was left alone (none of the durable's
    messages before its target: the read stream's limits removed them) and read back short
    of it; the next read lists the durable past them, where the progress called for it.
    Taken from where the move left it, the read asked for another move (b consumed on),
    and the durable stayed held past it; taken as listed, it is released at that read, the
    move the later progress calls for first (`make soak` seed 9746887200: a held durable
    asked a move at every read, past the liveness window, tests/dev/test_shell_failback.py)."""
    a = asked_to_reach_the_progress()
    a.data_indexed([DataEntry(seq, "b", seq) for seq in range(11, 13)])
    later = Update("d", SubscriptionKind.DURABLE, None, 0, {}, b"cfg-d", {"b": 12}, 12)
    a.marker_seen(16, Marker("b", STREAM, 1, later))
    a.action_done(MoveConsumer("d", 10), 4)  # left alone, read back at 4
    a.interval(1_900, 16)
    out = a.read_done(listing(a, 10, {"b": 50}))  # its floor followed the removals
    actions = [o for o in out if isinstance(o, MoveConsumer | ReleaseConsumer)]
    assert actions == [MoveConsumer("d", 12), ReleaseConsumer("d")] and a.held == 0


def test_with_three_regions_every_other_region_must_answer() -> None:
    regions = ("a", "b", "c")
    a = machine("a", regions)
    lead(a, 10, SILENT)
    request = catch_up_request(a.interval(1_100, 12))
    answers = {}
    for name in ("b", "c"):
        other = machine(name, regions)
        lead(other, 10, {"a": 100})
        other.marker_seen(13, request)
        other.interval(1_200, 13)
        answers[name] = published(other.read_done(listing(other, 10, {"a": 100})))
    markers_at(a, 11, 12, 13)
    for seq, marker in enumerate(answers["b"], start=14):
        a.marker_seen(seq, marker)
    a.interval(1_300, 16)
    out = a.read_done(listing(a, 10, {"b": 50}))
    assert not [o for o in out if isinstance(o, ReleaseConsumer)], "c has not answered"
    for seq, marker in enumerate(answers["c"], start=14 + len(answers["b"])):
        a.marker_seen(seq, marker)
    last = 13 + len(answers["b"]) + len(answers["c"])
    assert reads(a.interval(1_400, last)) == [ReadReason.CATCH_UP]
    assert ReleaseConsumer("d") in a.read_done(listing(a, 10, {"b": 50, "c": 50}))


def test_a_late_answer_to_a_timed_out_catch_up_request_still_counts() -> None:
    b = machine("b")
    lead(b, 10, {"a": 100})
    a = machine("a", timeout_ms=5_000)
    lead(a, 10, SILENT)
    first = catch_up_request(a.interval(1_100, 12))
    # Sourcing has not resumed: the attempt times out, another catch-up request goes out.
    again = a.interval(6_200, 12)
    assert catch_up_request(again).body != first.body
    b.marker_seen(13, first)
    b.interval(6_300, 13)
    markers_at(a, 11, 12, 13)
    for seq, marker in enumerate(published(b.read_done(listing(b, 10, {"a": 100}))), start=14):
        a.marker_seen(seq, marker)
    a.interval(6_400, 16)
    assert ReleaseConsumer("d") in a.read_done(listing(a, 10, {"b": 50}))


def test_the_hold_expires_when_a_region_never_answers() -> None:
    a = machine("a", timeout_ms=2 * HOLD_MS)
    lead(a, 10, SILENT, now=1_000)
    catch_up_request(a.interval(1_100, 12))
    for asked in range(1_100, HOLD_MS - WINDOW_MS, WINDOW_MS):
        assert a.needs().deadline_ms == asked + WINDOW_MS
        catch_up_request(a.tick(asked + WINDOW_MS))
    assert a.needs().deadline_ms == 1_000 + HOLD_MS
    out = a.tick(1_000 + HOLD_MS)
    assert ReleaseConsumer("d") in out
    assert FailbackReleased("d", HOLD_MS, ("b",)) in out
    assert a.held == 0


def test_an_unanswered_catch_up_request_is_asked_again_after_ten_intervals() -> None:
    """A request written while sourcing is down may expire from the write stream (its age
    limit shorter than the time sourcing takes to resume) and never reach the others: asked
    again after `active_window_ms`, whatever the snapshot timeout (`make soak` seed
    821305039233). An answer to any of them counts."""
    b = machine("b")
    lead(b, 10, {"a": 100})
    a = machine("a")
    lead(a, 10, SILENT)
    first = catch_up_request(a.interval(1_100, 12))
    assert a.needs().deadline_ms == 1_100 + WINDOW_MS
    assert published(a.tick(1_100 + WINDOW_MS - 1)) == []
    again = catch_up_request(a.tick(1_100 + WINDOW_MS))
    assert again.body != first.body
    b.marker_seen(13, again)
    b.interval(11_200, 13)
    markers_at(a, 11, 12, 13)
    for seq, marker in enumerate(published(b.read_done(listing(b, 10, {"a": 100}))), start=14):
        a.marker_seen(seq, marker)
    a.interval(11_300, 16)
    assert ReleaseConsumer("d") in a.read_done(listing(a, 10, {"b": 50}))


def test_a_leader_that_steps_down_leaves_the_hold_to_its_successor() -> None:
    a = machine("a")
    lead(a, 10, SILENT)
    a.became_follower()
    assert a.held == 0 and a.tick(1_000 + HOLD_MS) == []
    # Its successor decides from its own first listing: still silent, it holds again.
    assert HoldConsumer("d", HOLD_MS) in lead(a, 10, SILENT, now=2_000)


def test_a_successor_that_heard_every_region_takes_over_the_hold_left_standing() -> None:
    """The leader before stepped down holding (a lease lost to a stall) and every source
    resumed before its successor's first listing: the durable is listed paused, 50 s left of
    the hold. Taken over (no new pause), asked to catch up, released once b answered; before,
    it stayed paused to the deadline (the shell simulation's stall runs)."""
    b = machine("b")
    (update,) = published(lead(b, 10, {"a": 100}))
    a = machine("a")
    out = lead(a, 10, {"b": 300}, leader_age_ms=20_000, paused={"d": 50_000})
    assert not [o for o in out if isinstance(o, HoldConsumer)]
    assert FailbackHeld(("d",), ("b",), adopted=True) in out
    assert a.held == 1
    request = catch_up_request(a.interval(1_100, 12))
    b.marker_seen(13, request)
    b.interval(1_200, 13)
    (response,) = published(b.read_done(listing(b, 10, {"a": 100})))
    markers_at(a, 11, 12, 13)
    a.marker_seen(14, update)
    a.marker_seen(15, response)
    a.interval(1_300, 15)
    out = a.read_done(listing(a, 10, {"b": 50}))  # a's durable covers what b consumed
    assert ReleaseConsumer("d") in out
    # Held since the earlier leader's pause: its 60 s deadline less the 50 s left.
    assert FailbackReleased("d", 10_300, ()) in out
    assert a.held == 0


def test_a_hold_taken_over_ends_at_the_deadline_of_the_pause_it_found() -> None:
    a = machine("a")
    lead(a, 10, {"b": 300}, leader_age_ms=20_000, paused={"d": 30_000})
    assert not [o for o in a.tick(1_000 + 30_000 - 1) if isinstance(o, ReleaseConsumer)]
    out = a.tick(1_000 + 30_000)
    assert ReleaseConsumer("d") in out
    assert FailbackReleased("d", HOLD_MS, ("b",)) in out


@pytest.mark.parametrize(
    ("leader_age_ms", "paused", "why"),
    [
        (HOLD_MS, {"d": 30_000}, "the stream's leader is older than a hold: no return"),
        (20_000, {"d": HOLD_MS + 1}, "paused longer than a hold: an operator's pause"),
        (20_000, {}, "nothing paused: the leader before released it, or never held"),
        (1_000, {"d": 30_000}, "a fresh stream's first leader (created 1.5 s before it)"),
    ],
)
def test_no_hold_taken_over_unless_one_can_stand(
    leader_age_ms: int, paused: Mapping[str, int], why: str
) -> None:
    a = machine("a")
    out = lead(a, 10, {"b": 300}, leader_age_ms=leader_age_ms, stream_age_ms=2_500, paused=paused)
    assert not [o for o in out if isinstance(o, FailbackHeld)], why
    assert a.held == 0


def test_only_a_leaders_first_listing_decides() -> None:
    a = machine("a")
    lead(a, 10, {"b": 300})
    a.interval(1_100, 12, moved=True)
    # b goes away later: its source is silent from now on, but a has heard from it.
    out = a.read_done(listing(a, 10, SILENT))
    assert not [o for o in out if isinstance(o, HoldConsumer)]


def test_sources_resume_one_by_one_so_one_unheard_region_is_enough() -> None:
    """On real servers one source resumed before the sidecar's first read in 2 of 16 returns;
    a rule waiting for every source to be silent missed them (docs/benchmarks.md)."""
    regions = ("a", "b", "c")
    a = machine("a", regions)
    assert HoldConsumer("d", HOLD_MS) in lead(a, 0, {"b": 200, "c": None}, leader_age_ms=12_000)


def test_a_stream_whose_leader_is_older_than_the_hold_is_not_returning() -> None:
    """A sidecar restart in a healthy region while another region is long dead."""
    regions = ("a", "b", "c")
    out = lead(machine("a", regions), 0, {"b": 200, "c": None}, leader_age_ms=HOLD_MS)
    assert not [o for o in out if isinstance(o, HoldConsumer)]


@pytest.mark.parametrize(
    ("leader_age_ms", "stream_age_ms", "held"),
    [
        (5_000, 5_100, False),  # its first leader, 100 ms after its creation: fresh
        (5_000, 6_900, False),  # first elected 1.9 s after its creation: still fresh
        (5_000, 7_000, True),  # elected 2 s after its creation: a return's leader
        (5_000, 86_400_000, True),  # a stream a day old, its leader new: returned
        (None, 1_500, False),  # no leader_since (one replica), created 1.5 s ago
        (None, 60_000, True),  # no leader_since, created a minute ago: as before
        (5_000, None, True),  # no creation time: as before
    ],
)
def test_a_fresh_stream_with_a_region_down_is_not_returning(
    leader_age_ms: int | None, stream_age_ms: int | None, held: bool
) -> None:
    """A first deployment with b down: a's read stream never heard from b, and its leader
    is recent, but it is the stream's first (elected within 2 s of its creation): no
    durable on it stood through a loss, so nothing is held (held until the deadline, 120 s,
    before). A leader elected later than that is a return's, as is one of unknown age on a
    stream older than that."""
    out = lead(
        machine("a"), 0, {"b": None}, leader_age_ms=leader_age_ms, stream_age_ms=stream_age_ms
    )
    assert bool([o for o in out if isinstance(o, HoldConsumer)]) is held


def test_a_gap_the_data_tail_never_indexes_holds_ten_intervals_at_most() -> None:
    """A gap between markers may be a message the data tail never indexes (another subject,
    one removed meanwhile): the release waits for the index ten intervals at most."""
    a, update, response = answered(13, a_at=10)
    a.marker_seen(14, update)
    a.marker_seen(15, response)  # read at 1,600: 11-13 are never indexed here
    a.interval(1_800, 15)
    assert not [o for o in a.read_done(listing(a, 10, {"b": 50})) if isinstance(o, ReleaseConsumer)]
    a.interval(11_500, 15)
    assert not [o for o in a.read_done(listing(a, 10, {"b": 50})) if isinstance(o, ReleaseConsumer)]
    assert reads(a.interval(11_600, 15)) == [ReadReason.CATCH_UP]
    assert ReleaseConsumer("d") in a.read_done(listing(a, 10, {"b": 50}))
