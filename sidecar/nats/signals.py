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

An ack that settles a message (`+ACK`, `+NXT`, `+TERM`, or an empty body) is also told with
its consumer and stream sequence (`acked`): an application consumed that durable here. Only
applications ack (the sidecar moves durables with resets), so it is a sign of consumption that
a floor moved by the stream's limits, a purge or a reset can never give
(docs/protocol.md §8).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.nats.port import JetStreamPort, Listener


def subjects(read_stream: str) -> tuple[str, str]:
    """The subjects followed for `read_stream` (the sidecar's subscribe permissions)."""
    return f"$JS.ACK.{read_stream}.>", f"$JS.EVENT.ADVISORY.CONSUMER.*.{read_stream}.*"


_SETTLED = (b"+ACK", b"+NXT", b"+TERM")
_ACK_TOKENS = 9
"""`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`:
the reply subject nats-server gives each delivery (the form `subjects` follows)."""


def settled(subject: str, payload: bytes) -> tuple[str, int] | None:
    """The consumer and stream sequence an ack on `subject` settles, or None for anything
    else (a nak, work in progress, an advisory, a subject of another form)."""
    tokens = subject.split(".")
    if len(tokens) != _ACK_TOKENS or tokens[1] != "ACK":
        return None
    if payload and not payload.startswith(_SETTLED):
        return None
    try:
        return tokens[3], int(tokens[5])
    except ValueError:
        return None


async def follow_consumers(
    port: JetStreamPort,
    read_stream: str,
    moved: Callable[[], None],
    acked: Callable[[str, int], None],
) -> list[Listener]:
    """Call `moved` whenever an ack or a consumer advisory of `read_stream` arrives, and
    `acked` with the consumer and stream sequence of every ack that settles a message; the
    listeners (kept across reconnects by the port)."""

    def heard(subject: str, payload: bytes) -> None:
        done = settled(subject, payload)
        if done is not None:
            acked(*done)
        moved()

    return [await port.listen(subject, heard) for subject in subjects(read_stream)]
