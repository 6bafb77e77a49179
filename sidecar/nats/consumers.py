"""Replicated subscriptions on a read stream: read their positions, move them, create them.

- `PositionReader.read()` lists the stream's consumers with one `CONSUMER.LIST` request per
  256 consumers and returns every durable, flagged `replicated` when its metadata has
  `rsub.replicate: "true"`, with its mark-delete position `M` (DESIGN §2): a consumer with
  nothing pending and nothing awaiting ack has consumed everything, so its `M` is the
  stream's last sequence read *before* the listing; a replicated one with something pending
  stands at its ack floor extended over the messages after it that it does not deliver
  (markers, subjects outside its filters; `sidecar.nats.effective`), so the update that
  its own progress echoes back from another region finds it there already. Replicated
  consumers with a deliver policy other than `all` / `by_start_sequence` are skipped and
  logged once.
  A durable listed without its state (`has_state`), or named `missing` in the listing, is
  returned as unknown, with no position. The replicated durables whose filter lets the
  stream's markers through (`lets_through`: no filter, or one like `>` that overlaps the
  marker filter) are named in `receiving_markers`: their clients receive the markers.
  The stream's first sequence, below which a floor moves by itself (limits, purges), is
  not part of it: it must be read after every position taken from the read
  (`stream_first_seq`, `LocalSubscriptions.read`).
- `move_forward()` resets a durable so its ack floor becomes `p` (forward only, clamped to
  the stream's end) with `$JS.API.CONSUMER.RESET` (server 2.14+), holding the consumer
  paused (`CONSUMER.PAUSE`) between its last check and the reset; never when only messages
  it does not deliver (markers, other subjects) lie between it and `p`. Its outcome carries
  the stream's first sequence read after the floor it reports (`MoveOutcome.first_seq`).
- `set_replicated()` sets or clears the `rsub.replicate` metadata of a durable.
- `create_consumer()` creates a missing durable from another region's configuration,
  starting at `p + 1`; it never replaces an existing one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from sidecar.nats.effective import EffectivePositions, Floor, filters_of, first_delivered
from sidecar.nats.port import JetStreamPort

log = structlog.get_logger(__name__)

REPLICATE_KEY = "rsub.replicate"
SUPPORTED_DELIVER_POLICIES = frozenset({"all", "by_start_sequence"})
_CONSUMER_ALREADY_EXISTS = 10148
# Metadata keys the server manages itself (`_nats.ver`, ...): never copied to another region.
_SERVER_METADATA_PREFIX = "_nats."
_DEFAULT_TIMEOUT_S = 5.0
# How long a move may hold its consumer paused: the few requests of one move, with room for
# clock skew between rsub and the server (the pause ends by itself if rsub dies meanwhile).
_MOVE_PAUSE_S = 10.0
# A pause answers in milliseconds when the meta leader is there; without one, give up soon.
_PAUSE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ConsumerPosition:
    name: str
    replicated: bool
    mark_delete: int
    ack_floor: int
    num_pending: int
    num_ack_pending: int
    # The consumer's configuration as the server reports it (JSON form).
    config: Mapping[str, Any]
    # How long its pause has left (ms) when the server reports it paused, else None.
    paused_ms: int | None = None


@dataclass(frozen=True)
class SkippedConsumer:
    name: str
    reason: str


@dataclass(frozen=True)
class Positions:
    stream: str
    # The stream's last sequence, read before the consumers were listed.
    last_seq: int
    consumers: tuple[ConsumerPosition, ...]
    skipped: tuple[SkippedConsumer, ...]
    # Consumers the listing named without their state: their position is not known now.
    unknown: frozenset[str] = frozenset()
    # Replicated durables whose filter lets the markers through, with their filter subjects
    # (empty: none, every message).
    receiving_markers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Per stream the read stream sources: ms since it last heard from it, None when not once
    # since the stream's server started (`sources[].active` of -1).
    sources: Mapping[str, int | None] = field(default_factory=dict)
    # When the stream's current leader was elected (Unix ms; None when not reported).
    leader_since_ms: int | None = None
    # When the stream was created (Unix ms; None when not reported).
    created_ms: int | None = None


def leader_since_ms(info: Mapping[str, Any]) -> int | None:
    """From `STREAM.INFO`: when the stream's leader was elected (`cluster.leader_since`,
    RFC 3339 with nanoseconds), in Unix ms; None when the server does not say (a stream of
    one replica)."""
    return _unix_ms((info.get("cluster") or {}).get("leader_since"))


def created_ms(info: Mapping[str, Any]) -> int | None:
    """From `STREAM.INFO`: when the stream was created (`created`), in Unix ms; None when
    the server does not say."""
    return _unix_ms(info.get("created"))


def _unix_ms(since: object) -> int | None:
    """An RFC 3339 time with nanoseconds, in Unix ms (None when it is not one)."""
    if not isinstance(since, str):
        return None
    # Python before 3.12 reads at most six digits of a fraction.
    text = re.sub(r"(\.\d{6})\d+", r"\1", since).replace("Z", "+00:00")
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


def sources_heard(info: Mapping[str, Any]) -> dict[str, int | None]:
    """From `STREAM.INFO`: per source stream, ms since the stream last heard from it (the
    server reports nanoseconds, -1 when it has not heard from it since it started)."""
    heard: dict[str, int | None] = {}
    for source in info.get("sources") or []:
        active = int(source.get("active", -1))
        heard[str(source.get("name", ""))] = None if active < 0 else active // 1_000_000
    return heard


async def stream_last_seq(
    port: JetStreamPort, stream: str, *, timeout_s: float = _DEFAULT_TIMEOUT_S
) -> int:
    info = await port.stream_info(stream, timeout_s=timeout_s)
    return int(info["state"]["last_seq"])


async def stream_first_seq(
    port: JetStreamPort, stream: str, *, timeout_s: float = _DEFAULT_TIMEOUT_S
) -> int:
    """The stream's first sequence (`STREAM.INFO`; 0: not reported)."""
    info = await port.stream_info(stream, timeout_s=timeout_s)
    return int(info["state"].get("first_seq", 0))


