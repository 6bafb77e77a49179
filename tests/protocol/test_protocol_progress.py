"""Progress vectors in the machine (DESIGN §7): sent without snapshots, applied exactly."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

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
from tests.protocol.origin_reference import (
    brute_position,
    brute_trim,
    brute_vector,
    busy_read_stream,
    trim_positions,
)

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


def vectors(outputs: Sequence[Output]) -> dict[str, tuple[dict[str, int], int]]:
    """Per subscription, the vector and its position in the updates among `outputs`."""
    sent = {}
    for marker in updates(outputs):
        assert isinstance(marker.body, Update)
        sent[marker.body.subscription] = (dict(marker.body.progress), marker.body.progress_position)
    return sent


def vector_update(origin: str, progress: Mapping[str, int], at: int) -> Marker:
    """An update of `d` from `origin` carrying a vector only."""
    body = Update("d", SUBS["d"].kind, None, 0, {}, b"cfg-d", dict(progress), at)
    return Marker(origin, STREAM, 1, body)


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


def test_a_vector_read_ahead_of_the_index_is_sent_again_fuller_at_the_same_position() -> None:
    """Positions are read apart from the data tail that feeds the index: a vector at a
    position the index has not reached covers only what is indexed, and once the index caught
    up a fuller vector at the same position follows. So the vector a region sent last, not
    the first one at a position, is the one the others end up holding (tests/scenarios/
    test_outage.py waits for that one)."""
    a = machine("a")
    a.data_indexed(Q_A[:3])  # a1 b1 a2 indexed; c1 b2 a3 not yet
    a.tick(1_000)
    assert vectors(a.positions_read({"d": 5}, 6)) == {"d": ({"a": 2, "b": 1}, 5)}
    a.data_indexed(Q_A[3:])
    a.tick(2_000)
    assert vectors(a.positions_read({"d": 5}, 6)) == {"d": ({"a": 2, "b": 2, "c": 1}, 5)}


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


def test_received_vectors_merge_elementwise_not_by_arrival() -> None:
    """docs/protocol.md §6, "Applying": b's progress is the elementwise maximum of the vectors
    it received, whichever came last; the move follows the merged vector."""
    b = machine("b")
    # Q_b: a1 c1 a2 a3 a4 c2 a5 b1: {a: 5, c: 2} covers up to 7, {a: 3, c: 2} only up to 4.
    q_b = entries(
        (1, "a", 1), (2, "c", 1), (3, "a", 2), (4, "a", 3),
        (5, "a", 4), (6, "c", 2), (7, "a", 5), (8, "b", 1),
    )  # fmt: skip
    b.data_indexed(q_b)
    b.positions_read({"d": 0}, 8)
    b.marker_seen(9, vector_update("a", {"a": 5, "c": 1}, 7))
    b.marker_seen(10, vector_update("c", {"a": 3, "c": 2}, 6))
    view = b.subscription("d")
    assert view is not None and dict(view.progress) == {"a": 5, "c": 2}
    out = b.positions_read({"d": 0}, 8)
    assert [o for o in out if isinstance(o, MoveConsumer)] == [MoveConsumer("d", 7)]


def test_many_received_vectors_merge_to_their_elementwise_maximum() -> None:
    """Vectors from two regions, each rising but arriving interleaved, so that the one just
    received is often below the other's on some origin: after each, b's progress and the
    position it moves to are those of the elementwise maximum of all received so far."""
    rng = random.Random(5)
    b = machine("b")
    q_b = busy_read_stream(rng, 3_000, REGIONS)
    end = q_b[-1].read_seq
    b.data_indexed(q_b)
    b.positions_read({"d": 0}, end)
    sent = {"a": {"a": 0, "b": 0, "c": 0}, "c": {"a": 0, "b": 0, "c": 0}}
    merged: dict[str, int] = {}
    for seq in range(end + 1, end + 200):
        origin = rng.choice(("a", "c"))
        vector = sent[origin]
        for o in rng.sample(REGIONS, 2):
            vector[o] += rng.randint(0, 15)
        named = {o: s for o, s in vector.items() if s}  # a vector leaves out origins at 0
        b.marker_seen(seq, vector_update(origin, named, seq))
        for o, s in named.items():
            merged[o] = max(merged.get(o, 0), s)
        view = b.subscription("d")
        assert view is not None and dict(view.progress) == merged
    out = b.positions_read({"d": 0}, end)
    position = brute_position(q_b, merged, 0)
    assert position > 0
    assert [o for o in out if isinstance(o, MoveConsumer)] == [MoveConsumer("d", position)]


def test_the_index_is_trimmed_exactly_at_the_lowest_mark_delete() -> None:
    """Thousands of interleaved messages, replicated subscriptions at various mark-deletes
    (the lowest at or just before the end of a run): each sends the exact vector at its
    mark-delete; the index is then trimmed at the lowest one and no further (trim point and
    runs kept as the reference computes them); afterwards a vector is read exactly at any
    position at or above the trim point, and none below it."""
    rng = random.Random(11)
    q_a = busy_read_stream(rng, 16_000, REGIONS)
    end = q_a[-1].read_seq
    for lowest in trim_positions(rng, q_a, 12):
        marks = {"d0": lowest} | {f"d{i}": rng.randint(lowest, end) for i in range(1, 5)}
        a = StreamMachine(MachineConfig("a", STREAM, REGIONS, interval_ms=INTERVAL))
        a.subscriptions_changed(dict.fromkeys(marks, SubscriptionInfo()))
        a.became_leader(1)
        a.data_indexed(q_a)
        a.tick(1_000)
        sent = vectors(a.positions_read(marks, end))
        assert sent == {name: (brute_vector(q_a, m), m) for name, m in marks.items()}

        trim_point, kept = brute_trim(q_a, lowest)
        assert 0 < trim_point <= lowest  # runs were dropped, none past the lowest mark-delete
        assert a.origin_index_runs == kept

        probes = {trim_point - 1, trim_point, trim_point + 1, lowest, lowest + 1}
        probes |= set(rng.sample(range(trim_point, end + 1), 8))
        new = {f"p{m}": m for m in probes}
        a.subscriptions_changed(dict.fromkeys(marks | new, SubscriptionInfo()))
        a.tick(2_000)
        sent = vectors(a.positions_read(marks | new, end))
        expected = {n: (brute_vector(q_a, m), m) for n, m in new.items() if m >= trim_point}
        assert sent == expected
        assert a.origin_index_runs == kept  # nothing more goes below the trim point


def test_vectors_go_out_on_their_own_cadence() -> None:
    """With `progress_interval_ms` shorter than the snapshot interval, a changed vector goes
    out once per progress interval, not once per snapshot interval."""
    config = MachineConfig("a", STREAM, REGIONS, interval_ms=INTERVAL, progress_interval_ms=250)
    m = StreamMachine(config)
    m.subscriptions_changed(SUBS)
    m.became_leader(1)
    m.data_indexed([DataEntry(seq, "a", seq) for seq in range(1, 21)])
    sent = []
    for step, now in enumerate(range(0, 1_000, 100), start=1):
        m.tick(now)
        for marker in updates(m.positions_read({"d": 2 * step}, 20)):
            assert isinstance(marker.body, Update)
            sent.append((now, marker.body.progress_position))
    # Every 300 ms (the first read at or after 250 ms since the last), not once a second.
    assert sent == [(0, 2), (300, 8), (600, 14), (900, 20)]
    default = MachineConfig("a", STREAM, REGIONS, interval_ms=INTERVAL)
    assert default.vector_interval_ms == INTERVAL
