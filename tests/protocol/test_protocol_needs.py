"""What the machine asks of the runtime: when to call it (`needs`), when to read positions
(`ReadPositions` and why), whether a listing is current (`generation`), and what a raw
marker is (`marker_read`)."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.naming import VirtualStream
from sidecar.protocol import (
    CreateConsumer,
    MachineConfig,
    Marker,
    MarkerRead,
    MarkerRejected,
    MoveConsumer,
    Output,
    PositionsListing,
    PublishReplicated,
    ReadPositions,
    ReadReason,
    RejectReason,
    Request,
    SnapshotId,
    SnapshotStarted,
    StoredMarker,
    StreamMachine,
    SubscriptionInfo,
    Update,
    encode,
)

STREAM = "V"
SUBS = {"d": SubscriptionInfo(config=b"cfg-d")}
VS = VirtualStream(STREAM, ("a", "b"))


def machine(*, leader: bool = True, interval_ms: int = 1_000) -> StreamMachine:
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=interval_ms))
    m.tick(500)
    m.positions_listed(PositionsListing(0, SUBS, {"d": 0}, 0, follows_end=False))
    if leader:
        m.became_leader(1)
    return m


def reads(outputs: Sequence[Output]) -> list[ReadReason]:
    return [o.reason for o in outputs if isinstance(o, ReadPositions)]


def listing(m: StreamMachine, positions: dict[str, int], last_seq: int) -> PositionsListing:
    return PositionsListing(m.generation, SUBS, positions, last_seq, follows_end=False)


def test_a_new_leader_reads_once_and_one_read_is_out_at_a_time() -> None:
    m = machine()
    assert m.needs().deadline_ms == 500  # the read it wants: at the next interval
    assert reads(m.interval(1_000, 0)) == [ReadReason.LEADERSHIP]
    # Out: neither a signal nor a sweep asks for another; both wait for its outcome.
    assert reads(m.interval(1_100, 0, moved=True, sweep=True)) == []
    assert m.needs().deadline_ms is None
    m.read_done(listing(m, {"d": 0}, 0))
    assert m.needs().deadline_ms == 1_100
    assert reads(m.interval(1_200, 0)) == [ReadReason.SIGNAL]
    m.read_failed()
    assert reads(m.interval(1_300, 0)) == [ReadReason.RETRY]
    m.read_done(listing(m, {"d": 0}, 0))
    assert m.needs().deadline_ms is None and reads(m.interval(1_400, 0)) == []


def test_a_follower_reads_only_on_its_sweep_and_ignores_signals() -> None:
    m = machine(leader=False)
    assert not m.needs().signals and m.needs().deadline_ms is None
    assert reads(m.interval(1_000, 5, moved=True)) == []
    assert reads(m.interval(1_100, 5, sweep=True)) == [ReadReason.SWEEP]
    m.read_failed()  # a failed sweep is retried, follower or not
    assert reads(m.interval(1_200, 5)) == [ReadReason.RETRY]


def test_a_stream_growing_under_a_position_at_its_end_asks_for_a_read() -> None:
    m = machine()
    m.interval(1_000, 0)
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 10}, 10, follows_end=True))
    assert reads(m.interval(1_100, 10)) == []  # not grown
    assert reads(m.interval(1_200, 12)) == [ReadReason.GREW]
    m.read_done(PositionsListing(m.generation, SUBS, {"d": 11}, 12, follows_end=False))
    assert reads(m.interval(1_300, 15)) == []  # grown, but no position follows the end


def test_the_deadline_is_the_next_start_or_the_pending_attempts_timeout() -> None:
    m = machine(interval_ms=1_000)
    m.interval(1_000, 0)
    m.read_done(listing(m, {"d": 0}, 0))
    assert m.needs().deadline_ms is None  # no new data: nothing to start
    m.read_stream_advanced(5)
    # Data: a snapshot to start (a leader with a replicated subscription), at once.
    assert m.needs().deadline_ms == 500
    out = m.interval(1_000, 5)
    assert any(isinstance(o, SnapshotStarted) for o in out)
    assert m.needs().deadline_ms == 1_000 + m.config.timeout_ms
    m.became_follower()
    assert m.needs() == m.needs().__class__(None, signals=False)


def test_a_listing_begun_before_a_creation_keeps_its_positions_not_its_subscriptions() -> None:
    m = machine()
    update = Update("e", SUBS["d"].kind, SnapshotId("b", 1, 1), 3, {"a": 7}, b"{}", {}, 0)
    before = m.generation
    out = m.marker_seen(4, Marker("b", STREAM, 1, update))
    (create,) = [o for o in out if isinstance(o, CreateConsumer)]
    assert m.generation == before + 1
    m.action_done(create, 7)
    # Listed before the creation: without "e". Taken as current, "e" would be forgotten.
    m.positions_listed(PositionsListing(before, SUBS, {"d": 2}, 9, follows_end=False))
    e, d = m.subscription("e"), m.subscription("d")
    assert e is not None and e.exists and e.mark_delete == 7
    assert d is not None and d.mark_delete == 2  # its positions are taken
    # A current listing without it: the user deleted it, and it is forgotten.
    m.positions_listed(PositionsListing(m.generation, SUBS, {"d": 2}, 9, follows_end=False))
    assert m.subscription("e") is None


def test_a_move_carried_out_asks_for_a_read_and_one_left_alone_does_not() -> None:
    m = machine()
    m.interval(1_000, 0)
    m.read_done(listing(m, {"d": 0}, 20))
    update = Update("d", SUBS["d"].kind, SnapshotId("b", 1, 1), 3, {"a": 7}, b"{}", {}, 0)
    out = m.marker_seen(21, Marker("b", STREAM, 1, update))
    (move,) = [o for o in out if isinstance(o, MoveConsumer)]
    m.action_done(move, 5)  # left alone below the target: its acks will tell
    assert reads(m.interval(1_100, 21)) == []
    m.positions_listed(listing(m, {"d": 5}, 21))
    update = Update("d", SUBS["d"].kind, SnapshotId("b", 1, 2), 9, {"a": 12}, b"{}", {}, 0)
    out = m.marker_seen(22, Marker("b", STREAM, 1, update))
    (move,) = [o for o in out if isinstance(o, MoveConsumer)]
    m.action_done(move, 12)
    assert reads(m.interval(1_200, 22)) == [ReadReason.OUTCOME]


def test_an_accepted_vector_asks_for_a_read() -> None:
    m = machine()
    m.interval(1_000, 0)
    m.read_done(listing(m, {"d": 0}, 0))
    update = Update("d", SUBS["d"].kind, None, 0, {}, b"{}", {"b": 4}, 9)
    m.marker_seen(3, Marker("b", STREAM, 1, update))
    assert reads(m.interval(1_100, 3)) == [ReadReason.VECTOR]
    m.read_done(listing(m, {"d": 0}, 3))
    m.marker_seen(4, Marker("b", STREAM, 1, update))  # nothing new: no read
    assert reads(m.interval(1_200, 4)) == []


def test_marker_read_decodes_checks_the_writer_and_ticks_around_it() -> None:
    b = StreamMachine(MachineConfig("b", STREAM, ("a", "b")))
    b.became_leader(1)
    request = Marker("a", STREAM, 1, Request(SnapshotId("a", 1, 1), 1))
    out = b.marker_read(StoredMarker(7, VS.marker_subject("a"), encode(request)), 2_000)
    assert out[0] == MarkerRead(7, "a")
    assert [o for o in out if isinstance(o, PublishReplicated)]  # answered
    # Written under another region's subject: rejected, nothing answered.
    forged = Marker("a", STREAM, 1, Request(SnapshotId("a", 1, 2), 1))
    out = b.marker_read(StoredMarker(8, VS.marker_subject("b"), encode(forged)), 2_100)
    (rejected,) = out
    assert isinstance(rejected, MarkerRejected) and rejected.read_seq == 8
    assert rejected.rejected.reason is RejectReason.INVALID_FIELD
    out = b.marker_read(StoredMarker(9, VS.marker_subject("a"), b"\xff junk"), 2_200)
    assert [type(o) for o in out] == [MarkerRejected]
    assert b.pending() is None  # a follower of snapshots: none of its own
