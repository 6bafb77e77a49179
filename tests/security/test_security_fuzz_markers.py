"""Markers are untrusted input: anyone allowed to publish on a write stream's marker subject
can put bytes in every region's read stream. Fuzz the decoder and the state machine with them.

Properties (a fixed, small hypothesis budget so the suite stays fast and deterministic):
- `decode` never raises: random bytes, oversized input, structurally valid protobufs with
  absurd values, and mutations of those all give a `Marker` or a `Rejected`.
- whatever `decode` accepts satisfies the marker invariants, checked here independently.
- a rejected marker changes no subscription of a `StreamMachine` (it only yields a
  `MarkerRejected` event), and the machine still applies a genuine update afterwards.
- an accepted marker only ever moves or creates a subscription forward, to the position an
  update from another region named for this region.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar._gen.rsub.v1 import markers_pb2 as pb
from sidecar.protocol import (
    CreateConsumer,
    CreateCursor,
    MachineConfig,
    Marker,
    MarkerRejected,
    MoveConsumer,
    MoveCursor,
    Rejected,
    RejectReason,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    decode,
    encode,
)

REGIONS = ("west", "east", "north")
HERE = "west"
STREAM = "orders"
MAX_POSITION = 2**63 - 1
SMALL_LIMIT = 512
FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MOVES = (MoveConsumer, CreateConsumer, MoveCursor, CreateCursor)

# ---- strategies -------------------------------------------------------------------------

names = st.one_of(
    st.sampled_from([*REGIONS, STREAM, "billing", "south", "", "west ", "WEST", "we.st"]),
    st.text(max_size=12),
    st.text(min_size=250, max_size=300),
)
u64 = st.one_of(
    st.integers(0, 2**64 - 1), st.sampled_from([0, 1, MAX_POSITION, MAX_POSITION + 1, 2**64 - 1])
)
u32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2, 3]))
i64 = st.integers(-(2**63), 2**63 - 1)
positions = st.dictionaries(names, u64, max_size=5)


class _Values:
    """Draws each field's value: usually a sane one, sometimes (1 in 8) an absurd one."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, sane: st.SearchStrategy[Any], absurd: st.SearchStrategy[Any]) -> Any:
        return self.draw(absurd if self.draw(st.integers(0, 7)) == 0 else sane)

    def region(self, sane: tuple[str, ...] = REGIONS) -> str:
        return str(self.pick(st.sampled_from(sane), names))

    def position(self) -> int:
        return int(self.pick(st.integers(1, MAX_POSITION), u64))

    def id(self, parent: Any, field: str, region: str) -> None:
        if self.draw(st.integers(0, 15)) == 0:
            return  # absent sub-message
        sid = getattr(parent, field)
        sid.region = self.region((region,))
        sid.epoch, sid.counter = self.position(), self.position()

    def positions(self, writer: str, *, name_here: bool) -> dict[str, int]:
        others = [r for r in REGIONS if r != writer] or list(REGIONS)
        sane = st.dictionaries(st.sampled_from(others), st.integers(1, MAX_POSITION))
        if name_here and writer != HERE:
            sane = st.fixed_dictionaries(
                {HERE: st.integers(1, 40)},
                optional={r: st.integers(1, 40) for r in others if r != HERE},
            )
        return dict(self.pick(sane, positions))


BODIES = ("request", "response", "snapshot", "update", "none")


