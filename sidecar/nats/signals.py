"""Signals that the positions of a read stream's durables may have moved, so that they are
read only then (`sidecar.runtime.intervals.IntervalLoop`).

Per read stream, two core NATS subscriptions:
- `$JS.ACK.<stream>.>`: the acks clients send for the stream's consumers (ack, nak, term,
  progress: an ack floor moves only after one of them, for an explicit or all ack policy);
- `$JS.EVENT.ADVISORY.CONSUMER.*.<stream>.*`: consumers created, deleted, paused, or given
  up on a message after its last delivery.

Best effort (core NATS: a signal missed during a reconnect is gone). Nothing relies on one
for safety; the reader's periodic sweep catches what was missed (and what sends none: a
consumer without acks, messages removed by the stream's limits).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.nats.port import JetStreamPort, Listener


def subjects(read_stream: str) -> tuple[str, str]:
    """The subjects followed for `read_stream` (the sidecar's subscribe permissions)."""
    return f"$JS.ACK.{read_stream}.>", f"$JS.EVENT.ADVISORY.CONSUMER.*.{read_stream}.*"


async def follow_consumers(
    port: JetStreamPort, read_stream: str, moved: Callable[[], None]
) -> list[Listener]:
    """Call `moved` whenever an ack or a consumer advisory of `read_stream` arrives; the
    listeners (kept across reconnects by the port)."""
    return [await port.listen(subject, moved) for subject in subjects(read_stream)]
