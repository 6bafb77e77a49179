"""`Effects`: each protocol action of one virtual stream, carried out on NATS.

The machine decides; this module only does what an action says, in the order the machine
returned the actions, and only while this replica leads with the machine's epoch. A failed
action is logged (`action_failed`) and the driver goes on with the next output; for a move
or creation the driver tells the machine the outcome (`Effects.carry_out` returns where the
subscription stands after it, `ReadBack`, or None), so that it reports a position only once
the durable or cursor has it, and asks again for one that failed or was dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from sidecar.naming import VirtualStream
from sidecar.nats import consumers
from sidecar.protocol import (
    Action,
    CreateConsumer,
    CreateCursor,
    HoldConsumer,
    Marker,
    MoveConsumer,
    MoveCursor,
    PublishLocal,
    PublishReplicated,
    ReleaseConsumer,
    StreamMachine,
    encode,
    marker_msg_id,
)
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.positions import LocalSubscriptions

log = structlog.get_logger(__name__)

_FAILED = (TimeoutError, NatsError, OSError, RuntimeError)
_PAUSE_S = 2.0  # `CONSUMER.PAUSE`'s request timeout


@dataclass(frozen=True, slots=True)
class ReadBack:
    """Where a subscription stands after a move or creation, as read back."""

    mark_delete: int
    """The ack floor, or the cursor's position."""
    first_seq: int = 0
    """The read stream's first sequence, read after `mark_delete` was (0: not read): a
    floor only a purge or the stream's limits moved stands at most one below it
    (`StreamMachine.action_done`)."""


class Effects:
    def __init__(
        self, vs: VirtualStream, handles: RegionHandles, subscriptions: LocalSubscriptions
    ) -> None:
        self._vs = vs
        self._handles = handles
        self._subscriptions = subscriptions

    def leads_with(self, machine: StreamMachine) -> bool:
        """Whether the stream's shard lease says this replica leads it with the epoch the
        machine acts under.

        The machine learns of a lost or renewed lease through its job queue, after the lease
        changed: until then its actions carry an epoch this replica no longer holds. Dropping
        them keeps a deposed leader from publishing or moving anything; the new leader's
        machine derives the same actions again under its own epoch.
        """
        return self._handles.leads_with(self._vs.name, machine.epoch)

    async def carry_out(self, machine: StreamMachine, action: Action) -> ReadBack | None:
        """Carry `action` out. For a move or creation done: the subscription's mark-delete
        after it, as read back (the ack floor, or the cursor's position), with the read
        stream's first sequence when the move read it after. None after a
        publish, and for an action dropped (not the leader with the machine's epoch) or failed:
        logged, never raised, so the driver can report every outcome to the machine."""
        name = self._vs.name
        if not self.leads_with(machine):
            log.info("action_dropped_not_leader", stream=name, action=repr(action))
            return None
        try:
            return await self._act(action, lambda: self.leads_with(machine))
        except _FAILED as err:
            log.warning("action_failed", stream=name, action=repr(action), error=repr(err))
        except Exception:  # a bug here must not leave the machine waiting for an outcome
            log.exception("action_crashed", stream=name, action=repr(action))
        return None

    async def _act(self, action: Action, leading: Callable[[], bool]) -> ReadBack | None:
        vs, port, region = self._vs, self._handles.port, self._handles.region
        read_stream = vs.read_stream(region)
        match action:
            case PublishReplicated(marker=marker):
                # To the write stream, which every read stream sources.
                await self._publish(vs.write_stream(region), vs.marker_subject(region), marker)
                return None
            case PublishLocal(marker=marker):
                # A completed snapshot is a fact about this region's read stream only: it
                # goes there directly and is never replicated.
                await self._publish(read_stream, vs.snapshot_subject(region), marker)
                return None
            case MoveConsumer(subscription=sub, ack_floor=ack_floor):
                # Forward only: `move_forward` re-reads the consumer and resets it only when
                # it has not delivered up to `ack_floor` yet; it never rewinds a consumer.
                # Left alone, its ack floor (read then) is what it stands at.
                try:
                    moved = await consumers.move_forward(
                        port, read_stream, sub, ack_floor, leading=leading
                    )
                except NotFoundError:
                    log.warning("subscription_gone", stream=vs.name, subscription=sub)
                    return None
                return ReadBack(moved.ack_floor_after, moved.first_seq)
            case CreateConsumer(subscription=sub, config=raw, ack_floor=ack_floor):
                origin = _consumer_config(raw)
                if origin is None:
                    log.error("update_config_unreadable", stream=vs.name, subscription=sub)
                    return None
                # A consumer of that name that exists already (made by hand, or by an
                # earlier leader) is only ever moved forward, never re-created.
                created = await consumers.create_consumer(port, read_stream, sub, origin, ack_floor)
                if created is not None:
                    return ReadBack(created)
                moved = await consumers.move_forward(
                    port, read_stream, sub, ack_floor, leading=leading
                )
                return ReadBack(moved.ack_floor_after, moved.first_seq)
            case (
                MoveCursor(subscription=sub, ack_floor=ack_floor)
                | CreateCursor(subscription=sub, ack_floor=ack_floor)
            ):
                # `advance` creates an absent cursor and never moves one backwards.
                value = await self._handles.cursors().advance(vs.name, sub, ack_floor)
                return ReadBack(self._subscriptions.cursor_stored(sub, value))
            case HoldConsumer(subscription=sub, hold_ms=hold_ms):
                # The failback guard (docs/protocol.md §7). The pause lapses by itself after
                # `hold_ms`: a replica that dies holding it stops nothing for longer. A move
                # meanwhile leaves it paused (`move_forward` resumes only its own pause).
                await port.consumer_pause(read_stream, sub, hold_ms / 1000, timeout_s=_PAUSE_S)
                log.info("durable_held", stream=vs.name, subscription=sub, hold_ms=hold_ms)
                return None
            case ReleaseConsumer(subscription=sub):
                await port.consumer_pause(read_stream, sub, None, timeout_s=_PAUSE_S)
                return None
            case _:
                assert_never(action)

    async def _publish(self, stream: str, subject: str, marker: Marker) -> None:
        # The id is derived from the content: a retried publish is stored once.
        await self._handles.port.publish(stream, subject, encode(marker), marker_msg_id(marker))


def _consumer_config(raw: bytes) -> dict[str, Any] | None:
    """The origin's consumer configuration carried by an update (JSON), or None."""
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    return config if isinstance(config, dict) else None
