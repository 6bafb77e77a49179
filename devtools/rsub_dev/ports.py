"""Free TCP ports on 127.0.0.1 for local nats-server processes."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"

# Ports handed out by this process; never handed out twice even after release.
_issued: set[int] = set()


def free_ports(count: int) -> list[int]:
    """Return `count` distinct ports that were free a moment ago.

    All sockets are held open together so the kernel hands out distinct ports, then released
    so that nats-server can bind them. Another process could still take one in between;
    callers detect that from the server log ("address already in use").
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
            if port not in _issued:
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
