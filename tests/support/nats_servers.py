"""The tests' one launcher of a stand-alone nats-server, with a configuration of their choosing.

`LoneServer(directory, extra)` writes a JetStream server configuration (JSON is valid
nats-server syntax) with `extra` merged in at the top level (`authorization`, `tls`,
`operator`, ...), on free ports picked once: a server stopped and started again keeps its
URL and its store, and `configure` rewrites its configuration for the next start (a password
changed while clients are away, say). `server.url` is its client URL.

- In async code: `async with LoneServer(...) as server:` starts it and stops it after.
- In a fixture or a test that restarts it: `start()` returns once it accepts TCP
  connections, `stop()` ends it (and does nothing if it is not running).

The process dies with the test process (`rsub_dev.cluster.spawn_process`); its output goes
to `<name>.log` in `directory` (`log_text()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rsub_dev.cluster import find_nats_server, spawn_process
from rsub_dev.ports import HOST, free_ports

_START_TIMEOUT_S = 15.0
_POLL_S = 0.05
_STOP_TIMEOUT_S = 10.0


def password_users(*users: tuple[str, str]) -> dict[str, Any]:
    """The `extra` of a server that admits these `(user, password)` pairs only."""
    return {"authorization": {"users": [{"user": u, "password": p} for u, p in users]}}


class LoneServer:
    def __init__(
        self,
        directory: Path,
        extra: Mapping[str, Any] | None = None,
        *,
        scheme: str = "nats",
        name: str = "s1",
    ) -> None:
        self.directory = directory
        self.name = name
        self.port, self.monitor_port = free_ports(2)
        self.url = f"{scheme}://{HOST}:{self.port}"
        self.config_path = directory / f"{name}.conf"
        self.log_path = directory / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.configure(extra or {})

    def configure(self, extra: Mapping[str, Any]) -> None:
        """Write the configuration with `extra` merged in (it takes effect at the next start)."""
        config: dict[str, Any] = {
            "server_name": self.name,
            "listen": f"{HOST}:{self.port}",
            "http": f"{HOST}:{self.monitor_port}",
            "jetstream": {"store_dir": str(self.directory / f"{self.name}-js")},
            **extra,
        }
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _launch(self) -> Iterator[None]:
        """Spawn the server, then yield until it listens (the caller sleeps in between)."""
        if self._proc is not None:
            raise RuntimeError(f"nats-server {self.name} is already running on {self.url}")
        argv = [str(find_nats_server()), "-c", str(self.config_path)]
        self._proc = spawn_process(argv, self.log_path, detached=False)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                code, self._proc = self._proc.returncode, None
                raise RuntimeError(f"nats-server exited at start ({code}); log:\n{self.log_text()}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), _POLL_S):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nats-server not listening; log:\n{self.log_text()}")
            yield

    def start(self) -> None:
        """Start the server and return once it accepts TCP connections (blocking)."""
        for _ in self._launch():
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a timeout; reaps the process."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def __aenter__(self) -> LoneServer:
        for _ in self._launch():
            await asyncio.sleep(_POLL_S)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
