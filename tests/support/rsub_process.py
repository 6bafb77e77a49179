"""`rsub` as a real child process: `rsub run` started, waited on until ready, stopped; any
other command run to completion."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from rsub_dev.ports import free_ports

_REPO = Path(__file__).resolve().parents[2]


async def run_rsub(*args: str, env: Mapping[str, str] | None = None) -> asyncio.subprocess.Process:
    """`rsub run ARGS` with this process's environment, or exactly `env` if given."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        "run",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def rsub_command(
    *argv: str, env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> tuple[int, str, str]:
    """Run `rsub ARGV` from the repository to completion (environment as for `run_rsub`);
    returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=_REPO,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def stop_once_ready(proc: asyncio.subprocess.Process, http_port: int) -> bytes:
    """Wait (60 s at most) until `proc` is ready on /readyz, send SIGTERM, return its stdout."""
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not await ready(f"http://127.0.0.1:{http_port}/readyz"):
            assert proc.returncode is None, "rsub run exited early"
            assert loop.time() < deadline, "rsub run never became ready"
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return stdout


def write_sidecar_config(
    directory: Path, nats: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> tuple[Path, int]:
    """A `west` sidecar configuration (regions west and east, stream `orders`, JSON logs, free
    gRPC and HTTP ports) with the given `nats` section and top-level `overrides` (whole
    sections); returns its path and the HTTP port."""
    grpc_port, http_port = free_ports(2)
    path = directory / "sidecar.yaml"
    config = {
        "region": "west",
        "regions": ["west", "east"],
        "nats": dict(nats),
        "streams": [{"name": "orders"}],
        "grpc": {"listen": f"127.0.0.1:{grpc_port}"},
        "http": {"listen": f"127.0.0.1:{http_port}"},
        "log": {"format": "json"},
        **(overrides or {}),
    }
    path.write_text(yaml.safe_dump(config))
    return path, http_port
