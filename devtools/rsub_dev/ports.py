"""Free TCP ports on 127.0.0.1 for local nats-server processes.

A port is picked, checked free, released, and only then bound by the server it is for, so two
things can take it in between:
- an outgoing connection of any process on the machine: the kernel takes those ports from
  its ephemeral range, so ports are picked below it;
- another process picking ports the same way. Under pytest-xdist every worker (and every
  process a test of it starts, which inherits its environment) picks from a block of its own,
  at random within the block, so two workers never hand out the same port and two processes
  of one worker rarely do. Outside xdist the block is the whole space below the ephemeral
  range.
What still slips through (a process outside the suite listening there) a caller detects from
the server log ("address already in use") and retries with fresh ports, as
`LocalSuperCluster.start` does.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Mapping
from pathlib import Path

HOST = "127.0.0.1"

# Below this, well-known and registered ports (NATS' own 4222, 6222, 7222, 8222 among them).
_LOWEST = 10_000
# Linux's setting; elsewhere the IANA dynamic range, macOS' and Windows' default.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_IANA_EPHEMERAL_FIRST = 49_152

# Ports handed out by this process: not handed out again while half the block is left.
_issued: set[int] = set()


def _ephemeral_first() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _IANA_EPHEMERAL_FIRST


def port_block(environ: Mapping[str, str] = os.environ) -> range:
    """The ports this process picks from: its xdist worker's share of the space between
    `_LOWEST` and the ephemeral range (`PYTEST_XDIST_WORKER=gw3` of
    `PYTEST_XDIST_WORKER_COUNT=4` takes the fourth quarter), or all of it outside xdist."""
    space = range(_LOWEST, _ephemeral_first())
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return space
    index, count = int(worker.removeprefix("gw")), int(environ["PYTEST_XDIST_WORKER_COUNT"])
    # xdist numbers the worker that replaces a crashed one on (`gw3` of 3): it takes the
    # block of a worker whose number it shares modulo the count (the crashed one's, or one
    # whose ports the bind check and the random pick keep apart).
    index %= count
    size = len(space) // count
    return space[index * size : (index + 1) * size]


def _bindable(sock: socket.socket, port: int) -> bool:
    """Bind `sock` to `port` (no SO_REUSEADDR: a port still in TIME_WAIT counts as taken)."""
    try:
        sock.bind((HOST, port))
    except OSError:
        return False
    return True


def free_ports(count: int) -> list[int]:
    """Return `count` distinct ports of this process's block that were free a moment ago.

    All of them are held bound together while they are picked, then released so that
    nats-server can bind them.
    """
    block = port_block()
    if len(_issued) + count > len(block) // 2:
        _issued.clear()  # released long ago: by now their servers are gone
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for tries in itertools.count():
            if len(ports) == count:
                break
            if tries == len(block):
                raise OSError(f"no {count} free ports in {block.start}-{block.stop - 1} on {HOST}")
            port = random.choice(block)
            if port in _issued:
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            if _bindable(sock, port):
                _issued.add(port)
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def refusing_socket() -> socket.socket:
    """A socket bound to a fresh port but not listening: connecting to it is refused at once.

    Holding it keeps the port reserved, so nothing else can start listening there.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return sock
