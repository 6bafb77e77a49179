"""Deliberately broken protocol machines (`StreamMachine` variants), each a bug planted in
the core: tests/dev/test_shell_sim.py runs them in the real runtime and must catch each
within its budget of seeds."""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.protocol import (
    CreateConsumer,
    CreateCursor,
    Marker,
    Output,
    StreamMachine,
    SubscriptionAction,
    SubscriptionInfo,
)
from sidecar.protocol.machine import _Attempt, _Sub
from sidecar.protocol.markers import MAX_POSITION


class ReportsLastSequence(StreamMachine):
    def _response_position(self, read_seq: int) -> int:
        return max(read_seq, self._last_seq)


class SingleRound(StreamMachine):
    def _rounds(self) -> int:
        return 1


class IgnoresOwnRequest(StreamMachine):
    def _own_request_seen(self, attempt: _Attempt, round_: int, read_seq: int) -> None:
        attempt.own_seen_round = max(attempt.own_seen_round, round_)


class PartialOnTimeout(StreamMachine):
    def _timed_out(self, attempt: _Attempt) -> list[Output]:
        return self._complete(attempt)


class VectorFromHighestSeen(StreamMachine):
    def _vector_at(self, mark_delete: int) -> dict[str, int]:
        return self._index.vector_at(self._index.indexed_through)


class PositionFromOwnOrigin(StreamMachine):
    """Places a subscription by the local writer's origin alone (the others never hold it)."""

    def _position_for(self, progress: Mapping[str, int], after: int) -> int | None:
        own = self.config.region
        vector = dict.fromkeys(self.config.regions, MAX_POSITION) | {own: progress.get(own, 0)}
        return self._index.position_for(vector, after)


class TrimsAtIndexEnd(StreamMachine):
    """Trims regardless of subscriptions. The guards keep it safe (no vector is read below
    the trim point, no position is placed across it), so only liveness suffers."""

    def _trim_index(self) -> None:
        self._index.trim(self._index.indexed_through)


class TrimsUnrecorded(StreamMachine):
    """Drops every run indexed so far without recording it, so the guards see nothing:
    vectors read below it name trimmed messages, positions skip them."""

    def _trim_index(self) -> None:
        index = self._index
        for runs in index._runs.values():
            if n := runs.runs_through(index.indexed_through):
                runs.drop(n)


class ReportsMoveWhenAsked(StreamMachine):
    """The position reported moves when a move is asked for, not once it is done (seeds 7
    and 524 of the chaos campaign: `GetSubscription` answered a target the durable lacked)."""

    def _asked(self, sub: _Sub, action: SubscriptionAction) -> None:
        super()._asked(sub, action)
        sub.mark_delete = action.ack_floor


class CreatedWhenAsked(StreamMachine):
    """A creation counts as done when asked for (seed 18): one that failed is never asked for
    again, and the next listing without the subscription forgets it."""

    def _asked(self, sub: _Sub, action: SubscriptionAction) -> None:
        super()._asked(sub, action)
        if isinstance(action, CreateConsumer | CreateCursor):
            sub.exists = True


class IgnoresDeletion(StreamMachine):
    """Keeps a subscription its user deleted: the next update moves a durable that is not
    there (the runtime finds nothing to move) instead of creating it again."""

    def subscriptions_changed(self, subscriptions: Mapping[str, SubscriptionInfo]) -> list[Output]:
        gone = {n: s.info for n, s in self._subs.items() if s.exists and n not in subscriptions}
        return super().subscriptions_changed(gone | dict(subscriptions))


class AcceptsStaleEpochs(StreamMachine):
    """No fencing: acts on a marker whatever epoch its region wrote with since (a frozen
    leader's, woken after a takeover)."""

    def marker_seen(self, read_seq: int, marker: Marker) -> list[Output]:
        seen = self._max_epoch.get(marker.region, 0)
        self._max_epoch[marker.region] = min(seen, marker.epoch)
        return super().marker_seen(read_seq, marker)


class KeepsLeading(StreamMachine):
    """Does not step down when its region writes with a newer epoch."""

    def became_follower(self) -> list[Output]:
        return []


class ForgetsTrimPoint(StreamMachine):
    """Trims where it should but forgets where: a vector read after its user reset the
    consumer below that point names trimmed messages above `M`."""

    def _trim_index(self) -> None:
        super()._trim_index()
        self._index.trimmed_through = 0
