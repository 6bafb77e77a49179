"""Marker values, their protobuf codec (`protos/rsub/v1/markers.proto`) and their wire facts.

The state machine works on the frozen dataclasses below; `encode` turns one into bytes for
the wire and `decode` validates bytes read from a read stream. `decode` never raises: any
problem becomes a `Rejected` value naming the field at fault. `check_writer` then holds a
decoded marker against the subject it was stored under, and `marker_msg_id` names a marker
for the server's de-duplication when it is published.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import NoReturn

from google.protobuf.message import DecodeError

from sidecar._gen.rsub.v1 import markers_pb2 as pb

MAX_POSITION = 2**63 - 1
DEFAULT_MAX_MARKER_BYTES = 64 * 1024
MAX_ROUND = 2
MAX_ACKED_RANGES = 1_000
"""Ranges of acked origin sequences one update carries, all origins together: at most 20
bytes each on the wire, so an update stays well under `DEFAULT_MAX_MARKER_BYTES`."""

Ranges = tuple[tuple[int, int], ...]
"""Inclusive (first, last) pairs of origin sequences, each pair above the one before."""
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
    catch_up: bool = False
    """From a returning region: answered only after the responder's positions were read and
    its subscriptions' newest progress published (docs/protocol.md §7)."""


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
    consuming: bool = False
    """The writer's own consumers passed data of the subscription since its previous
    update (docs/protocol.md §8)."""
    acked: Mapping[str, Ranges] = field(default_factory=dict)
    """Per origin, the origin sequences above `progress` its applications acked in the
    writer's region (out of order), as ranges of consecutive sequences (§6). Only with
    `progress`."""


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
    # Fields are set on the message in place: building it from keyword arguments costs twice
    # as much (a map argument goes through the pure-Python `MutableMapping.update`).
    msg = pb.Marker(region=marker.region, stream=marker.stream, epoch=marker.epoch)
    body = marker.body
    if isinstance(body, Request):
        request = msg.request
        _set_id(request.id, body.id)
        request.round = body.round
        request.catch_up = body.catch_up
    elif isinstance(body, Response):
        response = msg.response
        _set_id(response.id, body.id)
        response.round = body.round
        response.position = body.position
    elif isinstance(body, Snapshot):
        snapshot = msg.snapshot
        _set_id(snapshot.id, body.id)
        snapshot.local_position = body.local_position
        _set_map(snapshot.positions, body.positions)
        snapshot.started_unix_ms = body.started_ms
        snapshot.completed_unix_ms = body.completed_ms
    else:
        update = msg.update
        update.SetInParent()
        update.subscription = body.subscription
        update.kind = _KIND_TO_PB[body.kind]
        if body.snapshot_id is not None:
            _set_id(update.snapshot_id, body.snapshot_id)
        update.local_position = body.local_position
        _set_map(update.positions, body.positions)
        update.config = body.config
        _set_map(update.progress, body.progress)
        update.progress_position = body.progress_position
        update.consuming = body.consuming
        for origin, ranges in body.acked.items():
            update.acked[origin].bounds.extend(seq for pair in ranges for seq in pair)
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


@dataclass(frozen=True, slots=True)
class StoredMarker:
    """A message on a read stream's marker subjects, as stored: not decoded yet."""

    seq: int
    subject: str
    data: bytes


def read_stored(
    stored: StoredMarker, *, stream: str, regions: Collection[str]
) -> Marker | Rejected:
    """`decode` a stored marker, then `check_writer` it against the subject it was stored under."""
    return check_writer(decode(stored.data, stream=stream, regions=regions), stored.subject)


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
    if body.acked:  # acks above the floor come and go at one position too
        progress += ";" + ",".join(f"{o}={r}" for o, r in sorted(body.acked.items()))
    digest = hashlib.blake2s(progress.encode(), digest_size=8).hexdigest()
    return f"{prefix}.upd.{body.subscription}.{at}.at{body.progress_position}.{digest}"


# Validation reads each protobuf field once into a local and checks it inline; only a field
# found at fault costs a call to the `_bad_*` helpers that name it (the decoder's hot path).


