"""Marker codec: round trips, typed rejections, and a fuzz test of the decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar._gen.rsub.v1 import markers_pb2 as pb
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
    decode,
    encode,
)

REGIONS = ("east", "west", "north")
SID = SnapshotId("west", 3, 7)


def _decode(data: bytes, **kw: int) -> Marker | Rejected:
    return decode(data, stream="orders", regions=REGIONS, **kw)


@pytest.mark.parametrize(
    "marker",
    [
        Marker("west", "orders", 3, Request(SID, 1)),
        Marker("east", "orders", 9, Response(SID, 2, 41)),
        Marker("west", "orders", 3, Snapshot(SID, 99, {"east": 5, "north": 6}, 10, 20)),
        Marker(
            "west",
            "orders",
            3,
            Update("spark-q1", SubscriptionKind.EXTERNAL, SID, 99, {"east": 5}, b"{}"),
        ),
    ],
)
def test_round_trip(marker: Marker) -> None:
    assert _decode(encode(marker)) == marker


_POSITION = st.integers(1, 2**63 - 1)


@st.composite
def _markers(draw: st.DrawFn) -> Marker:
    """Any valid marker of `REGIONS` on stream "orders"."""
    writer = draw(st.sampled_from(REGIONS))
    others = [r for r in REGIONS if r != writer]
    sid = SnapshotId(writer, draw(_POSITION), draw(_POSITION))
    positions = draw(st.dictionaries(st.sampled_from(others), _POSITION))
    kind = draw(st.sampled_from(["request", "response", "snapshot", "update", "progress"]))
    body: Request | Response | Snapshot | Update
    if kind == "request":
        body = Request(sid, draw(st.integers(1, 2)))
    elif kind == "response":
        answered = SnapshotId(draw(st.sampled_from(others)), sid.epoch, sid.counter)
        body = Response(answered, draw(st.integers(1, 2)), draw(_POSITION))
    elif kind == "snapshot":
        ms = st.integers(-(2**63), 2**63 - 1)
        body = Snapshot(sid, draw(_POSITION), positions, draw(ms), draw(ms))
    else:
        name = draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True))
        progress = draw(
            st.dictionaries(st.sampled_from(REGIONS), _POSITION, min_size=kind == "progress")
        )
        at = draw(_POSITION) if progress else 0
        local = draw(_POSITION)
        subscription_kind = draw(st.sampled_from(SubscriptionKind))
        config = draw(st.binary(max_size=16))
        if kind == "progress":
            body = Update(name, subscription_kind, None, 0, {}, config, progress, at)
        else:
            body = Update(name, subscription_kind, sid, local, positions, config, progress, at)
    return Marker(writer, "orders", draw(_POSITION), body)


def _pb_id(sid: SnapshotId) -> pb.SnapshotId:
    return pb.SnapshotId(region=sid.region, epoch=sid.epoch, counter=sid.counter)


def _pb_message(marker: Marker) -> pb.Marker:
    """The protobuf message of `marker`, built field by field from the schema's constructors
    (an oracle for `encode`, which sets fields in place)."""
    msg = pb.Marker(region=marker.region, stream=marker.stream, epoch=marker.epoch)
    body = marker.body
    if isinstance(body, Request):
        msg.request.CopyFrom(pb.SnapshotRequest(id=_pb_id(body.id), round=body.round))
    elif isinstance(body, Response):
        response = pb.SnapshotResponse(id=_pb_id(body.id), round=body.round, position=body.position)
        msg.response.CopyFrom(response)
    elif isinstance(body, Snapshot):
        snapshot = pb.CompletedSnapshot(
            id=_pb_id(body.id),
            local_position=body.local_position,
            positions=body.positions,
            started_unix_ms=body.started_ms,
            completed_unix_ms=body.completed_ms,
        )
        msg.snapshot.CopyFrom(snapshot)
    else:
        kinds = {
            SubscriptionKind.DURABLE: pb.SUBSCRIPTION_KIND_DURABLE,
            SubscriptionKind.EXTERNAL: pb.SUBSCRIPTION_KIND_EXTERNAL,
        }
        update = pb.SubscriptionUpdate(
            subscription=body.subscription,
            kind=kinds[body.kind],
            snapshot_id=_pb_id(body.snapshot_id) if body.snapshot_id is not None else None,
            local_position=body.local_position,
            positions=body.positions,
            config=body.config,
            progress=body.progress,
            progress_position=body.progress_position,
        )
        msg.update.CopyFrom(update)
    return msg


@settings(max_examples=300, deadline=None)
@given(_markers())
def test_any_valid_marker_round_trips_and_encodes_its_schema_fields(marker: Marker) -> None:
    data = encode(marker)
    assert pb.Marker.FromString(data) == _pb_message(marker)
    assert _decode(data) == marker


def _raw(**fields: object) -> bytes:
    msg = pb.Marker(region="west", stream="orders", epoch=3)
    msg.request.id.region = "west"
    msg.request.id.epoch = 3
    msg.request.id.counter = 1
    msg.request.round = 1
    for name, value in fields.items():
        target: object = msg
        *path, last = name.split("__")
        for part in path:
            target = getattr(target, part)
        setattr(target, last, value)
    return msg.SerializeToString()


@pytest.mark.parametrize(
    ("data", "reason", "field"),
    [
        (b"\xff\xff\xff", RejectReason.MALFORMED, "not a marker"),
        (_raw(region="mars"), RejectReason.UNKNOWN_REGION, "region"),
        (_raw(region=""), RejectReason.MISSING_FIELD, "region"),
        (_raw(stream="payments"), RejectReason.WRONG_STREAM, "stream"),
        (_raw(epoch=0), RejectReason.MISSING_FIELD, "epoch"),
        (_raw(epoch=2**63), RejectReason.OUT_OF_RANGE, "epoch"),
        (_raw(request__round=3), RejectReason.INVALID_FIELD, "request.round"),
        (_raw(request__id__region="east"), RejectReason.INVALID_FIELD, "request.id.region"),
        (_raw(request__id__counter=0), RejectReason.MISSING_FIELD, "request.id.counter"),
        (
            pb.Marker(region="west", stream="orders", epoch=1).SerializeToString(),
            RejectReason.MISSING_FIELD,
            "body",
        ),
    ],
)
def test_rejections_name_the_field(data: bytes, reason: RejectReason, field: str) -> None:
    result = _decode(data)
    assert isinstance(result, Rejected)
    assert result.reason is reason
    assert field in result.detail


def test_response_position_range_and_self_answer() -> None:
    ok = Marker("east", "orders", 1, Response(SID, 1, 2**63 - 1))
    assert _decode(encode(ok)) == ok
    msg = pb.Marker()
    msg.ParseFromString(encode(ok))
    msg.response.position = 2**63
    bad = _decode(msg.SerializeToString())
    assert isinstance(bad, Rejected) and bad.reason is RejectReason.OUT_OF_RANGE
    own = encode(Marker("west", "orders", 1, Response(SID, 1, 5)))
    res = _decode(own)
    assert isinstance(res, Rejected) and "answers itself" in res.detail


def test_update_validation() -> None:
    def upd(**kw: object) -> bytes:
        fields: dict[str, object] = {
            "subscription": "d1",
            "kind": SubscriptionKind.DURABLE,
            "snapshot_id": SID,
            "local_position": 4,
            "positions": {"east": 3},
            "config": b"",
        }
        fields.update(kw)
        return encode(Marker("west", "orders", 3, Update(**fields)))  # type: ignore[arg-type]

    cases = [
        (upd(subscription=""), RejectReason.MISSING_FIELD, "update.subscription"),
        (upd(subscription="_bad name"), RejectReason.INVALID_FIELD, "update.subscription"),
        (upd(positions={"mars": 3}), RejectReason.UNKNOWN_REGION, "update.positions"),
        (upd(positions={"west": 3}), RejectReason.INVALID_FIELD, "names the writer"),
        (upd(positions={"east": 0}), RejectReason.MISSING_FIELD, "update.positions[east]"),
    ]
    for data, reason, text in cases:
        result = _decode(data)
        assert isinstance(result, Rejected), text
        assert result.reason is reason and text in result.detail
    msg = pb.Marker()
    msg.ParseFromString(upd())
    msg.update.kind = pb.SUBSCRIPTION_KIND_UNSPECIFIED
    result = _decode(msg.SerializeToString())
    assert isinstance(result, Rejected) and "update.kind" in result.detail


def test_oversize_is_rejected_with_configurable_limit() -> None:
    big = encode(
        Marker(
            "west",
            "orders",
            3,
            Update("d1", SubscriptionKind.DURABLE, SID, 4, {"east": 3}, b"x" * 2000),
        )
    )
    assert not isinstance(_decode(big), Rejected)
    result = _decode(big, max_bytes=1000)
    assert isinstance(result, Rejected) and result.reason is RejectReason.OVERSIZE


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    assert isinstance(_decode(data), Marker | Rejected)


@settings(max_examples=300, deadline=None)
@given(
    region=st.text(max_size=8),
    stream=st.sampled_from(["orders", "other", ""]),
    epoch=st.integers(0, 2**64 - 1),
    counter=st.integers(0, 2**64 - 1),
    round_=st.integers(0, 2**32 - 1),
    position=st.integers(0, 2**64 - 1),
)
def test_structured_fuzz_never_raises(
    region: str, stream: str, epoch: int, counter: int, round_: int, position: int
) -> None:
    msg = pb.Marker(region=region, stream=stream, epoch=epoch)
    msg.response.id.region = "west"
    msg.response.id.epoch = epoch
    msg.response.id.counter = counter
    msg.response.round = round_
    msg.response.position = position
    result = _decode(msg.SerializeToString())
    if isinstance(result, Marker):
        assert isinstance(result.body, Response)
        assert 1 <= result.body.position <= 2**63 - 1
        assert result.region in REGIONS and result.region != "west"
