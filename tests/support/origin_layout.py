"""A virtual stream's streams made by hand on one JetStream server, for reading data origins.

Write streams of `west` and `east` (the virtual stream's regions) and of `north` (no region of
it), and `west`'s read stream, which sources all three and also takes messages published to
it directly (`<name>.local.>`). Used by the origin log's tests (tests/nats) and the runtime's
count of unknown origins (tests/runtime).
"""

from __future__ import annotations

import uuid

from nats.js import JetStreamContext, api

from rsub_dev.sidecars import wait_until
from sidecar.naming import VirtualStream

PAYLOAD = b"x" * 1000
WRITERS = ("west", "east", "north")


async def lay_out(js: JetStreamContext) -> VirtualStream:
    """The streams of a virtual stream of a fresh name, regions `west` and `east`."""
    vs = VirtualStream(f"o{uuid.uuid4().hex[:8]}", ("west", "east"))
    for writer in WRITERS:
        await js.add_stream(
            name=f"{vs.name}-write-{writer}",
            subjects=[f"{vs.name}.{writer}.>", f"_rsub.{vs.name}.marker.{writer}"],
            max_consumers=10,
        )
    await js.add_stream(
        name=vs.read_stream("west"),
        subjects=[f"{vs.name}.local.>", vs.snapshot_subject("west")],
        sources=[api.StreamSource(name=f"{vs.name}-write-{w}") for w in WRITERS],
        max_consumers=10,
    )
    return vs


async def write(js: JetStreamContext, vs: VirtualStream, writer: str, count: int) -> None:
    for _ in range(count):
        await js.publish(f"{vs.name}.{writer}.item", PAYLOAD)


async def stored_count(js: JetStreamContext, vs: VirtualStream, count: int) -> None:
    """Wait until `west`'s read stream holds `count` messages (sourcing is asynchronous)."""

    async def holds() -> bool:
        return (await js.stream_info(vs.read_stream("west"))).state.messages >= count

    await wait_until(holds, f"{count} messages in {vs.read_stream('west')}", 20)


async def fill(js: JetStreamContext, vs: VirtualStream) -> None:
    """3 messages of west, a marker of west, 2 of east, 1 of north, 1 published locally."""
    await write(js, vs, "west", 3)
    await js.publish(vs.marker_subject("west"), b"marker")
    await write(js, vs, "east", 2)
    await write(js, vs, "north", 1)
    await write(js, vs, "local", 1)
    await stored_count(js, vs, 8)
