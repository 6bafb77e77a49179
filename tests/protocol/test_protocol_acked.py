"""Acks above the floor (docs/protocol.md §6): a durable's applications ack out of order, a
slow message holds its floor, and every message acked above it goes to the other regions as
ranges of origin sequences with the progress vector, so that an exact client there skips
them too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from sidecar.protocol import (
    MAX_ACKED_RANGES,
    Acks,
    MachineConfig,
    Marker,
    Output,
    PositionsListing,
    PublishReplicated,
    Rejected,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    decode,
    encode,
)
from sidecar.protocol.markers import marker_msg_id
from sidecar.protocol.origins import DataEntry

STREAM = "V"
SUBS = {"d": SubscriptionInfo(config=b"cfg")}


def leader() -> StreamMachine:
    """Region a, leading: data of origin a at read sequences 1-10 (origin sequences 101-110)
    and 12-13 (origin 112-113: 111 is a marker of a's write stream), a marker at 11."""
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=1_000))
    m.tick(1_000)
    entries = [DataEntry(seq, "a", 100 + seq) for seq in (*range(1, 11), 12, 13)]
    m.data_indexed(entries)
    m.became_leader(1)
    read(m, 0, 1_000)
    return m


def read(
    m: StreamMachine, position: int, now: int, acked: Sequence[int] = (), last_seq: int = 13
) -> list[Update]:
    m.tick(now)
    acks = {"d": Acks(now, tuple(acked))} if acked else {}
    out = m.read_done(
        PositionsListing(m.generation, SUBS, {"d": position}, last_seq, False, acked=acks)
    )
    return updates(out)


def updates(outputs: Sequence[Output]) -> list[Update]:
    return [
        o.marker.body
        for o in outputs
        if isinstance(o, PublishReplicated) and isinstance(o.marker.body, Update)
    ]


def test_acks_above_the_floor_go_out_as_ranges_of_origin_sequences() -> None:
    m = leader()
    (update,) = read(m, 2, 3_000, acked=(1, 2, 4, 5, 6, 9))
    assert update.progress == {"a": 102}
    assert update.acked == {"a": ((104, 106), (109, 109))}
    # The floor passes some: those go, the vector covers them.
    (update,) = read(m, 6, 5_000)
    assert update.progress == {"a": 106} and update.acked == {"a": ((109, 109),)}
    # And the rest: an update says so (the ranges changed though the vector did too).
    (update,) = read(m, 9, 7_000)
    assert update.progress == {"a": 109} and update.acked == {}


def test_acks_in_the_read_that_first_lists_the_durable_count() -> None:
    """Its workers fetched and acked before the sidecar ever listed it (the real-server
    test of parallel workers, tests/scenarios/test_two_regions.py, found them dropped)."""
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=1_000))
    m.tick(1_000)
    m.data_indexed([DataEntry(seq, "a", 100 + seq) for seq in range(1, 11)])
    m.became_leader(1)
    m.tick(2_000)
    listing = PositionsListing(
        m.generation, SUBS, {"d": 2}, 10, False, acked={"d": Acks(2_000, (1, 2, 4, 5))}
    )
    (update,) = updates(m.read_done(listing))
    assert update.acked == {"a": ((104, 105),)}


def test_only_a_change_of_the_ranges_sends_an_update_the_floor_held() -> None:
    m = leader()
    (first,) = read(m, 2, 3_000, acked=(5,))
    assert first.acked == {"a": ((105, 105),)}
    assert read(m, 2, 5_000) == []  # nothing new
    (second,) = read(m, 2, 7_000, acked=(4, 6))
    assert second.progress == first.progress and second.acked == {"a": ((104, 106),)}
    assert marker_msg_id(Marker("a", STREAM, 1, first)) != marker_msg_id(
        Marker("a", STREAM, 1, second)
    )


def test_a_marker_acked_is_no_data_and_one_not_indexed_yet_waits() -> None:
    m = leader()
    # 11 is a marker (a durable that receives markers); 14 is not indexed yet.
    (update,) = read(m, 10, 3_000, acked=(11, 12, 14), last_seq=14)
    assert update.acked == {"a": ((112, 112),)}
    m.data_indexed([DataEntry(14, "a", 114)])
    (update,) = read(m, 10, 5_000, last_seq=14)
    assert update.acked == {"a": ((112, 112), (114, 114))}


def test_ranges_of_consecutive_origin_sequences_only() -> None:
    """10 and 12 are neighbours in the read stream, 110 and 112 are not in the origin: the
    origin's 111 (a marker here, a message that never reached this region elsewhere) is not
    known to be consumed, so the ranges stay apart."""
    m = leader()
    (update,) = read(m, 8, 3_000, acked=(10, 12, 13))
    assert update.acked == {"a": ((110, 110), (112, 113))}


