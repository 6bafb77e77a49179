"""`rsub run`: a real sidecar process, ready on /readyz, stopped cleanly by SIGTERM; it exits
with a clear message when the configuration is bad or NATS refuses its credentials."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from rsub_dev.cluster import LocalSuperCluster
from sidecar.config.loading import config_from_mapping
from sidecar.nats.connection import NatsRefused
from sidecar.runtime import Runtime
from tests.support.nats_servers import LoneServer, password_users
from tests.support.rsub_process import run_rsub, stop_once_ready, write_sidecar_config


@pytest.mark.integration
async def test_run_serves_until_sigterm_then_exits_cleanly(
    cluster2: LocalSuperCluster, tmp_path: Path
) -> None:
    config, http_port = write_sidecar_config(tmp_path, {"servers": cluster2.servers("west")})
    proc = await run_rsub("--config", str(config))
    stdout = await stop_once_ready(proc, http_port)
    assert proc.returncode == 0
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith(b"{")]
    assert "runtime_stopped" in {e["event"] for e in events}
    # Fields, not a repr: every value is a plain JSON scalar, every line short.
    [applied] = [e for e in events if e["event"] == "topology_applied"]
    assert (applied["created"] + applied["updated"] + applied["unchanged"]) == 4
    assert max(len(line) for line in stdout.splitlines()) < 400


async def test_run_refuses_a_bad_configuration(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("region: west\nregions: [west]\nstreams: [{name: orders}]\n")
    proc = await run_rsub("--config", str(config))
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"nats: missing required key" in stderr


@pytest.mark.parametrize(("server", "setting"), [("HTTP", "http"), ("gRPC", "grpc")])
async def test_run_on_a_taken_port_exits_2_saying_so(
    tmp_path: Path, server: str, setting: str
) -> None:
    """Another process listens on the port: one line on stderr naming the address, the
    setting and the cause, exit 2 (the configuration cannot be used here), nothing left
    running (the server that did start is stopped)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        overrides = {setting: {"listen": f"127.0.0.1:{port}"}}
        # No NATS server: the servers listen before anything connects.
        config, _ = write_sidecar_config(tmp_path, {"servers": ["nats://127.0.0.1:1"]}, overrides)
        proc = await run_rsub("--config", str(config))
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 2
    lines = stderr.decode().splitlines()
    ours = [line for line in lines if line.startswith("rsub run:")]
    assert len(ours) == 1, lines
    assert ours[0].startswith(
        f"rsub run: {server} server cannot listen on '127.0.0.1:{port}' ({setting}.listen): "
    ), lines
    assert b"Traceback" not in stdout + stderr
    assert b"Event loop is closed" not in stdout + stderr
    if setting == "http":
        assert "address already in use" in ours[0]
        assert lines == ours
        # The gRPC server had started: it is stopped, and the runtime with it.
        events = [json.loads(line)["event"] for line in stdout.splitlines()]
        assert events[-3:] == ["grpc_server_started", "grpc_server_stopped", "runtime_stopped"]
    else:
        # grpc's core logs the cause (its own line, `E<date> ... add_port.cc`) before ours.
        assert [line for line in lines if line not in ours] == [
            line for line in lines if "Address already in use" in line
        ]


def password_server(tmp_path: Path) -> LoneServer:
    server = LoneServer(tmp_path, password_users(("rsub", "right-pw")))
    server.start()
    return server


@pytest.mark.integration
async def test_runtime_reports_a_refused_password_instead_of_getting_ready(
    tmp_path: Path,
) -> None:
    server = password_server(tmp_path)
    config = config_from_mapping(
        {
            "region": "west",
            "regions": ["west", "east"],
            "nats": {"servers": [server.url], "user": "rsub", "password": "wrong-pw"},
            "streams": [{"name": "orders"}],
        }
    )
    runtime = Runtime(config)
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
    config, _ = write_sidecar_config(
        tmp_path, {"servers": [server.url], "user": "rsub", "password": "wrong-pw"}
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
