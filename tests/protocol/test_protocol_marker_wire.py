"""Marker facts on the wire: the publish id (`marker_msg_id`) and the writer/subject check."""

from __future__ import annotations

import itertools

import pytest

from sidecar.naming import VirtualStream
from sidecar.protocol import (
    Marker,
    Rejected,
    RejectReason,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    SubscriptionKind,
    Update,
    check_writer,
    marker_msg_id,
)

VS = VirtualStream("orders", ("west", "east", "north"))
SID = SnapshotId("west", 3, 7)


def _update(subscription: str, sid: SnapshotId = SID) -> Update:
    return Update(subscription, SubscriptionKind.DURABLE, sid, 9, {"east": 4}, b"")


def _markers(stream: str = "orders") -> list[Marker]:
    """Markers that must each be stored: no two may share a publish id."""
    return [
        Marker("west", stream, 3, Request(SID, 1)),
        Marker("west", stream, 3, Request(SID, 2)),
        Marker("west", stream, 3, Request(SnapshotId("west", 3, 8), 1)),
        Marker("west", stream, 4, Request(SnapshotId("west", 4, 7), 1)),
        Marker("east", stream, 1, Response(SID, 1, 40)),
        Marker("north", stream, 1, Response(SID, 1, 40)),
        Marker("east", stream, 1, Response(SID, 2, 41)),
        Marker("west", stream, 3, Snapshot(SID, 50, {"east": 40}, 1, 2)),
        Marker("west", stream, 3, Snapshot(SnapshotId("west", 3, 8), 60, {"east": 45}, 3, 4)),
        Marker("west", stream, 3, _update("billing")),
        Marker("west", stream, 3, _update("audit")),
        Marker("west", stream, 3, _update("billing", SnapshotId("west", 3, 8))),
    ]


def test_msg_ids_tell_every_marker_apart() -> None:
    ids = [marker_msg_id(m) for m in _markers() + _markers("payments")]
    assert len(set(ids)) == len(ids)
    assert all(i.isprintable() and " " not in i for i in ids)


def test_msg_id_is_the_same_for_a_retried_publish() -> None:
    for first, again in zip(_markers(), _markers(), strict=True):
        assert marker_msg_id(first) == marker_msg_id(again)


def test_a_response_repeated_under_a_newer_epoch_is_stored_once() -> None:
    """The id of a response is its content (what it answers, where the request landed)."""
    before = Marker("east", "orders", 1, Response(SID, 1, 40))
    after = Marker("east", "orders", 2, Response(SID, 1, 40))
    assert marker_msg_id(before) == marker_msg_id(after)


@pytest.mark.parametrize(
    ("marker", "subject"),
    [
        (m, subject)
        for m, region in itertools.product(_markers(), VS.regions)
        if m.region == region
        for subject in (VS.marker_subject(region), VS.snapshot_subject(region))
    ],
)
def test_a_marker_on_its_writers_subject_is_kept(marker: Marker, subject: str) -> None:
    assert check_writer(marker, subject) is marker


@pytest.mark.parametrize("subject", [VS.marker_subject("east"), VS.snapshot_subject("north")])
def test_a_marker_on_another_regions_subject_is_rejected(subject: str) -> None:
    result = check_writer(Marker("west", "orders", 3, Request(SID, 1)), subject)
    assert isinstance(result, Rejected)
    assert result.reason is RejectReason.INVALID_FIELD
    assert "'west'" in result.detail and subject.rsplit(".", 1)[-1] in result.detail


def test_a_rejected_marker_stays_rejected() -> None:
    rejected = Rejected(RejectReason.MALFORMED, "not a marker")
    assert check_writer(rejected, VS.marker_subject("west")) is rejected
