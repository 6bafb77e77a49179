"""In-process TCP proxy for one direction of a gateway link (region A dials region B).

Region A's servers reach region B's gateway ports only through a `LinkProxy`, so the link
can be cut (existing connections closed, new ones refused with a reset), restored, and
delayed (every forwarded chunk is held back by a fixed time, byte order kept) without root.

Gateways gossip the URLs they are configured with, so region A also learns the proxy that
region C uses to reach B. Each proxy therefore reads the dialer's first protocol line
(`CONNECT {"gateway": "<region>", ...}`) and drops connections from any other region:
the only way from A to B stays the A->B proxy.

Without an origin (`origin=None`) it forwards any TCP connection, each new one to the next
upstream in turn: a round-robin load balancer, e.g. one address in front of the gRPC ports
of a region's sidecar replicas, as a Kubernetes Service is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Callable, Sequence

import structlog

from rsub_dev.ports import HOST

log = structlog.get_logger(__name__)

_CHUNK_BYTES = 64 * 1024
_QUEUED_CHUNKS = 256
_CONNECT_TIMEOUT_S = 2.0


class LinkProxy:
    """Listens on 127.0.0.1 and forwards connections from gateway `origin` (any dialer when
    None) to the next reachable upstream, in turn."""

    def __init__(self, name: str, origin: str | None, upstreams: Sequence[tuple[str, int]]) -> None:
        if not upstreams:
            raise ValueError(f"proxy {name}: at least one upstream is needed")
        self.name = name
        self.origin = origin
        self._upstreams = list(upstreams)
        self._next_upstream = 0
        self.forwarded = dict.fromkeys(self._upstreams, 0)
        """Connections forwarded to each upstream so far."""
        self._server: asyncio.Server | None = None
        self._cut = False
        self._delay_s = 0.0
        self._connections: set[_Connection] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"proxy {self.name} is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def delay_s(self) -> float:
        return self._delay_s

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        log.debug("proxy_started", proxy=self.name, port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self._drop_all()

    async def cut(self) -> None:
        """Close every open connection and refuse new ones until `restore`."""
        self._cut = True
        await self._drop_all()
        log.info("link_cut", proxy=self.name)

    def restore(self) -> None:
        self._cut = False
        log.info("link_restored", proxy=self.name)

    @property
    def gate(self) -> Callable[[bytes], bool] | None:
        """What the dialer's first line must pass (None: no check, any protocol)."""
        return self.accepts if self.origin is not None else None

    def accepts(self, first_line: bytes) -> bool:
        """True if the dialer's first line is a gateway CONNECT from `origin`."""
        verb, _, payload = first_line.partition(b" ")
        if verb != b"CONNECT":
            return False
        try:
            connect = json.loads(payload)
        except ValueError:
            return False
        accepted = isinstance(connect, dict) and connect.get("gateway") == self.origin
        if not accepted:
            log.debug("proxy_rejected_dialer", proxy=self.name, line=first_line[:200])
        return accepted

    def set_delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"proxy {self.name}: delay must be >= 0, got {seconds}")
        self._delay_s = seconds

    async def _drop_all(self) -> None:
        connections = list(self._connections)
        self._connections.clear()
        for conn in connections:
            conn.abort()
        for conn in connections:
            await conn.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _reset(writer)
            return
        upstream = await self._connect_upstream()
        if upstream is None or self._cut:
            if upstream is not None:
                _reset(upstream[1])
            _reset(writer)
            return
        conn = _Connection(self, (reader, writer), upstream)
        self._connections.add(conn)
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)

    async def _connect_upstream(
        self,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        # Rotate so a server that went away does not keep getting every attempt first.
        for _ in range(len(self._upstreams)):
            host, port = self._upstreams[self._next_upstream]
            self._next_upstream = (self._next_upstream + 1) % len(self._upstreams)
            try:
                upstream = await asyncio.wait_for(
                    asyncio.open_connection(host, port), _CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                continue
            self.forwarded[(host, port)] += 1
            return upstream
        return None


class _Connection:
    """One proxied connection: two pumps, each with its own delay queue."""

    def __init__(
        self,
        proxy: LinkProxy,
        downstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._proxy = proxy
        self._writers = (downstream[1], upstream[1])
        self._tasks = [
            asyncio.ensure_future(self._pump(downstream[0], upstream[1], proxy.gate)),
            asyncio.ensure_future(self._pump(upstream[0], downstream[1], None)),
        ]

    async def run(self) -> None:
        # When either direction ends, the whole connection ends.
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        self.abort()
        await self.wait_closed()

    def abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            _reset(writer)

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        gate: Callable[[bytes], bool] | None,
    ) -> None:
        """Copy reader to writer; if `gate` is given, the first line must pass it."""
        loop = asyncio.get_running_loop()
        # Each chunk carries the loop time when it may leave; b"" marks the end of input.
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUED_CHUNKS)

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                wait_s = due - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            if gate is not None:
                first_line = await reader.readuntil(b"\r\n")
                if not gate(first_line):
                    return
                await queue.put((loop.time() + self._proxy.delay_s, first_line))
            while not sender.done():
                data = await reader.read(_CHUNK_BYTES)
                await queue.put((loop.time() + self._proxy.delay_s, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, so the peer sees the loss at once instead of a slow close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
