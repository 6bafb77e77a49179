"""The origins of a read stream's data messages (DESIGN §7), read without their payloads.

- `replay_origins()` yields a `DataEntry` per data message stored when it is called, for the
  rebuild at startup; `tail_origins()` yields them from a start sequence on, live. Restart
  it from `last.read_seq + 1` when it ends (the connection was closed). Both read through
  `stream_reader`, over `vs.data_filter()` (so never a marker) and headers only (the server
  sends no payload: a backlog costs its headers on the wire, not its data).
- `data_entry()` reads one message's origin from its `Nats-Stream-Source` header: the region
  whose write stream (the first token, without any `:<hash>` suffix) it was sourced from, and
  its sequence there (the second token). A missing or garbled header, or a stream of no
  region of `vs`, gives `UNKNOWN_ORIGIN`: the message is indexed, no vector ever covers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping

from nats.js import JetStreamContext

from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats import stream_reader
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry

# Headers only: a few hundred bytes per message, so a fetch can ask for many.
_REPLAY_BATCH = 1024


def data_entry(vs: VirtualStream, read_seq: int, headers: Mapping[str, str] | None) -> DataEntry:
    """The origin of the data message at `read_seq` of a read stream of `vs`."""
    source = headers.get(SOURCE_HEADER) if headers else None
    origin = vs.origin_of(source) if source else None
    if origin is None:
        return DataEntry(read_seq, UNKNOWN_ORIGIN, 0)
    region, origin_seq = origin
    return DataEntry(read_seq, region, origin_seq)


async def replay_origins(
    js: JetStreamContext, vs: VirtualStream, region: str, start_seq: int = 1
) -> AsyncGenerator[DataEntry, None]:
    """Yield the origins of the data messages stored in `region`'s read stream (seq >=
    `start_seq`) at the time of the call, in stream order."""
    replay = stream_reader.replay(
        js,
        vs.read_stream(region),
        vs.data_filter(),
        start_seq=start_seq,
        batch=_REPLAY_BATCH,
        headers_only=True,
    )
    async with contextlib.aclosing(replay):
        async for msg in replay:
            yield data_entry(vs, msg.metadata.sequence.stream, msg.headers)


async def tail_origins(
    js: JetStreamContext, vs: VirtualStream, region: str, start_seq: int
) -> AsyncGenerator[DataEntry, None]:
    """Yield the origins of `region`'s read stream's data messages from `start_seq` on, in
    stream order, forever (until the connection closes)."""
    tail = stream_reader.tail(
        js, vs.read_stream(region), vs.data_filter(), start_seq, headers_only=True
    )
    async with contextlib.aclosing(tail):
        async for msg in tail:
            yield data_entry(vs, msg.metadata.sequence.stream, msg.headers)
