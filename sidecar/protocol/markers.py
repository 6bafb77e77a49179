"""Marker values, their protobuf codec (`protos/rsub/v1/markers.proto`) and their wire facts.

The state machine works on the frozen dataclasses below; `encode` turns one into bytes for
the wire and `decode` validates bytes read from a read stream. `decode` never raises: any
problem becomes a `Rejected` value naming the field at fault. `check_writer` then holds a
decoded marker against the subject it was stored under, and `marker_msg_id` names a marker
for the server's de-duplication when it is published.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from sidecar._gen.rsub.v1 import markers_pb2 as pb

MAX_POSITION = 2**63 - 1
DEFAULT_MAX_MARKER_BYTES = 64 * 1024
MAX_ROUND = 2
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,254}")


class SubscriptionKind(enum.StrEnum):
    """How a subscription is stored in its region: in markers, in the machine and in the API."""

    DURABLE = "durable"
    """A JetStream durable consumer with `rsub.replicate: "true"` metadata."""
    EXTERNAL = "external"
    """A cursor committed through the API's `CommitCursor` (for example by the Spark source)."""


_KIND_TO_PB = {
    SubscriptionKind.DURABLE: pb.SUBSCRIPTION_KIND_DURABLE,
    SubscriptionKind.EXTERNAL: pb.SUBSCRIPTION_KIND_EXTERNAL,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """Unique snapshot id; within one region, ids order by (epoch, counter)."""

    region: str
    epoch: int
    counter: int

    def __str__(self) -> str:
        return f"{self.region}-{self.epoch}-{self.counter}"


@dataclass(frozen=True, slots=True)
class Request:
    id: SnapshotId
    round: int


@dataclass(frozen=True, slots=True)
class Response:
    """`position` is where the request landed in the responder's read stream."""

    id: SnapshotId
    round: int
    position: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A completed snapshot of region `id.region` (stored in that region's read stream)."""

    id: SnapshotId
    local_position: int
    positions: Mapping[str, int]
    started_ms: int
    completed_ms: int


@dataclass(frozen=True, slots=True)
class Update:
    """Where `subscription` may move in the other regions: the newest snapshot it passed
    (`snapshot_id`, `local_position`, `positions`; unset before its first one) and its
    progress vector read at `progress_position` (empty and 0 without one). At least one."""

    subscription: str
    kind: SubscriptionKind
    snapshot_id: SnapshotId | None
    local_position: int
    positions: Mapping[str, int]
    config: bytes
    progress: Mapping[str, int] = field(default_factory=dict)
    progress_position: int = 0


Body = Request | Response | Snapshot | Update


@dataclass(frozen=True, slots=True)
class Marker:
    """Envelope: the writer's region, the virtual stream and the writer's leader epoch."""

    region: str
    stream: str
    epoch: int
    body: Body


class RejectReason(enum.Enum):
    OVERSIZE = "oversize"
    MALFORMED = "malformed"
    MISSING_FIELD = "missing_field"
    UNKNOWN_REGION = "unknown_region"
    WRONG_STREAM = "wrong_stream"
    OUT_OF_RANGE = "out_of_range"
    INVALID_FIELD = "invalid_field"


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: RejectReason
    detail: str


class _Invalid(Exception):
    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def encode(marker: Marker) -> bytes:
    body = marker.body
    if isinstance(body, Request):
        request = pb.SnapshotRequest(id=_id_pb(body.id), round=body.round)
        msg = _envelope(marker, request=request)
    elif isinstance(body, Response):
        response = pb.SnapshotResponse(id=_id_pb(body.id), round=body.round, position=body.position)
        msg = _envelope(marker, response=response)
    elif isinstance(body, Snapshot):
        snapshot = pb.CompletedSnapshot(
            id=_id_pb(body.id),
            local_position=body.local_position,
            positions=body.positions,
            started_unix_ms=body.started_ms,
            completed_unix_ms=body.completed_ms,
        )
        msg = _envelope(marker, snapshot=snapshot)
    else:
        update = pb.SubscriptionUpdate(
            subscription=body.subscription,
            kind=_KIND_TO_PB[body.kind],
            snapshot_id=_id_pb(body.snapshot_id) if body.snapshot_id is not None else None,
            local_position=body.local_position,
            positions=body.positions,
            config=body.config,
            progress=body.progress,
            progress_position=body.progress_position,
        )
        msg = _envelope(marker, update=update)
    return msg.SerializeToString()


def decode(
    data: bytes,
    *,
    stream: str,
    regions: Collection[str],
    max_bytes: int = DEFAULT_MAX_MARKER_BYTES,
) -> Marker | Rejected:
    """Parse and validate one marker read from `stream`'s read stream."""
    if len(data) > max_bytes:
        return Rejected(RejectReason.OVERSIZE, f"marker is {len(data)} bytes, limit {max_bytes}")
    msg = pb.Marker()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RecursionError) as exc:
        return Rejected(RejectReason.MALFORMED, f"not a marker: {exc}")
    try:
        return _validate(msg, stream, regions)
    except _Invalid as exc:
        return Rejected(exc.reason, exc.detail)


def check_writer(decoded: Marker | Rejected, subject: str) -> Marker | Rejected:
    """`decoded` unless it was stored under the subject of another region than its writer's.

    The last token of a marker subject names the region that wrote it (`_rsub.<V>.marker.<r>`
    and `_rsub.<V>.snapshot.<r>`, see `VirtualStream.marker_subject`). NATS permissions let a
    region's sidecar publish only on its own subjects, while the `region` field is whatever the
    writer put in the body: only a marker whose two regions agree may speak for its region
    (otherwise one region could fence or answer in the name of another).
    """
    subject_region = subject.rsplit(".", 1)[-1]
    if isinstance(decoded, Marker) and decoded.region != subject_region:
        return Rejected(
            RejectReason.INVALID_FIELD,
            f"region: {decoded.region!r} wrote on the subject of {subject_region!r}",
        )
    return decoded


def marker_msg_id(marker: Marker) -> str:
    """The `Nats-Msg-Id` of a marker: unique to its content, so a retried publish is stored once.

    Ids are global across regions and streams: a request or snapshot id already names its
    region, a response names its responder, an update its subscription, snapshot (or writer),
    and the position its progress was read at with a digest of the progress itself.
    """
    body, prefix = marker.body, f"rsub.{marker.stream}"
    if isinstance(body, Request):
        return f"{prefix}.req.{body.id}.{body.round}"
    if isinstance(body, Response):
        return f"{prefix}.resp.{marker.region}.{body.id}.{body.round}"
    if isinstance(body, Snapshot):
        return f"{prefix}.snap.{body.id}"
    at = body.snapshot_id if body.snapshot_id is not None else marker.region
    if not body.progress_position:
        return f"{prefix}.upd.{body.subscription}.{at}"
    # The vector read at one position grows while the origin index catches up: an id
    # without it would make the server drop the larger vector as a duplicate.
    progress = ",".join(f"{o}={s}" for o, s in sorted(body.progress.items()))
    digest = hashlib.blake2s(progress.encode(), digest_size=8).hexdigest()
    return f"{prefix}.upd.{body.subscription}.{at}.at{body.progress_position}.{digest}"


def _validate(msg: pb.Marker, stream: str, regions: Collection[str]) -> Marker:
    region = _region("region", msg.region, regions)
    if msg.stream != stream:
        raise _Invalid(
            RejectReason.WRONG_STREAM, f"stream: {msg.stream[:64]!r}, expected {stream!r}"
        )
    epoch = _positive("epoch", msg.epoch)
    kind = msg.WhichOneof("body")
    body: Body
    if kind == "request":
        body = Request(
            _snapshot_id("request.id", msg.request, "id", regions, region),
            _round("request.round", msg.request.round),
        )
    elif kind == "response":
        sid = _snapshot_id("response.id", msg.response, "id", regions, None)
        if sid.region == region:
            raise _Invalid(
                RejectReason.INVALID_FIELD, f"response.id.region: {region} answers itself"
            )
        body = Response(
            sid,
            _round("response.round", msg.response.round),
            _positive("response.position", msg.response.position),
        )
    elif kind == "snapshot":
        s = msg.snapshot
        body = Snapshot(
            _snapshot_id("snapshot.id", s, "id", regions, region),
            _positive("snapshot.local_position", s.local_position),
            _positions("snapshot.positions", s.positions, regions, region),
            s.started_unix_ms,
            s.completed_unix_ms,
        )
    elif kind == "update":
        u = msg.update
        if not _NAME_RE.fullmatch(u.subscription):
            raise _Invalid(
                RejectReason.INVALID_FIELD if u.subscription else RejectReason.MISSING_FIELD,
                f"update.subscription: invalid name {u.subscription[:64]!r}",
            )
        if u.kind not in _KIND_FROM_PB:
            raise _Invalid(RejectReason.INVALID_FIELD, f"update.kind: unknown kind {u.kind}")
        body = _update(u, regions, region)
    else:
        raise _Invalid(RejectReason.MISSING_FIELD, "body: no request/response/snapshot/update")
    return Marker(region, stream, epoch, body)


def _update(u: pb.SubscriptionUpdate, regions: Collection[str], writer: str) -> Update:
    progress: dict[str, int] = {}
    progress_position = 0
    if u.progress or u.progress_position:
        progress_position = _positive("update.progress_position", u.progress_position)
        progress = _origin_seqs("update.progress", u.progress, regions)
    if u.HasField("snapshot_id"):
        snapshot_id: SnapshotId | None = _snapshot_id(
            "update.snapshot_id", u, "snapshot_id", regions, writer
        )
        local_position = _positive("update.local_position", u.local_position)
        positions = _positions("update.positions", u.positions, regions, writer)
    elif progress:
        if u.local_position or u.positions:
            raise _Invalid(RejectReason.INVALID_FIELD, "update: snapshot fields without its id")
        snapshot_id, local_position, positions = None, 0, {}
    else:
        raise _Invalid(RejectReason.MISSING_FIELD, "update: neither snapshot_id nor progress")
    return Update(
        u.subscription,
        _KIND_FROM_PB[u.kind],
        snapshot_id,
        local_position,
        positions,
        u.config,
        progress,
        progress_position,
    )


def _origin_seqs(field: str, value: Mapping[str, int], regions: Collection[str]) -> dict[str, int]:
    """A progress vector: origin sequences of known regions (the writer's own included)."""
    out = dict(value)
    if not out:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: empty")
    for region, seq in out.items():
        if region not in regions:
            _region(f"{field} key", region, regions)
        if not 0 < seq <= MAX_POSITION:
            _positive(f"{field}[{region}]", seq)
    return out


def _region(field: str, value: str, regions: Collection[str]) -> str:
    if not value:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: missing")
    if value not in regions:
        raise _Invalid(RejectReason.UNKNOWN_REGION, f"{field}: unknown region {value[:64]!r}")
    return value


def _positive(field: str, value: int) -> int:
    if value == 0:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: missing")
    if value > MAX_POSITION:
        raise _Invalid(RejectReason.OUT_OF_RANGE, f"{field}: {value} exceeds 2**63-1")
    return value


def _round(field: str, value: int) -> int:
    if not 1 <= value <= MAX_ROUND:
        raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: {value} not in 1..{MAX_ROUND}")
    return value


def _snapshot_id(
    field: str,
    parent: pb.SnapshotRequest | pb.SnapshotResponse | pb.CompletedSnapshot | pb.SubscriptionUpdate,
    name: str,
    regions: Collection[str],
    writer: str | None,
) -> SnapshotId:
    if not parent.HasField(name):
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: missing")
    sid: pb.SnapshotId = getattr(parent, name)
    region = _region(f"{field}.region", sid.region, regions)
    if writer is not None and region != writer:
        raise _Invalid(RejectReason.INVALID_FIELD, f"{field}.region: {region}, writer is {writer}")
    return SnapshotId(
        region, _positive(f"{field}.epoch", sid.epoch), _positive(f"{field}.counter", sid.counter)
    )


def _positions(
    field: str, value: Mapping[str, int], regions: Collection[str], writer: str
) -> dict[str, int]:
    out = dict(value)  # one copy out of the protobuf map; its item view is slow
    for region, position in out.items():
        if region not in regions:
            _region(f"{field} key", region, regions)
        if region == writer:
            raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: names the writer {writer}")
        if not 0 < position <= MAX_POSITION:
            _positive(f"{field}[{region}]", position)
    return out


def _envelope(
    marker: Marker,
    *,
    request: pb.SnapshotRequest | None = None,
    response: pb.SnapshotResponse | None = None,
    snapshot: pb.CompletedSnapshot | None = None,
    update: pb.SubscriptionUpdate | None = None,
) -> pb.Marker:
    return pb.Marker(
        region=marker.region,
        stream=marker.stream,
        epoch=marker.epoch,
        request=request,
        response=response,
        snapshot=snapshot,
        update=update,
    )


def _id_pb(sid: SnapshotId) -> pb.SnapshotId:
    return pb.SnapshotId(region=sid.region, epoch=sid.epoch, counter=sid.counter)
