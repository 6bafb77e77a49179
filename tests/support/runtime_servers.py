"""A stand-alone nats-server process for the runtime tests (imported by their conftest)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

from rsub_dev.cluster import find_nats_server
from rsub_dev.ports import free_ports


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nats-server not listening on {port}")


class ServerProcess:
    """A stand-alone JetStream server on a fixed port that can be stopped and started again."""

    def __init__(self, work: Path, extra: str = "") -> None:
        [self.port] = free_ports(1)
        self.url = f"nats://127.0.0.1:{self.port}"
        self._work = work
        self._conf = work / "server.conf"
        self.configure(extra)
        self._proc: subprocess.Popen[bytes] | None = None

    def configure(self, extra: str) -> None:
        """Rewrite the configuration with `extra` appended (takes effect at the next start)."""
        self._conf.write_text(
            f"""
server_name: west-1
listen: 127.0.0.1:{self.port}
jetstream {{ store_dir: "{self._work / "js"}" }}
{extra}
"""
        )

    def start(self) -> None:
        with (self._work / "server.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [str(find_nats_server()), "-c", str(self._conf)], stdout=log, stderr=log
            )
        _wait_listening(self.port, self._proc)

    def log_text(self) -> str:
        path = self._work / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None
