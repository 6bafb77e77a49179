"""The decisions of a leadership lease (DESIGN §5), pure: no I/O, no clock, no asyncio.

`LeaseRules` holds what one replica knows of one lease key and decides, from what a round
read or wrote and the time it is given (seconds on the replica's own monotonic clock), what
the round does next and what the replica may believe. `sidecar.nats.lease.Lease` carries the
decisions out against a KV bucket and logs them; it decides nothing itself.

The rules:
- a round of a holder renews (`Renew`: compare-and-set over the revision it wrote last); a
  round of anyone else reads the key (`Look`);
- a holder leads until `VALID_FRACTION * ttl` after it *sent* its last successful renewal
  (or acquisition): a follower counts the ttl from its first sight of that revision, which
  is no earlier than the send, so the holder stops acting before anyone may take over;
- a holder whose validity ran out is lost ("expired") at the start of its next round, before
  any request: so a round that cannot reach the bucket still reports it;
- a renewal refused (another revision is there) is lost ("taken_over");
- a free key is created (`Acquire(last=None)`); a key whose revision stayed the same for a
  whole ttl of this replica's observation is taken over (`Acquire(last=revision)`);
- the epoch is the revision written by the acquisition: a bucket's revisions only grow, so
  every later holder has a higher one.

    rules = LeaseRules(ttl_s=6.0)
    lost, todo = rules.begin(now)            # Lost or None; Renew or Look
    take = rules.observed(now, revision, value, acquire=True)   # after a Look: Acquire/None
    rules.acquired(sent, revision)            # or rules.renewed(sent, revision)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

VALID_FRACTION = 0.8


@dataclass(frozen=True)
class LeaseState:
    leader: bool
    # This replica's epoch while it leads, else 0.
    epoch: int
    # The holder last observed in the bucket (None when the lease is free or unknown).
    holder: str | None
    # The epoch of that holder (this replica's own while it leads; 0 when unknown).
    leader_epoch: int = 0


@dataclass(frozen=True)
class Renew:
    """Write this holder's value with `epoch` over revision `last` (compare-and-set)."""

    epoch: int
    last: int


@dataclass(frozen=True)
class Look:
    """Read the key (then `observed` or `absent`)."""


@dataclass(frozen=True)
class Acquire:
    """Write this holder's value: create the key (`last` None, it is free) or take it over
    with compare-and-set on `last` (its holder's revision, expired)."""

    last: int | None


@dataclass(frozen=True)
class Lost:
    """This replica no longer leads, from `epoch`: its validity ran out, or another holder
    took the key over."""

    epoch: int
    reason: Literal["expired", "taken_over"]


class LeaseRules:
    """One replica's view of one lease key, and what it decides from it."""

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease.ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        # While held: the epoch, the revision written last and until when it leads.
        self.epoch = 0
        self.revision = 0
        self.valid_until = 0.0
        # The holder as last read (its name, epoch, other fields), and since when (on this
        # replica's clock) its revision has been the one seen.
        self.observed_holder: str | None = None
        self.observed_epoch = 0
        self.observed_extra: Mapping[str, Any] = {}
        self.observed_revision = 0
        self.observed_since = 0.0

    def leads(self, now: float) -> bool:
        return self.epoch > 0 and now < self.valid_until

    def state(self, now: float) -> LeaseState:
        if self.leads(now):
            return LeaseState(True, self.epoch, self.observed_holder, self.epoch)
        return LeaseState(False, 0, self.observed_holder, self.observed_epoch)

    def begin(self, now: float) -> tuple[Lost | None, Renew | Look]:
        """A round starts: a leadership whose validity ran out is lost first (whatever the
        round then reaches); then a holder renews and anyone else looks."""
        lost = self._lose("expired") if self.epoch > 0 and not self.leads(now) else None
        if self.epoch > 0:
            return lost, Renew(self.epoch, self.revision)
        return lost, Look()

    def renewed(self, sent: float, revision: int) -> None:
        """The renewal sent at `sent` was written as `revision`."""
        self.revision = revision
        self.valid_until = sent + VALID_FRACTION * self.ttl_s

    def refused(self) -> Lost:
        """The renewal found another revision: someone took the key over."""
        return self._lose("taken_over")

    def absent(self, acquire: bool) -> Acquire | None:
        """The key is free: take it when `acquire`."""
        self._forget_holder()
        return Acquire(None) if acquire else None

    def observed(
        self, now: float, revision: int, value: bytes | None, acquire: bool
    ) -> Acquire | None:
        """The key read at `now` has `revision` and `value`: take it over when `acquire` and
        that revision has not changed for a whole ttl of this replica's observation."""
        self.observed_holder, epoch, self.observed_extra = holder_of(value)
        # A holder writes its epoch with each renewal; before the first, it is the revision
        # at which it took the lease, which is this entry's.
        self.observed_epoch = epoch or revision
        if revision != self.observed_revision:
            self.observed_revision, self.observed_since = revision, now
            return None
        if acquire and now - self.observed_since >= self.ttl_s:
            return Acquire(revision)
        return None

    def acquired(self, sent: float, revision: int, holder: str) -> None:
        """The acquisition sent at `sent` was written as `revision`: this replica leads with
        that epoch."""
        self.epoch = self.revision = revision
        self.valid_until = sent + VALID_FRACTION * self.ttl_s
        self.observed_holder = holder

    def release(self) -> int | None:
        """Give the lease up: the revision to delete it at (None when not held). The
        replica no longer leads, whether the delete succeeds or not."""
        if self.epoch == 0:
            return None
        revision, self.epoch = self.revision, 0
        self._forget_holder()
        return revision

    def _lose(self, reason: Literal["expired", "taken_over"]) -> Lost:
        lost = Lost(self.epoch, reason)
        self.epoch = 0
        self._forget_holder()
        # The next observation starts the ttl count again.
        self.observed_revision = 0
        return lost

    def _forget_holder(self) -> None:
        self.observed_holder, self.observed_epoch, self.observed_extra = None, 0, {}


def holder_of(value: bytes | None) -> tuple[str | None, int, Mapping[str, Any]]:
    """(holder, epoch, the other fields) of a lease value; None, 0 and {} for what cannot
    be read."""
    try:
        data = json.loads(value or b"null")
        holder, epoch = data.pop("holder"), data.pop("epoch", None)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, 0, {}
    valid_epoch = isinstance(epoch, int) and not isinstance(epoch, bool) and epoch > 0
    return (holder if isinstance(holder, str) else None), (epoch if valid_epoch else 0), data
