"""The one path for direct JetStream API requests: `$JS.API.<op>`, JSON in, JSON out (and
the batched direct get, whose answer is a stream of messages).

Written by hand because nats-py's manager lacks what rsub needs: `CONSUMER.RESET`, paged
consumer listings read together with the stream's state, `STREAM.MSG.GET` from the stream
leader with `next_by_subj`, and stream configuration fields it does not model (sources with
per-source transforms). Everything else goes through nats-py's own JetStream calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nats.aio.client import Client
from nats.js.errors import APIError

from sidecar.nats.port import NO_MESSAGE_FOUND

API_PREFIX = "$JS.API"


async def request(
    nc: Client,
    op: str,
    payload: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
) -> dict[str, Any]:
    """One API call (`op` as `STREAM.INFO.orders`); an error reply raises the matching
    `nats.js.errors.APIError` (its `err_code` tells the JetStream error apart)."""
    body = json.dumps(payload).encode() if payload is not None else b""
    reply = await nc.request(f"{API_PREFIX}.{op}", body, timeout=timeout_s)
    data: dict[str, Any] = json.loads(reply.data)
    if "error" in data:
        APIError.from_error(data["error"])  # raises
    return data


async def msg_get(
    nc: Client,
    stream: str,
    seq: int,
    *,
    next_by_subj: str | None = None,
    timeout_s: float,
) -> dict[str, Any] | None:
    """The stored message at `seq` (with `next_by_subj`: the first at or after `seq` on that
    subject) as the server gives it (`seq`, `subject`, base64 `hdrs` and `data`, `time`), or
    None when there is none. Answered by the stream leader, never a lagging replica."""
    query: dict[str, Any] = {"seq": seq}
    if next_by_subj is not None:
        query["next_by_subj"] = next_by_subj
    try:
        reply = await request(nc, f"STREAM.MSG.GET.{stream}", query, timeout_s=timeout_s)
    except APIError as err:
        if err.err_code == NO_MESSAGE_FOUND:
            return None
        raise
    message: dict[str, Any] = reply["message"]
    return message


async def direct_get_batch(
    nc: Client, stream: str, seq: int, batch: int, *, next_by_subj: str, reply: str
) -> None:
    """Asks for the first `batch` messages on `next_by_subj` at or after `seq` (`DIRECT.GET`
    with `batch`, answered by any one replica, or a mirror with `mirror_direct`). Not a
    request/reply call: the answer is a stream of messages to `reply`, which the caller
    subscribes to first: each message with its headers (`Nats-Sequence`, `Nats-Subject`,
    `Nats-Time-Stamp`), then a `204` status ending the batch; or one `404` status when the
    answering replica holds no such message."""
    query = {"seq": seq, "batch": batch, "next_by_subj": next_by_subj}
    await nc.publish(f"{API_PREFIX}.DIRECT.GET.{stream}", json.dumps(query).encode(), reply=reply)


async def stream_names(
    nc: Client,
    *,
    subject: str | None = None,
    timeout_s: float,
) -> list[str]:
    """The names of the account's streams (with `subject`: those whose subjects overlap it).
    `STREAM.NAMES` answers one page at a time (1024 names on nats-server 2.15, the `limit` of
    its reply): ask again from the next offset until the `total` it reports is reached or a
    page comes back empty."""
    names: list[str] = []
    while True:
        query: dict[str, Any] = {"offset": len(names)}
        if subject is not None:
            query["subject"] = subject
        reply = await request(nc, "STREAM.NAMES", query, timeout_s=timeout_s)
        page = reply.get("streams") or []
        names.extend(str(name) for name in page)
        if not page or len(names) >= int(reply.get("total", 0)):
            return names