def is_replicated(config: Mapping[str, Any]) -> bool:
    metadata = config.get("metadata") or {}
    return bool(metadata.get(REPLICATE_KEY) == "true")


def has_state(info: Mapping[str, Any]) -> bool:
    """Whether a consumer's `CONSUMER.INFO`-shaped JSON carries its state.

    A clustered server fills in a consumer it could not ask, with its configuration, an
    empty state (ack floor 0, nothing pending) and a cluster that names no leader: in a
    `CONSUMER.LIST`, a consumer whose servers are all offline (nats-server
    `jsClusteredConsumerListRequest`; an R1 durable whose server was shut down). Read as a
    position, "nothing pending" would say it consumed the whole stream. A consumer's leader
    names itself; a server outside a cluster reports no cluster and is its own leader.
    """
    cluster = info.get("cluster")
    return cluster is None or bool(cluster.get("leader"))


def lets_through(filters: tuple[str, ...], subject_filter: str) -> bool:
    """Whether a reader delivering `filters` (empty: every message) delivers a message that
    `subject_filter` matches: whether some subject matches both, wildcards included."""
    return not filters or any(_overlap(f, subject_filter) for f in filters)


def _overlap(a: str, b: str) -> bool:
    """Whether some subject matches both filters (`*` one token, `>` one or more at the end)."""
    left, right = a.split("."), b.split(".")
    for x, y in zip(left, right, strict=False):
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(left) == len(right)


def _name(info: Mapping[str, Any]) -> str:
    """A listed consumer's name (a filled-in one carries it in its configuration only)."""
    config = info.get("config") or {}
    return str(info.get("name") or config.get("durable_name") or config.get("name") or "")


def position_of(info: Mapping[str, Any], last_seq: int) -> ConsumerPosition:
    """The position of one consumer from its `CONSUMER.INFO`-shaped JSON: `last_seq` when it
    has nothing pending and nothing awaiting ack, else its ack floor (which
    `PositionReader.read` extends to the effective position)."""
    ack_floor = int((info.get("ack_floor") or {}).get("stream_seq", 0))
    pending = int(info.get("num_pending", 0))
    ack_pending = int(info.get("num_ack_pending", 0))
    mark_delete = ack_floor
    if pending == 0 and ack_pending == 0:
        mark_delete = max(ack_floor, last_seq)
    return ConsumerPosition(
        name=str(info["name"]),
        replicated=is_replicated(info.get("config") or {}),
        mark_delete=mark_delete,
        ack_floor=ack_floor,
        num_pending=pending,
        num_ack_pending=ack_pending,
        config=info.get("config") or {},
        paused_ms=int(info.get("pause_remaining", 0)) // 1_000_000 if info.get("paused") else None,
    )


