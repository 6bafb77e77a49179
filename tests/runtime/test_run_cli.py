"""`rsub run`: a real sidecar process, ready on /readyz, stopped cleanly by SIGTERM; it exits
with a clear message when the configuration is bad or NATS refuses its credentials."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from runtime_servers import ServerProcess

from sidecar.config import Config
from sidecar.dev.cluster import LocalSuperCluster
from sidecar.dev.ports import free_ports
from sidecar.nats.connection import NatsRefused
from sidecar.runtime import Runtime


async def run_rsub(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        "run",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


@pytest.mark.integration
async def test_run_serves_until_sigterm_then_exits_cleanly(
    cluster2: LocalSuperCluster, tmp_path: Path
) -> None:
    grpc_port, http_port = free_ports(2)
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "region": "west",
                "regions": ["west", "east"],
                "nats": {"servers": cluster2.servers("west")},
                "streams": [{"name": "orders"}],
                "grpc": {"listen": f"127.0.0.1:{grpc_port}"},
                "http": {"listen": f"127.0.0.1:{http_port}"},
                "log": {"format": "json"},
            }
        )
    )
    proc = await run_rsub("--config", str(config))
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
    assert proc.returncode == 0
    assert b'"event": "runtime_stopped"' in stdout


async def test_run_refuses_a_bad_configuration(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("region: west\nregions: [west]\nstreams: [{name: orders}]\n")
    proc = await run_rsub("--config", str(config))
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"nats: missing required key" in stderr


def password_server(tmp_path: Path) -> ServerProcess:
    server = ServerProcess(
        tmp_path, 'authorization { users: [{ user: rsub, password: "right-pw" }] }'
    )
    server.start()
    return server


@pytest.mark.integration
async def test_runtime_reports_a_refused_password_instead_of_getting_ready(
    tmp_path: Path,
) -> None:
    server = password_server(tmp_path)
    config = Config.from_mapping(
        {
            "region": "west",
            "regions": ["west", "east"],
            "nats": {"servers": [server.url], "user": "rsub", "password": "wrong-pw"},
            "streams": [{"name": "orders"}],
        }
    )
    runtime = Runtime(config, serve=False)
    try:
        await runtime.start()
        with pytest.raises(NatsRefused) as info:
            await runtime.wait_ready(30)
        assert await runtime.wait_failed() is info.value is runtime.failure
        assert not runtime.readiness.ready
    finally:
        await runtime.stop()
        server.stop()
    assert "user 'rsub'" in str(info.value)


@pytest.mark.integration
async def test_run_exits_when_nats_refuses_the_password(tmp_path: Path) -> None:
    server = password_server(tmp_path)
    grpc_port, http_port = free_ports(2)
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "region": "west",
                "regions": ["west", "east"],
                "nats": {"servers": [server.url], "user": "rsub", "password": "wrong-pw"},
                "streams": [{"name": "orders"}],
                "grpc": {"listen": f"127.0.0.1:{grpc_port}"},
                "http": {"listen": f"127.0.0.1:{http_port}"},
                "log": {"format": "json"},
            }
        )
    )
    proc = await run_rsub("--config", str(config))
    try:
        # Retrying forever would hit this bound; a refusal ends the process by itself.
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()
    assert proc.returncode == 3
    message = stderr.decode().strip()
    assert message.startswith("rsub run: NATS refused the connection"), message
    assert "user/password for user 'rsub'" in message and "authorization violation" in message
    assert len(message.splitlines()) == 1
    assert b'"event": "nats_refused"' in stdout
    assert b"Traceback" not in stdout + stderr
    assert b"wrong-pw" not in stdout + stderr
    assert "authentication error" in server.log_text()
