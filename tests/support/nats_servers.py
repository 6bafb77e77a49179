"""Stand-alone nats-server processes with a configuration of the test's choosing.

`LoneServer(directory, extra)` writes a JetStream server configuration (JSON is valid
nats-server syntax) with `extra` merged in at the top level (`authorization`, `tls`,
`operator`, ...), starts it on a free port and waits until it accepts TCP connections.
Use `async with LoneServer(...) as server:`; `server.url` is its client URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from rsub_dev.cluster import find_nats_server, spawn_process, stop_process
from rsub_dev.ports import HOST, free_ports

_START_TIMEOUT_S = 15.0


class LoneServer:
    def __init__(
        self, directory: Path, extra: dict[str, Any], *, scheme: str = "nats", name: str = "s1"
    ) -> None:
        self.directory = directory
        self.port, self.monitor_port = free_ports(2)
        self.url = f"{scheme}://{HOST}:{self.port}"
        self.config_path = directory / f"{name}.conf"
        self.log_path = directory / f"{name}.log"
        config: dict[str, Any] = {
            "server_name": name,
            "listen": f"{HOST}:{self.port}",
            "http": f"{HOST}:{self.monitor_port}",
            "jetstream": {"store_dir": str(directory / f"{name}-js")},
        }
        config.update(extra)
        directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")
        self._proc: subprocess.Popen[bytes] | None = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def __aenter__(self) -> LoneServer:
        argv = [str(find_nats_server()), "-c", str(self.config_path)]
        self._proc = spawn_process(argv, self.log_path, detached=False)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited at start; log:\n{self.log_text()}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(HOST, self.port)
                writer.close()
                await writer.wait_closed()
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server not listening; log:\n{self.log_text()}")
            await asyncio.sleep(0.05)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            await stop_process(self._proc)
            self._proc = None
