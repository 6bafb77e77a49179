"""Zero duplicates after a failover, for consumers that cooperate (DESIGN §7).

After a failover to region `b`, the sidecar of `b` has moved a replicated durable to `P_b`:
every data message at or below `P_b` was consumed in some region. Messages consumed elsewhere
that reached `b`'s read stream later lie above `P_b` and are delivered again. The
subscription's progress vector (`GetSubscriptionResponse.progress`, origin region -> highest
origin sequence consumed) names them exactly: a message whose `Nats-Stream-Source` says
origin `o`, sequence `s` is *covered* when `s <= progress[o]`, and a covered message was
consumed somewhere. `ExactConsumer` acks and drops covered messages and hands over the rest,
so each message is consumed once.

Read the vector ONCE, when the consumer starts in `b` after the failover, and keep it:
- it stays right: covered means consumed somewhere, which never stops being true, so a
  vector kept for as long as the consumer runs never skips a message that needs consuming;
- it is enough: the duplicates are what the lost region consumed before it was lost, and
  the vector `b` holds then is the last word from that region. What `b` consumes afterwards
  is no vector's business: the durable's own acks keep it from being delivered again.

Messages acked above a floor: the vector stops at each region's floor, and a consumer with
parallel workers acks out of order, so one slow message holds the floor while the messages
after it are acked. Those travel too, as ranges of origin sequences per origin
(`GetSubscriptionResponse.acked`, docs/protocol.md §6): `progress_of` returns them with the
vector (`Progress.acked`), and a message in one is covered as well.

Limits: a consumer deliberately reset backwards to replay messages would still skip the
covered ones (start without the vector to replay); messages without a known origin (no
`Nats-Stream-Source`, or one naming a stream that is not a write stream of the virtual
stream) are never skipped.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Iterator, Mapping

import nats.errors
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from sidecar.api.client import SidecarClient
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.protocol import Ranges
from sidecar.protocol.markers import MAX_POSITION
from sidecar.runtime.views import SubscriptionView

# nats-py rejects fetches shorter than about this (its server-side expiry would go negative).
_MIN_FETCH_S = 0.01


class Progress(Mapping[str, int]):
    """A subscription's progress vector (origin region -> highest origin sequence consumed),
    with `acked`: per origin, the ranges of origin sequences acked above a floor elsewhere
    (inclusive pairs, ascending). A `Mapping` of the vector, as before the ranges came."""

    def __init__(self, vector: Mapping[str, int], acked: Mapping[str, Ranges]) -> None:
        self._vector = dict(vector)
        self.acked = dict(acked)

    def __getitem__(self, origin: str) -> int:
        return self._vector[origin]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vector)

    def __len__(self) -> int:
        return len(self._vector)

    def __repr__(self) -> str:
        return f"Progress({self._vector!r}, acked={self.acked!r})"


def covered(origin: tuple[str, int] | None, progress: Mapping[str, int]) -> bool:
    """Whether the message at `origin` (region, origin sequence) was consumed somewhere: at
    or below the vector, or in a range a `Progress` carries.

    `origin` is None for a message of unknown origin, which is never covered.
    """
    if origin is None:
        return False
    region, seq = origin
    if seq <= progress.get(region, 0):
        return True
    ranges = progress.acked.get(region) if isinstance(progress, Progress) else None
    if not ranges:
        return False
    i = bisect_right(ranges, (seq, MAX_POSITION)) - 1
    return i >= 0 and seq <= ranges[i][1]


def _progress(view: SubscriptionView) -> Progress:
    return Progress(view.progress, view.acked)


async def progress_of(
    sidecar: str | SidecarClient,
    stream: str,
    subscription: str,
    *,
    token: str | None = None,
    timeout_s: float = 10.0,
) -> Progress:
    """The progress vector of `subscription` on virtual stream `stream`, from a sidecar,
    with the ranges acked above the floors elsewhere (`Progress`).

    `sidecar` is an address (`host:port`, plain gRPC; `token` and `timeout_s` apply) or a
    `sidecar.api.client.SidecarClient` (for TLS). Errors are `SidecarError`s, with the call's
    status as `code` (NOT_FOUND for an unknown subscription).
    """
    if isinstance(sidecar, SidecarClient):
        return _progress(await asyncio.to_thread(sidecar.subscription, stream, subscription))
    with SidecarClient(sidecar, token=token, timeout_s=timeout_s) as client:
        return _progress(await asyncio.to_thread(client.subscription, stream, subscription))


class ExactConsumer:
    """A pull subscription on a replicated durable that skips (and acks) covered messages.

    `progress` is the subscription's vector read once at start (see the module docstring);
    `vs` maps write streams to regions. `skipped` counts the messages acked and dropped.
    """

    def __init__(
        self,
        sub: JetStreamContext.PullSubscription,
        progress: Mapping[str, int],
        vs: VirtualStream,
    ) -> None:
        self._sub = sub
        self._progress = progress if isinstance(progress, Progress) else dict(progress)
        self._vs = vs
        self.skipped = 0

    def covers(self, msg: Msg) -> bool:
        """Whether `msg` was consumed somewhere according to the vector."""
        source = (msg.headers or {}).get(SOURCE_HEADER)
        return covered(self._vs.origin_of(source) if source else None, self._progress)

    async def fetch(
        self,
        batch: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109 (PullSubscription.fetch's; pulls expire in the server)
    ) -> list[Msg]:
        """Up to `batch` uncovered messages, like `PullSubscription.fetch`; ack them yourself.

        Covered messages fetched meanwhile are acked and dropped. Fetches again while all
        were covered; raises `nats.errors.TimeoutError` when no uncovered message came
        within `timeout` seconds, also where nats-py raised a bare `asyncio.TimeoutError`
        (then its `__cause__`).
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left < _MIN_FETCH_S:
                raise nats.errors.TimeoutError
            try:
                fetched = await self._sub.fetch(batch, left)
            except TimeoutError as err:
                if isinstance(err, nats.errors.TimeoutError):
                    raise
                # nats-py (2.16, `_fetch_n`) raises a bare `asyncio.TimeoutError` when a
                # pull's answer is handled after the fetch's deadline (a busy event loop).
                raise nats.errors.TimeoutError from err
            kept = []
            for msg in fetched:
                if self.covers(msg):
                    await msg.ack()
                    self.skipped += 1
                else:
                    kept.append(msg)
            if kept:
                return kept