def _validate(msg: pb.Marker, stream: str, regions: Collection[str]) -> Marker:
    region = msg.region
    if not region or region not in regions:
        _bad_region("region", region)
    if msg.stream != stream:
        raise _Invalid(
            RejectReason.WRONG_STREAM, f"stream: {msg.stream[:64]!r}, expected {stream!r}"
        )
    epoch = msg.epoch
    if not 0 < epoch <= MAX_POSITION:
        _bad_position("epoch", epoch)
    kind = msg.WhichOneof("body")
    body: Body
    if kind == "update":
        body = _update(msg.update, regions, region)
    elif kind == "request":
        request = msg.request
        body = Request(
            _snapshot_id("request.id", request, "id", regions, region),
            _round("request.round", request.round),
            request.catch_up,
        )
    elif kind == "response":
        response = msg.response
        sid = _snapshot_id("response.id", response, "id", regions, None)
        if sid.region == region:
            raise _Invalid(
                RejectReason.INVALID_FIELD, f"response.id.region: {region} answers itself"
            )
        round_, position = _round("response.round", response.round), response.position
        if not 0 < position <= MAX_POSITION:
            _bad_position("response.position", position)
        body = Response(sid, round_, position)
    elif kind == "snapshot":
        s = msg.snapshot
        sid = _snapshot_id("snapshot.id", s, "id", regions, region)
        local_position = s.local_position
        if not 0 < local_position <= MAX_POSITION:
            _bad_position("snapshot.local_position", local_position)
        body = Snapshot(
            sid,
            local_position,
            _positions("snapshot.positions", s.positions, regions, region),
            s.started_unix_ms,
            s.completed_unix_ms,
        )
    else:
        raise _Invalid(RejectReason.MISSING_FIELD, "body: no request/response/snapshot/update")
    return Marker(region, stream, epoch, body)


def _update(u: pb.SubscriptionUpdate, regions: Collection[str], writer: str) -> Update:
    subscription = u.subscription
    if not _NAME_RE.fullmatch(subscription):
        raise _Invalid(
            RejectReason.INVALID_FIELD if subscription else RejectReason.MISSING_FIELD,
            f"update.subscription: invalid name {subscription[:64]!r}",
        )
    kind = _KIND_FROM_PB.get(u.kind)
    if kind is None:
        raise _Invalid(RejectReason.INVALID_FIELD, f"update.kind: unknown kind {u.kind}")
    progress: dict[str, int] = {}
    progress_map, progress_position = u.progress, u.progress_position
    if progress_map or progress_position:
        if not 0 < progress_position <= MAX_POSITION:
            _bad_position("update.progress_position", progress_position)
        progress = _origin_seqs("update.progress", progress_map, regions)
    local_position, positions_map = u.local_position, u.positions
    positions: dict[str, int]
    if u.HasField("snapshot_id"):
        snapshot_id: SnapshotId | None = _snapshot_id(
            "update.snapshot_id", u, "snapshot_id", regions, writer
        )
        if not 0 < local_position <= MAX_POSITION:
            _bad_position("update.local_position", local_position)
        positions = _positions("update.positions", positions_map, regions, writer)
    elif progress:
        if local_position or positions_map:
            raise _Invalid(RejectReason.INVALID_FIELD, "update: snapshot fields without its id")
        snapshot_id, local_position, positions = None, 0, {}
    else:
        raise _Invalid(RejectReason.MISSING_FIELD, "update: neither snapshot_id nor progress")
    acked = _acked_ranges("update.acked", u.acked, progress, regions) if u.acked else {}
    return Update(
        subscription,
        kind,
        snapshot_id,
        local_position,
        positions,
        u.config,
        progress,
        progress_position,
        u.consuming,
        acked,
    )


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
    region, epoch, counter = sid.region, sid.epoch, sid.counter
    if not region or region not in regions:
        _bad_region(f"{field}.region", region)
    if writer is not None and region != writer:
        raise _Invalid(RejectReason.INVALID_FIELD, f"{field}.region: {region}, writer is {writer}")
    if not 0 < epoch <= MAX_POSITION:
        _bad_position(f"{field}.epoch", epoch)
    if not 0 < counter <= MAX_POSITION:
        _bad_position(f"{field}.counter", counter)
    return _intern_id(region, epoch, counter)