class PositionReader:
    """Reads the positions of one read stream's replicated subscriptions, again and again."""

    def __init__(
        self, stream: str, *, marker_filter: str, timeout_s: float = _DEFAULT_TIMEOUT_S
    ) -> None:
        """`marker_filter`: the subjects of the stream's markers (`VirtualStream.marker_filter`)."""
        self._stream = stream
        self._marker_filter = marker_filter
        self._timeout = timeout_s
        self._reported: set[SkippedConsumer] = set()
        self._effective = EffectivePositions(stream, timeout_s=timeout_s)

    async def read(self, port: JetStreamPort) -> Positions:
        stream_info = await port.stream_info(self._stream, timeout_s=self._timeout)
        last_seq = int(stream_info["state"]["last_seq"])
        consumers: list[ConsumerPosition] = []
        skipped: list[SkippedConsumer] = []
        infos, missing = await self._list(port)
        unknown = set(missing)
        for info in infos:
            config = info.get("config") or {}
            if not config.get("durable_name"):
                continue  # ephemeral consumers are nobody's subscription
            if not has_state(info):
                unknown.add(_name(info))
                continue
            policy = str(config.get("deliver_policy", "all"))
            if is_replicated(config) and policy not in SUPPORTED_DELIVER_POLICIES:
                skip = SkippedConsumer(
                    str(info["name"]),
                    f"deliver policy {policy!r} cannot be replicated "
                    f"(use one of {sorted(SUPPORTED_DELIVER_POLICIES)})",
                )
                skipped.append(skip)
                if skip not in self._reported:
                    self._reported.add(skip)
                    log.warning(
                        "subscription_skipped",
                        stream=self._stream,
                        subscription=skip.name,
                        reason=skip.reason,
                    )
                continue
            consumers.append(position_of(info, last_seq))
        # `last_seq` (and `first_seq`) were read before the listing, and so before the scan,
        # as they must be.
        effective = await self._effective.read(
            port,
            {
                c.name: Floor(c.ack_floor, filters_of(c.config))
                for c in consumers
                if c.replicated and c.mark_delete < last_seq  # at its ack floor: data pending
            },
            last_seq,
            int(stream_info["state"].get("first_seq", 0)),
        )
        consumers = [
            replace(c, mark_delete=effective.get(c.name, c.mark_delete)) for c in consumers
        ]
        receiving = {
            c.name: filters
            for c in consumers
            if c.replicated and lets_through(filters := filters_of(c.config), self._marker_filter)
        }
        return Positions(
            self._stream,
            last_seq,
            tuple(consumers),
            tuple(skipped),
            frozenset(unknown),
            receiving,
            sources_heard(stream_info),
            leader_since_ms(stream_info),
            created_ms(stream_info),
        )

    async def _list(self, port: JetStreamPort) -> tuple[list[dict[str, Any]], list[str]]:
        """Every consumer listed, and the names of those the listing went without (`missing`:
        no leader of theirs answered in time; the offline ones are also listed, stateless)."""
        infos: list[dict[str, Any]] = []
        missing: list[str] = []
        offset = 0
        while True:
            page = await port.consumer_list(self._stream, offset, timeout_s=self._timeout)
            batch = page.get("consumers") or []
            gone = [str(name) for name in page.get("missing") or []]
            infos.extend(batch)
            missing.extend(gone)
            # A page's place in the listing counts the consumers it went without too.
            on_page = {_name(info) for info in batch} | set(gone)
            offset += len(on_page)
            if not on_page or offset >= int(page.get("total", 0)):
                return infos, missing


@dataclass(frozen=True)
class MoveOutcome:
    moved: bool
    ack_floor_before: int
    ack_floor_after: int
    first_seq: int
    """The stream's first sequence, read after the consumer's state `ack_floor_after` comes
    from: a floor at or below `first_seq - 1` may stand there only because the stream
    removed what lay before it (a purge, limits), which moves every floor. A reset's reply
    puts the floor at the reset's start less one, whatever the stream removed (nats-server
    2.15.1): after a reset it is the one read before."""


async def _clamped_start(
    port: JetStreamPort, stream: str, position: int, timeout_s: float
) -> tuple[int, int]:
    """`position + 1`, but never past the stream's end (`last_seq + 1`); with the stream's
    first sequence, read with it."""
    state = (await port.stream_info(stream, timeout_s=timeout_s))["state"]
    return min(position + 1, int(state["last_seq"]) + 1), int(state.get("first_seq", 0))


