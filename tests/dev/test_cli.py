"""`rsub dev up` / `rsub dev down` as a user runs them: separate processes, detached servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.dev.cluster import pid_alive

pytestmark = pytest.mark.integration


def rsub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_up_refuses_twice_and_down_stops_exactly_its_pids(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    up = rsub("dev", "up", "--regions", "west,east", "--dir", str(directory))
    assert up.returncode == 0, up.stderr
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
