"""`rsub dev up` / `rsub dev down` as a user runs them: separate processes, detached servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rsub_dev.cluster import pid_alive, process_belongs_to
from sidecar.cli import main

pytestmark = pytest.mark.integration


def rsub(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def processes_of(directory: Path) -> list[int]:
    """Every live process whose command line names a path inside `directory`."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and pid_alive(int(entry.name))
        and process_belongs_to(int(entry.name), directory)
    ]


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """DIR for `rsub dev up`; whatever still runs from it at the end is killed."""
    directory = tmp_path / "dev"
    yield directory
    for pid in processes_of(directory):
        os.kill(pid, signal.SIGKILL)


def sidecar_status(grpc: str) -> dict[str, Any]:
    result = rsub("status", "--sidecar", grpc, "--json")
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def test_up_refuses_twice_and_down_stops_exactly_its_pids(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    up = rsub("dev", "up", "--regions", "west,east", "--dir", str(directory))
    assert up.returncode == 0, up.stderr
    assert "debug" not in up.stdout + up.stderr  # start-up details stay below info
    description = json.loads((directory / "cluster.json").read_text())
    pids: list[int] = list(description["pids"])
    try:
        assert set(description["regions"]) == {"west", "east"}
        assert len(pids) == 2
        assert all(pid_alive(pid) for pid in pids)
        for region in ("west", "east"):
            [server] = description["regions"][region]["servers"]
            assert server.startswith("nats://127.0.0.1:")
            assert len(description["regions"][region]["monitor"]) == 1

        again = rsub("dev", "up", "--regions", "west,east", "--dir", str(directory))
        assert again.returncode != 0
        assert "already running" in again.stderr
        assert json.loads((directory / "cluster.json").read_text())["pids"] == pids

        # A PID that is not a process of DIR (this test process) must be left alone.
        description["pids"].append(os.getpid())
        (directory / "cluster.json").write_text(json.dumps(description))
        down = rsub("dev", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        assert str(pids[0]) in down.stdout and str(os.getpid()) in down.stdout
        assert not any(pid_alive(pid) for pid in pids)
        assert not (directory / "cluster.json").exists()
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, 9)

    assert rsub("dev", "down", "--dir", str(directory)).returncode != 0


def test_up_rejects_bad_regions(tmp_path: Path) -> None:
    result = rsub("dev", "up", "--regions", "west,we st", "--dir", str(tmp_path))
    assert result.returncode != 0
    assert "'we st'" in result.stderr
    assert not (tmp_path / "cluster.json").exists()


def test_up_with_sidecars_serves_each_region_and_down_stops_all(dev_dir: Path) -> None:
    up = rsub(
        "dev", "up", "--regions", "west,east", "--dir", str(dev_dir),
        "--sidecars", "--stream", "orders",
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    description = json.loads((dev_dir / "cluster.json").read_text())
    pids: list[int] = description["pids"]
    sidecars = description["sidecars"]
    assert set(sidecars) == {"west", "east"}
    assert len(pids) == 4
    assert {sidecars[r]["pid"] for r in sidecars} < set(pids)
    assert all(pid_alive(pid) for pid in pids)

    for region, sidecar in sidecars.items():
        assert sidecar["grpc"].startswith("127.0.0.1:")
        assert sidecar["http"].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{sidecar['http']}/readyz", timeout=5) as resp:
            assert resp.status == 200
        config = (dev_dir / f"sidecar-{region}.yaml").read_text()
        assert "orders" in config and "format: json" in config
        status = sidecar_status(sidecar["grpc"])
        deadline = time.monotonic() + 30
        while not status["leader"] and time.monotonic() < deadline:
            time.sleep(0.5)
            status = sidecar_status(sidecar["grpc"])
        assert status["region"] == region
        assert status["regions"] == ["west", "east"]
        assert status["leader"] is True
        assert [s["stream"] for s in status["streams"]] == ["orders"]

    down = rsub("dev", "down", "--dir", str(dev_dir))
    assert down.returncode == 0, down.stderr
    assert "sidecar" in down.stdout
    assert all(str(pid) in down.stdout for pid in pids)
    assert not any(pid_alive(pid) for pid in pids)
    assert processes_of(dev_dir) == []


def test_sidecars_need_a_stream_and_streams_need_sidecars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "dev"
    dev_up = ["dev", "up", "--regions", "west,east", "--dir", str(directory)]
    cases = [
        (["--sidecars"], "--sidecars needs at least one --stream NAME"),
        (["--stream", "orders"], "--stream is only used with --sidecars"),
        (["--sidecars", "--stream", "_orders"], "--stream '_orders': name: '_orders'"),
        (["--sidecars", "--stream", "a", "--stream", "a"], "--stream: ['a'] given more than once"),
    ]
    for extra, error in cases:
        assert main([*dev_up, *extra]) == 1
        assert error in capsys.readouterr().err
    assert not directory.exists()


def test_a_sidecar_that_fails_to_start_stops_everything(dev_dir: Path) -> None:
    # The children inherit the environment: an invalid override makes `rsub run` exit 2.
    up = rsub(
        "dev", "up", "--regions", "west,east", "--dir", str(dev_dir),
        "--sidecars", "--stream", "orders",
        env={"RSUB_SNAPSHOT__INTERVAL_MS": "-5"},
    )  # fmt: skip
    assert up.returncode != 0
    assert "sidecar of region 'west' exited with code 2" in up.stderr
    assert "snapshot.interval_ms" in up.stderr  # the log tail shows why
    assert str(dev_dir / "sidecar-west.log") in up.stderr
    assert not (dev_dir / "cluster.json").exists()
    assert processes_of(dev_dir) == []