class NotLeading(RuntimeError):
    """The replica moving a durable no longer leads its stream: the reset is not sent."""


async def move_forward(
    port: JetStreamPort,
    stream: str,
    durable: str,
    position: int,
    *,
    leading: Callable[[], bool] = lambda: True,
    timeout_s: float = _DEFAULT_TIMEOUT_S,
) -> MoveOutcome:
    """Make `durable`'s ack floor at least `position` (clamped); never moves it back.

    A consumer that already delivered up to `position` is left alone: its own acks get it
    there, and a reset would rewind its delivery (redelivering, acks in flight unanswered).
    So is one with none of its data up to `position`, only markers or other subjects: a reset
    would skip nothing it delivers, and a reset is not free for a consumer in use. The update
    a region's own consumption echoes back from another region lands there (on the markers
    after its last message); in chaos seed 508 such a reset of the consumer the application
    was using left every later ack unanswered (docs/reliability.md, Findings).
    Raises `nats.js.errors.NotFoundError` when the durable does not exist.
    """
    info = await port.consumer_info(stream, durable, timeout_s=timeout_s)
    # Read after the consumer: a removal that moved the floor read shows in `first_seq`
    # (`make soak` seed 1067974121501: a purge right before the move).
    start, first_seq = await _clamped_start(port, stream, position, timeout_s)
    if not await _worth_a_reset(port, stream, durable, info, start, timeout_s):
        return MoveOutcome(False, _ack_floor(info), _ack_floor(info), first_seq)
    # Safety: the check above and the reset are several requests; a client fetching between
    # them would get messages past `start - 1` that the reset then rewinds (delivered again,
    # their acks unanswered), or the last of its messages before `start`, leaving only
    # markers to pass (simulation seed 866299904591). Paused, the consumer delivers nothing,
    # so the same check, made again under the pause, still holds when the reset lands. A
    # consumer its user paused delivers nothing either, and is left paused. If rsub dies
    # inside the window the pause lapses by itself.
    # A pause is a configuration change, which needs the JetStream meta leader; a region
    # that lost it (most regions down) can still reset. Then the move goes on unpaused: the
    # race can only rewind a consumer (duplicates), never move it past unconsumed data.
    paused_here = not info.get("paused", False) and await _pause(port, stream, durable)
    try:
        info = await port.consumer_info(stream, durable, timeout_s=timeout_s)
        before = _ack_floor(info)
        if not await _worth_a_reset(port, stream, durable, info, start, timeout_s):
            # Its floor as read again: a purge since the first look may have moved it (the
            # shell simulation's seed 21), which the first sequence read after tells.
            return MoveOutcome(
                False, before, before, await stream_first_seq(port, stream, timeout_s=timeout_s)
            )
        # Fencing: a move is several requests, and a replica stalled between them (a GC
        # pause, a frozen VM) may wake deposed while the new leader has moved the durable
        # further: its reset would rewind that move (simulation seeds 18 and 813830425096).
        # Its lease is checked again right before the one request that changes the durable.
        if not leading():
            raise NotLeading(f"{stream}/{durable}: no longer the leader, reset not sent")
        reply = await port.consumer_reset(stream, durable, start, timeout_s=timeout_s)
    finally:
        if paused_here:
            await _resume(port, stream, durable)
    after = int((reply.get("ack_floor") or {}).get("stream_seq", start - 1))
    log.info(
        "subscription_moved",
        stream=stream,
        subscription=durable,
        ack_floor_before=before,
        ack_floor_after=after,
        requested=position,
    )
    return MoveOutcome(True, before, after, first_seq)


async def _worth_a_reset(
    port: JetStreamPort,
    stream: str,
    durable: str,
    info: Mapping[str, Any],
    start: int,
    timeout_s: float,
) -> bool:
    """Whether the consumer (as `info` shows it) has neither acked nor delivered up to
    `start - 1` and one of its messages lies before `start`. The messages between it and
    `start` stay as they are (a stream only grows at its end, past `start - 1`)."""
    if not _behind(info, start):
        return False
    filters = filters_of(info.get("config") or {})
    first = await first_delivered(port, stream, _reached(info) + 1, filters, timeout_s=timeout_s)
    if first is None or first >= start:
        log.debug(
            "subscription_move_skipped",
            stream=stream,
            subscription=durable,
            requested=start - 1,
            reason="none of its messages before the position",
        )
        return False
    return True