def test_a_follower_sends_nothing_and_the_ranges_are_bounded() -> None:
    m = StreamMachine(MachineConfig("a", STREAM, ("a", "b"), interval_ms=1_000))
    m.tick(1_000)
    count = 3 * MAX_ACKED_RANGES
    m.data_indexed([DataEntry(seq, "a", 2 * seq) for seq in range(1, count + 1)])
    assert read(m, 0, 1_000, acked=(5,), last_seq=count) == []
    m.became_leader(1)
    read(m, 0, 2_000, last_seq=count)
    (update,) = read(m, 1, 3_000, acked=range(2, count + 1), last_seq=count)
    # Every other origin sequence: one range each, the lowest kept.
    assert update.acked["a"][:2] == ((4, 4), (6, 6))
    assert len(update.acked["a"]) == MAX_ACKED_RANGES
    assert len(encode(Marker("a", STREAM, 1, update))) < 32 * 1024


def receiver() -> StreamMachine:
    m = StreamMachine(MachineConfig("b", STREAM, ("a", "b"), interval_ms=1_000))
    m.tick(1_000)
    m.became_leader(1)
    return m


def from_a(progress: Mapping[str, int], acked: Mapping[str, tuple[tuple[int, int], ...]]) -> Marker:
    at = 50
    body = Update("d", SubscriptionKind.DURABLE, None, 0, {}, b"cfg", progress, at, False, acked)
    return Marker("a", STREAM, 1, body)


def test_a_receiver_shows_the_ranges_each_region_sent_last_above_its_progress() -> None:
    m = receiver()
    m.marker_seen(20, from_a({"a": 102}, {"a": ((104, 106), (109, 109))}))
    view = m.subscription("d")
    assert view is not None and view.acked == {"a": ((104, 106), (109, 109))}
    m.marker_seen(21, from_a({"a": 105}, {"a": ((109, 109),)}))
    view = m.subscription("d")
    assert view is not None and view.acked == {"a": ((109, 109),)}
    m.marker_seen(22, from_a({"a": 110}, {}))
    view = m.subscription("d")
    assert view is not None and view.acked == {} and view.progress == {"a": 110}


def test_ranges_below_the_merged_progress_are_left_out() -> None:
    m = receiver()
    m.marker_seen(20, from_a({"a": 102}, {"a": ((104, 106), (109, 109))}))
    # The merged vector covers up to 105 by now (another update said so): 106 and 109 stay.
    m.marker_seen(21, from_a({"a": 105}, {"a": ((106, 106), (109, 109))}))
    view = m.subscription("d")
    assert view is not None and view.acked == {"a": ((106, 106), (109, 109))}


def test_the_ranges_travel_on_the_wire() -> None:
    marker = from_a({"a": 102}, {"a": ((104, 106), (109, 109)), "b": ((3, 3),)})
    assert decode(encode(marker), stream=STREAM, regions=("a", "b")) == marker


@pytest.mark.parametrize(
    ("progress", "acked", "problem"),
    [
        ({"a": 102}, {"a": ((100, 106),)}, "not above 102"),
        ({"a": 102}, {"a": ((104, 106), (106, 107))}, "not above 106"),
        ({"a": 102}, {"a": ((107, 105),)}, "not above"),
        ({"a": 102}, {"z": ((104, 104),)}, "update.acked key"),
    ],
)
def test_bad_ranges_are_rejected(
    progress: Mapping[str, int], acked: Mapping[str, tuple[tuple[int, int], ...]], problem: str
) -> None:
    decoded = decode(encode(from_a(progress, acked)), stream=STREAM, regions=("a", "b"))
    assert isinstance(decoded, Rejected) and problem in decoded.detail, decoded


def test_an_odd_count_of_bounds_or_too_many_ranges_are_rejected() -> None:
    from sidecar._gen.rsub.v1 import markers_pb2 as pb

    msg = pb.Marker.FromString(encode(from_a({"a": 102}, {"a": ((104, 106),)})))
    msg.update.acked["a"].bounds.append(200)
    decoded = decode(msg.SerializeToString(), stream=STREAM, regions=("a", "b"))
    assert isinstance(decoded, Rejected) and "not pairs" in decoded.detail
    many = tuple((200 + 2 * i, 200 + 2 * i) for i in range(MAX_ACKED_RANGES + 1))
    decoded = decode(encode(from_a({"a": 102}, {"a": many})), stream=STREAM, regions=("a", "b"))
    assert isinstance(decoded, Rejected) and "ranges" in decoded.detail
