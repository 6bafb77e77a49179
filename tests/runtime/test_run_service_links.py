"""`rsub run` in the environment Kubernetes gives a pod whose namespace has Services named
`rsub-west-rsub-sidecar` (the chart's, release `rsub-west`) and `rsub`: it gets ready, and
logs an unrelated RSUB_ variable by name only (issue 9: any RSUB_ variable used to stop it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.nats_servers import LoneServer
from tests.support.rsub_process import run_rsub, stop_once_ready, write_sidecar_config


def service_links(service: str, cluster_ip: str, tcp_ports: dict[str, int]) -> dict[str, str]:
    """The variables the kubelet sets in every pod of the namespace for a Service with these
    named TCP ports (the first is the Service's main port), as Docker links once did."""
    svc = service.upper().replace("-", "_")
    main = next(iter(tcp_ports.values()))
    env = {
        f"{svc}_SERVICE_HOST": cluster_ip,
        f"{svc}_SERVICE_PORT": str(main),
        f"{svc}_PORT": f"tcp://{cluster_ip}:{main}",
    }
    for name, port in tcp_ports.items():
        env[f"{svc}_SERVICE_PORT_{name.upper().replace('-', '_')}"] = str(port)
        link = f"{svc}_PORT_{port}_TCP"
        env |= {
            link: f"tcp://{cluster_ip}:{port}",
            f"{link}_PROTO": "tcp",
            f"{link}_PORT": str(port),
            f"{link}_ADDR": cluster_ip,
        }
    return env


def test_service_links_have_the_kubernetes_shape() -> None:
    env = service_links("rsub", "10.0.0.7", {"grpc": 7070, "http": 8080})
    assert len(env) == 13
    assert env["RSUB_PORT"] == "tcp://10.0.0.7:7070"
    assert env["RSUB_SERVICE_PORT_HTTP"] == "8080"
    assert env["RSUB_PORT_8080_TCP_ADDR"] == "10.0.0.7"


@pytest.mark.integration
async def test_run_gets_ready_among_kubernetes_service_links(
    js_server: LoneServer, tmp_path: Path
) -> None:
    config, http_port = write_sidecar_config(tmp_path, {"servers": [js_server.url]})
    ports = {"grpc": 7070, "http": 8080}
    kubernetes = {
        **service_links("kubernetes", "10.0.0.1", {"https": 443}),
        **service_links("rsub-west-rsub-sidecar", "10.0.0.5", ports),
        **service_links("rsub", "10.0.0.7", ports),
    }
    assert sum(var.startswith("RSUB_") for var in kubernetes) == 26
    unrelated = {"RSUB_TEAM_NOTE": "hunter2-note"}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RSUB_")}
    proc = await run_rsub("--config", str(config), env={**inherited, **kubernetes, **unrelated})
    stdout = await stop_once_ready(proc, http_port)
    assert proc.returncode == 0
    events = [json.loads(line) for line in stdout.splitlines()]
    ignored = [e for e in events if e["event"] == "env_ignored"]
    assert [(e["level"], e["variables"]) for e in ignored] == [("warning", ["RSUB_TEAM_NOTE"])]
    assert b"hunter2" not in stdout
    assert not any(var.encode() in stdout for var in kubernetes)  # links: not even named
