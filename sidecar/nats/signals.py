"""Signals that the positions of a read stream's durables may have moved, so that they are
read only then (`sidecar.runtime.driver.IntervalLoop`).

Per read stream, two core NATS subscriptions:
- `$JS.ACK.<stream>.>`: the acks clients send for the stream's consumers (ack, nak, term,
  progress: an ack floor moves only after one of them, for an explicit or all ack policy).
  One ack is enough to know that a read is due, and a consumer in use sends thousands a
  second (each one, delivered, cost a sidecar about 36 us of CPU: bench/bench_ack_signals.py),
  so this one is a one-shot: the server drops the interest after one message
  (`UNSUB <sid> 1`) and `ConsumerSignals.arm` subscribes again before the next positions
  read. An ack sent between the signal and that read is seen by the read itself; one sent
  after the new subscription signals again. So a stream in use costs one subscription per
  positions read, whatever its ack rate;
- `$JS.EVENT.ADVISORY.CONSUMER.*.<stream>.*`: consumers created, deleted, paused, or given
  up on a message after its last delivery (few: followed all along).

Best effort (core NATS: a signal missed during a reconnect is gone). Nothing relies on one
for safety; the reader's periodic sweep catches what was missed (and what sends none: a
consumer without acks, messages removed by the stream's limits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError


def subjects(read_stream: str) -> tuple[str, str]:
    """The subjects followed for `read_stream` (the sidecar's subscribe permissions)."""
    return f"$JS.ACK.{read_stream}.>", f"$JS.EVENT.ADVISORY.CONSUMER.*.{read_stream}.*"


class ConsumerSignals:
    """Calls `moved` when an ack (once per `arm`) or a consumer advisory of the stream arrives."""

    def __init__(self, nc: Client, read_stream: str, moved: Callable[[], None]) -> None:
        self._nc = nc
        self._acks, self._advisories = subjects(read_stream)
        self._moved = moved
        self._advisory: Subscription | None = None
        self._ack: Subscription | None = None
        self._armed = False
        self._token = object()

    async def start(self) -> None:
        """Follow the advisories, and arm the ack signal (nats-py renews both after a
        reconnect, the ack one with what is left of its one message)."""

        async def advised(_: Msg) -> None:
            self._moved()

        self._advisory = await self._nc.subscribe(self._advisories, cb=advised)
        await self.arm()

    async def arm(self) -> None:
        """Wait for the next ack, unless already waiting: call before reading the positions."""
        if self._armed:
            return
        self._armed = True
        token = self._token = object()  # a late ack of an earlier subscription is not this one

        async def acked(_: Msg) -> None:
            if self._token is token:
                self._armed = False
                self._moved()

        try:
            self._ack = await self._nc.subscribe(self._acks, cb=acked)
            await self._ack.unsubscribe(limit=1)
        except NatsError:
            self._armed = False
            raise

    async def close(self) -> None:
        self._armed = True  # never again
        for sub in (self._advisory, self._ack):
            if sub is not None:
                with contextlib.suppress(NatsError):
                    await sub.unsubscribe()
