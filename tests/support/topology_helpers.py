"""Helpers for the topology integration tests: read whole streams, wait on conditions."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import ServiceUnavailableError

from sidecar.naming import SOURCE_HEADER, VirtualStream


@dataclass(frozen=True)
class Stored:
    seq: int
    subject: str
    data: bytes
    origin: tuple[str, int] | None
    msg_id: str | None


async def stream_info(nc: Client, stream: str) -> dict[str, Any]:
    reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
    info: dict[str, Any] = json.loads(reply.data)
    assert "error" not in info, info
    return info


async def read_all(nc: Client, vs: VirtualStream, stream: str, filter_subject: str) -> list[Stored]:
    """Every message of `stream` matching `filter_subject`, in stream order."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        filter_subject,
        stream=stream,
        config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30
        ),
    )
    out: list[Stored] = []
    try:
        while (pending := (await sub.consumer_info()).num_pending or 0) > 0:
            try:
                msgs = await sub.fetch(batch=min(pending, 500), timeout=5)
            except ServiceUnavailableError:
                # 503: a consumer just created in another region is not serving yet.
                await asyncio.sleep(0.2)
                continue
            for m in msgs:
                headers = m.headers or {}
                source = headers.get(SOURCE_HEADER)
                out.append(
                    Stored(
                        seq=m.metadata.sequence.stream,
                        subject=m.subject,
                        data=m.data,
                        origin=vs.origin_of(source) if source else None,
                        msg_id=headers.get("Nats-Msg-Id"),
                    )
                )
    finally:
        await sub.unsubscribe()
    return out


async def message_count(nc: Client, stream: str) -> int:
    return int((await stream_info(nc, stream))["state"]["messages"])


async def publish_many(nc: Client, subjects: list[str], start: int, count: int) -> None:
    """Publish payloads `start..start+count-1` round-robin over `subjects`, acked."""
    js = nc.jetstream()
    for chunk in range(start, start + count, 200):
        end = min(chunk + 200, start + count)
        await asyncio.gather(
            *(js.publish(subjects[i % len(subjects)], str(i).encode()) for i in range(chunk, end))
        )


async def check_converged(
    ncs: dict[str, Client], vs: VirtualStream, expected: dict[str, int]
) -> None:
    """Every read stream holds exactly the data of every write stream, each origin in the
    write stream's order, no marker among the data, every marker among the markers."""
    writes: dict[str, list[Stored]] = {
        r: await read_all(ncs[r], vs, vs.write_stream(r), ">") for r in vs.regions
    }
    for r, msgs in writes.items():
        assert len(msgs) == expected[r]
    for region in vs.regions:
        nc = ncs[region]
        data = await read_all(nc, vs, vs.read_stream(region), vs.data_filter())
        per_origin: dict[str, list[Stored]] = defaultdict(list)
        for m in data:
            assert m.origin is not None, m
            assert not m.subject.startswith("_rsub."), m
            per_origin[m.origin[0]].append(m)
        for origin in vs.regions:
            want = [w for w in writes[origin] if not w.subject.startswith("_rsub.")]
            got = per_origin[origin]
            assert [g.origin for g in got] == [(origin, w.seq) for w in want]
            assert [g.data for g in got] == [w.data for w in want]
            assert [g.subject for g in got] == [
                w.subject.replace(f"{vs.name}.{origin}.", f"{vs.name}.", 1) for w in want
            ]
        markers = await read_all(nc, vs, vs.read_stream(region), vs.marker_filter())
        want_markers = sorted(
            w.msg_id or "" for r in vs.regions for w in writes[r] if w.subject.startswith("_rsub.")
        )
        assert sorted(m.msg_id or "" for m in markers) == want_markers