# One snapshot id is named by many markers (both rounds' requests and responses, the completed
# snapshot, and the update of every subscription that passes it): decoded ids are shared
# rather than built again (SnapshotId is immutable; a hit costs a fifth of building one).
_intern_id = functools.lru_cache(maxsize=4096)(SnapshotId)


def _positions(
    field: str, value: Mapping[str, int], regions: Collection[str], writer: str
) -> dict[str, int]:
    out = _copy_map(value)
    for region, position in out.items():
        if region not in regions:
            _bad_region(f"{field} key", region)
        if region == writer:
            raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: names the writer {writer}")
        if not 0 < position <= MAX_POSITION:
            _bad_position(f"{field}[{region}]", position)
    return out


def _origin_seqs(field: str, value: Mapping[str, int], regions: Collection[str]) -> dict[str, int]:
    """A progress vector: origin sequences of known regions (the writer's own included)."""
    out = _copy_map(value)
    if not out:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: empty")
    for region, seq in out.items():
        if region not in regions:
            _bad_region(f"{field} key", region)
        if not 0 < seq <= MAX_POSITION:
            _bad_position(f"{field}[{region}]", seq)
    return out


def _acked_ranges(
    field: str,
    value: Mapping[str, pb.OriginRanges],
    progress: Mapping[str, int],
    regions: Collection[str],
) -> dict[str, Ranges]:
    """Acked ranges: only with a progress vector, per known origin, (first, last) pairs
    above the vector's sequence there and above each other, `MAX_ACKED_RANGES` in all."""
    if not progress:
        raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: without progress")
    out: dict[str, Ranges] = {}
    total = 0
    for origin in value:
        if origin not in regions:
            _bad_region(f"{field} key", origin)
        bounds = value[origin].bounds
        if not bounds or len(bounds) % 2:
            raise _Invalid(
                RejectReason.INVALID_FIELD, f"{field}[{origin}]: {len(bounds)} bounds, not pairs"
            )
        total += len(bounds) // 2
        if total > MAX_ACKED_RANGES:
            raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: over {MAX_ACKED_RANGES} ranges")
        below = progress.get(origin, 0)
        pairs = []
        for i in range(0, len(bounds), 2):
            first, last = bounds[i], bounds[i + 1]
            if not below < first <= last <= MAX_POSITION:
                raise _Invalid(
                    RejectReason.INVALID_FIELD,
                    f"{field}[{origin}]: range {first}-{last} not above {below}",
                )
            pairs.append((first, last))
            below = last
        out[origin] = tuple(pairs)
    return out


def _copy_map(value: Mapping[str, int]) -> dict[str, int]:
    """A protobuf map as a dict, in its iteration order. `dict(value)` would go through the
    pure-Python `Mapping.keys` of the map's ABC, at twice the cost of indexing by key."""
    return {key: value[key] for key in value} if value else {}


def _round(field: str, value: int) -> int:
    if not 1 <= value <= MAX_ROUND:
        raise _Invalid(RejectReason.INVALID_FIELD, f"{field}: {value} not in 1..{MAX_ROUND}")
    return value


def _bad_region(field: str, value: str) -> NoReturn:
    if not value:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: missing")
    raise _Invalid(RejectReason.UNKNOWN_REGION, f"{field}: unknown region {value[:64]!r}")


def _bad_position(field: str, value: int) -> NoReturn:
    """`value` is not in 1..2**63-1 (protobuf guarantees it is not negative)."""
    if value == 0:
        raise _Invalid(RejectReason.MISSING_FIELD, f"{field}: missing")
    raise _Invalid(RejectReason.OUT_OF_RANGE, f"{field}: {value} exceeds 2**63-1")


def _set_id(target: pb.SnapshotId, sid: SnapshotId) -> None:
    target.region = sid.region
    target.epoch = sid.epoch
    target.counter = sid.counter


def _set_map(target: MutableMapping[str, int], value: Mapping[str, int]) -> None:
    for key, item in value.items():
        target[key] = item
