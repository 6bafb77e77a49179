"""The origins of a read stream's data messages (DESIGN §7), read without their payloads.

- `replay_origins()` yields a `DataEntry` per data message stored when it is called, for the
  rebuild at startup; `tail_origins()` yields them from a start sequence on, live. Restart
  it from `last.read_seq + 1` when it ends (the connection was closed). Both read through
  the port (`JetStreamPort.read`), over `vs.data_filter()` (so never a marker) and headers
  only (the server sends no payload: a backlog costs its headers on the wire, not its
  data).
- `data_entry()` reads one message's origin from its `Nats-Stream-Source` header: the region
  whose write stream (the first token, without any `:<hash>` suffix) it was sourced from, and
  its sequence there (the second token). A missing or garbled header, or a stream of no
  region of `vs`, gives `UNKNOWN_ORIGIN`: the message is indexed, no vector ever covers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping

from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.port import JetStreamPort
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry


def data_entry(vs: VirtualStream, read_seq: int, headers: Mapping[str, str] | None) -> DataEntry:
    """The origin of the data message at `read_seq` of a read stream of `vs`."""
    source = headers.get(SOURCE_HEADER) if headers else None
    origin = vs.origin_of(source) if source else None
    if origin is None:
        return DataEntry(read_seq, UNKNOWN_ORIGIN, 0)
    region, origin_seq = origin
    return DataEntry(read_seq, region, origin_seq)


def replay_origins(
    port: JetStreamPort, vs: VirtualStream, region: str, start_seq: int = 1
) -> AsyncGenerator[DataEntry, None]:
    """Yield the origins of the data messages stored in `region`'s read stream (seq >=
    `start_seq`) at the time of the call, in stream order."""
    return _origins(port, vs, region, start_seq, live=False)


def tail_origins(
    port: JetStreamPort,
    vs: VirtualStream,
    region: str,
    start_seq: int,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[DataEntry, None]:
    """Yield the origins of `region`'s read stream's data messages from `start_seq` on, in
    stream order, forever (until the connection closes); `opened` is called once the server
    took the read (`JetStreamPort.read`)."""
    return _origins(port, vs, region, start_seq, live=True, opened=opened)


async def _origins(
    port: JetStreamPort,
    vs: VirtualStream,
    region: str,
    start_seq: int,
    *,
    live: bool,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[DataEntry, None]:
    messages = port.read(
        vs.read_stream(region),
        vs.data_filter(),
        start_seq,
        live=live,
        headers_only=True,
        opened=opened,
    )
    async with contextlib.aclosing(messages):
        async for msg in messages:
            yield data_entry(vs, msg.seq, msg.headers)
