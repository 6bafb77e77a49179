"""The markers of a read stream: replay what is stored, tail what comes.

- `replay_markers()` yields exactly the markers stored when it is called, for the rebuild at
  startup; `tail_markers()` yields markers from a start sequence on, live. Restart it from
  `last.seq + 1` when it ends (the connection was closed). Both read through the port
  (`JetStreamPort.read`).

A marker is published through the port too (`JetStreamPort.publish`: with a `Nats-Msg-Id`,
checked against the stream it is meant for).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from sidecar.nats.port import JetStreamPort
from sidecar.protocol import StoredMarker


def replay_markers(
    port: JetStreamPort, stream: str, filter_subject: str, start_seq: int = 1
) -> AsyncGenerator[StoredMarker, None]:
    """Yield the markers stored in `stream` (seq >= `start_seq`) at the time of the call."""
    return _markers(port, stream, filter_subject, start_seq, live=False)


def tail_markers(
    port: JetStreamPort,
    stream: str,
    filter_subject: str,
    start_seq: int,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[StoredMarker, None]:
    """Yield markers of `stream` from `start_seq` on, forever (until the connection closes);
    `opened` is called once the server took the read (`JetStreamPort.read`)."""
    return _markers(port, stream, filter_subject, start_seq, live=True, opened=opened)


async def _markers(
    port: JetStreamPort,
    stream: str,
    filter_subject: str,
    start_seq: int,
    *,
    live: bool,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[StoredMarker, None]:
    messages = port.read(stream, filter_subject, start_seq, live=live, opened=opened)
    async with contextlib.aclosing(messages):
        async for msg in messages:
            yield StoredMarker(msg.seq, msg.subject, msg.data)
