"""Counting the requests a piece of the sidecar makes, seen by a client of the test's own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg


class Requests:
    """The requests seen on one subject so far."""

    def __init__(self, observer: Client) -> None:
        self._observer = observer
        self.seen: list[Msg] = []

    async def count(self) -> int:
        """How many, once everything sent before the call has reached the observer."""
        await self._observer.flush()
        return len(self.seen)


@contextlib.asynccontextmanager
async def requests_on(url: str, subject: str) -> AsyncIterator[Requests]:
    """Watch `subject` on the server at `url` (e.g. `$JS.API.STREAM.MSG.GET.<stream>`)."""
    observer = await nats.connect(url)
    requests = Requests(observer)

    async def seen(msg: Msg) -> None:
        requests.seen.append(msg)

    try:
        await observer.subscribe(subject, cb=seen)
        await observer.flush()
        yield requests
    finally:
        await observer.close()