@st.composite
def marker_protos(
    draw: st.DrawFn,
    bodies: tuple[str, ...] = BODIES,
    writers: tuple[str, ...] = REGIONS,
    name_here: bool = False,
) -> bytes:
    """A structurally valid `Marker` protobuf, most fields sane and some absurd.

    `name_here`: updates usually name this region (so an accepted one moves something).
    """
    v = _Values(draw)
    region = v.region(writers)
    msg = pb.Marker(region=region, stream=v.pick(st.just(STREAM), names), epoch=v.position())
    body = draw(st.sampled_from(bodies))
    rounds = st.integers(1, 2)
    if body == "request":
        msg.request.round = v.pick(rounds, u32)
        v.id(msg.request, "id", region)
    elif body == "response":
        msg.response.round = v.pick(rounds, u32)
        msg.response.position = v.position()
        v.id(msg.response, "id", draw(st.sampled_from([r for r in REGIONS if r != region])))
    elif body == "snapshot":
        msg.snapshot.local_position = v.position()
        msg.snapshot.positions.update(v.positions(region, name_here=False))
        msg.snapshot.started_unix_ms = draw(i64)
        msg.snapshot.completed_unix_ms = draw(i64)
        v.id(msg.snapshot, "id", region)
    elif body == "update":
        msg.update.subscription = v.pick(st.sampled_from(["billing", "audit", "new-1"]), names)
        # An open enum: unknown numbers parse too.
        kind = v.pick(st.sampled_from([1, 2]), st.sampled_from([0, 3, 2**31 - 1, -1]))
        msg.update.kind = cast("pb.SubscriptionKind", kind)
        msg.update.local_position = v.position()
        msg.update.positions.update(v.positions(region, name_here=name_here))
        msg.update.config = draw(st.binary(max_size=64))
        v.id(msg.update, "snapshot_id", region)
    return msg.SerializeToString()


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """`base` bytes after a few random edits (flip, cut, insert, splice another marker)."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "splice", "repeat"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "splice":
            # Concatenated protobufs merge: the later oneof body wins, maps add up.
            data[at:at] = draw(marker_protos())
        elif op == "repeat":
            data += data[at:]
    return bytes(data)


# Updates from another region naming this one: the inputs that could move a subscription.
updates_here = marker_protos(bodies=("update",), writers=("east", "north"), name_here=True)
any_input = st.one_of(
    st.binary(max_size=256),
    marker_protos(),
    updates_here,
    mutated(updates_here),
    mutated(marker_protos()),
    mutated(st.just(b"")),  # edits from nothing
)

# Hand-picked hostile inputs: deep nesting, a huge length prefix, a field of all 0xff.
HOSTILE = [
    b"\x0b" * 20_000,  # 20k nested start-group tags
    b"\x0a\xff\xff\xff\xff\x0f",  # length-delimited field claiming 4 GiB
    b"\x18" + b"\xff" * 10 + b"\x01",  # varint longer than 10 bytes
    b"\x12\x02\xc3\x28",  # invalid UTF-8 in a string field
    b"\xff" * 64,
]


# ---- an independent check of what `decode` accepts ------------------------------------


def _check_id(sid: SnapshotId) -> None:
    assert sid.region in REGIONS
    assert 1 <= sid.epoch <= MAX_POSITION and 1 <= sid.counter <= MAX_POSITION


def _check_positions(values: Any, writer: str) -> None:
    for region, position in values.items():
        assert region in REGIONS and region != writer
        assert 1 <= position <= MAX_POSITION


def check_accepted(marker: Marker) -> None:
    assert marker.region in REGIONS and marker.stream == STREAM
    assert 1 <= marker.epoch <= MAX_POSITION
    body = marker.body
    if isinstance(body, Request):
        _check_id(body.id)
        assert body.id.region == marker.region and body.round in (1, 2)
    elif isinstance(body, Response):
        _check_id(body.id)
        assert body.id.region != marker.region and body.round in (1, 2)
        assert 1 <= body.position <= MAX_POSITION
    elif isinstance(body, Snapshot):
        _check_id(body.id)
        assert body.id.region == marker.region
        assert 1 <= body.local_position <= MAX_POSITION
        _check_positions(body.positions, marker.region)
    else:
        assert isinstance(body, Update)
        if body.snapshot_id is None:
            assert body.progress and not body.positions and body.local_position == 0
        else:
            _check_id(body.snapshot_id)
            assert body.snapshot_id.region == marker.region
        for origin, seq in body.progress.items():
            assert origin in REGIONS and 1 <= seq <= MAX_POSITION
        assert (body.progress_position > 0) == bool(body.progress)
        assert 1 <= len(body.subscription) <= 255 and body.subscription.isascii()
        assert body.subscription[0].isalnum() and "." not in body.subscription
        assert body.kind in (SubscriptionKind.DURABLE, SubscriptionKind.EXTERNAL)
        _check_positions(body.positions, marker.region)
    # What was accepted survives a round trip unchanged.
    assert decode(encode(marker), stream=STREAM, regions=REGIONS) == marker


# ---- a leader machine with subscriptions, and a genuine update as positive control -----

BILLING_AT = 10
GENUINE_TARGET = 15


def leader_machine() -> StreamMachine:
    machine = StreamMachine(MachineConfig(region=HERE, stream=STREAM, regions=REGIONS))
    machine.tick(1_000)
    machine.subscriptions_changed(
        {"billing": SubscriptionInfo(), "audit": SubscriptionInfo(SubscriptionKind.EXTERNAL)}
    )
    machine.became_leader(7)
    machine.positions_read({"billing": BILLING_AT, "audit": 3}, 20)
    return machine


def genuine_update() -> Marker:
    sid = SnapshotId("east", 4, 99)
    update = Update(
        "billing", SubscriptionKind.DURABLE, sid, 30, {HERE: GENUINE_TARGET, "north": 8}, b""
    )
    return Marker("east", STREAM, 4, update)


def positions_of(machine: StreamMachine) -> dict[str, tuple[int | None, bool, tuple[Any, ...]]]:
    return {v.name: (v.mark_delete, v.exists, v.applied) for v in machine.subscriptions()}


def test_genuine_update_moves_the_consumer() -> None:
    """Positive control: the machine used below does move a consumer on a real update."""
    out = leader_machine().marker_seen(21, genuine_update())
    assert MoveConsumer("billing", GENUINE_TARGET) in out


# ---- properties -------------------------------------------------------------------------


@FUZZ
@given(data=any_input)
@example(data=b"")
def test_decode_never_raises_and_accepts_only_valid_markers(data: bytes) -> None:
    result = decode(data, stream=STREAM, regions=REGIONS)
    assert isinstance(result, Marker | Rejected)
    if isinstance(result, Marker):
        check_accepted(result)
    else:
        assert isinstance(result.reason, RejectReason) and result.detail
        assert len(result.detail) < 400  # bounded: never echoes a whole payload


@settings(FUZZ, max_examples=40)
@given(data=st.binary(min_size=SMALL_LIMIT + 1, max_size=2 * SMALL_LIMIT))
def test_oversized_input_is_rejected_before_parsing(data: bytes) -> None:
    result = decode(data, stream=STREAM, regions=REGIONS, max_bytes=SMALL_LIMIT)
    assert result == Rejected(
        RejectReason.OVERSIZE, f"marker is {len(data)} bytes, limit {SMALL_LIMIT}"
    )


def test_hostile_inputs_are_rejected() -> None:
    for data in HOSTILE:
        result = decode(data, stream=STREAM, regions=REGIONS)
        assert isinstance(result, Rejected), data[:16]


@FUZZ
@given(data=any_input, seq=st.integers(21, 10_000))
def test_rejected_marker_moves_nothing(data: bytes, seq: int) -> None:
    result = decode(data, stream=STREAM, regions=REGIONS)
    machine = leader_machine()
    before = positions_of(machine)
    if isinstance(result, Rejected):
        out = machine.marker_rejected(seq, result)
        assert out == [MarkerRejected(seq, result)]
    else:
        out = machine.marker_seen(seq, result)
        for action in out:
            if isinstance(action, MOVES):
                # Only an update from another region naming this one moves anything.
                body = result.body
                assert isinstance(body, Update) and result.region != HERE
                assert action.subscription == body.subscription
                assert action.ack_floor == body.positions[HERE]
                previous = before.get(action.subscription)
                if previous is not None and previous[1] and previous[0] is not None:
                    assert action.ack_floor > previous[0], "moved backwards"
        if not any(isinstance(a, MOVES) for a in out):
            assert positions_of(machine) == before or isinstance(result.body, Update)
        return
    assert positions_of(machine) == before
    # The machine still works: the genuine update is applied as on a fresh machine.
    assert MoveConsumer("billing", GENUINE_TARGET) in machine.marker_seen(seq + 1, genuine_update())


@FUZZ
@given(data=mutated(st.just(encode(genuine_update()))), seq=st.integers(21, 10_000))
def test_tampered_genuine_update_moves_only_as_named(data: bytes, seq: int) -> None:
    """Edits of a real update: either rejected (nothing moves) or decoded and checked."""
    result = decode(data, stream=STREAM, regions=REGIONS)
    machine = leader_machine()
    before = positions_of(machine)
    if isinstance(result, Rejected):
        assert machine.marker_rejected(seq, result) == [MarkerRejected(seq, result)]
        assert positions_of(machine) == before
        return
    check_accepted(result)
    for action in machine.marker_seen(seq, result):
        if isinstance(action, MOVES):
            assert isinstance(result.body, Update)
            assert action.ack_floor == result.body.positions[HERE]
            if action.subscription == "billing" and isinstance(action, MoveConsumer):
                assert action.ack_floor > BILLING_AT