def _ack_floor(info: Mapping[str, Any]) -> int:
    return int((info.get("ack_floor") or {}).get("stream_seq", 0))


def _reached(info: Mapping[str, Any]) -> int:
    """The stream sequence up to which the consumer has acked or delivered."""
    delivered = int((info.get("delivered") or {}).get("stream_seq", 0))
    return max(_ack_floor(info), delivered)


def _behind(info: Mapping[str, Any], start: int) -> bool:
    """Whether the consumer has neither acked nor delivered up to `start - 1`."""
    return start - 1 > _reached(info)


async def _pause(port: JetStreamPort, stream: str, durable: str) -> bool:
    """Pause `durable` for at most `_MOVE_PAUSE_S` (`CONSUMER.PAUSE`, server 2.11+); False
    when the server could not (no meta leader: the request fails or times out)."""
    try:
        await port.consumer_pause(stream, durable, _MOVE_PAUSE_S, timeout_s=_PAUSE_TIMEOUT_S)
    except (APIError, TimeoutError, NatsError) as err:
        log.warning(
            "subscription_move_unpaused", stream=stream, subscription=durable, error=repr(err)
        )
        return False
    return True


async def _resume(port: JetStreamPort, stream: str, durable: str) -> None:
    """End the move's pause; if that fails the pause lapses by itself (`_MOVE_PAUSE_S`)."""
    try:
        await port.consumer_pause(stream, durable, None, timeout_s=_PAUSE_TIMEOUT_S)
    except (APIError, TimeoutError, NatsError) as err:
        log.warning(
            "subscription_resume_failed", stream=stream, subscription=durable, error=repr(err)
        )


def replica_config(origin: Mapping[str, Any], durable: str, start_seq: int) -> dict[str, Any]:
    """The configuration for `durable` in this region: the origin's, starting at `start_seq`."""
    config = {k: v for k, v in origin.items() if k not in ("opt_start_time", "name")}
    config["durable_name"] = durable
    config["deliver_policy"] = "by_start_sequence"
    config["opt_start_seq"] = start_seq
    metadata = {
        k: v
        for k, v in (origin.get("metadata") or {}).items()
        if not k.startswith(_SERVER_METADATA_PREFIX)
    }
    metadata[REPLICATE_KEY] = "true"
    config["metadata"] = metadata
    return config


async def create_consumer(
    port: JetStreamPort,
    stream: str,
    durable: str,
    origin_config: Mapping[str, Any],
    position: int,
    *,
    timeout_s: float = _DEFAULT_TIMEOUT_S,
) -> int | None:
    """Create `durable` on `stream` starting at `position + 1` (clamped) if it is absent;
    returns its ack floor then (the start - 1).

    Returns None, changing nothing, when a consumer of that name already exists.
    """
    start, _ = await _clamped_start(port, stream, position, timeout_s)
    config = replica_config(origin_config, durable, start)
    try:
        await port.consumer_create(stream, durable, config, "create", timeout_s=timeout_s)
    except APIError as err:
        if err.err_code == _CONSUMER_ALREADY_EXISTS:
            return None
        raise
    log.info("subscription_created", stream=stream, subscription=durable, start_seq=start)
    return start - 1


async def set_replicated(
    port: JetStreamPort,
    stream: str,
    durable: str,
    replicated: bool,
    *,
    timeout_s: float = _DEFAULT_TIMEOUT_S,
) -> ConsumerPosition:
    """Set (or clear) `rsub.replicate` on `durable`; returns its state after the change.

    Raises `NotFoundError` for a missing durable and `ValueError` when the durable cannot be
    replicated (its deliver policy).
    """
    info = await port.consumer_info(stream, durable, timeout_s=timeout_s)
    config = dict(info["config"])
    policy = str(config.get("deliver_policy", "all"))
    if replicated and policy not in SUPPORTED_DELIVER_POLICIES:
        raise ValueError(
            f"subscription {durable!r}: deliver policy {policy!r} cannot be replicated"
        )
    metadata = dict(config.get("metadata") or {})
    if replicated:
        metadata[REPLICATE_KEY] = "true"
    else:
        metadata.pop(REPLICATE_KEY, None)
    config["metadata"] = metadata
    updated = await port.consumer_create(stream, durable, config, "update", timeout_s=timeout_s)
    last_seq = await stream_last_seq(port, stream, timeout_s=timeout_s)
    return position_of(updated, last_seq)
