"""The fuzz targets as CI runs them: seeds that are accepted, a short budget of every target
with no escape, and an escape in a broken variant found, reported and replayable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sidecar.config.loading import load_config
from sidecar.config.schema import Config
from sidecar.naming import SOURCE_HEADER
from sidecar.nats.origin_log import data_entry
from sidecar.protocol import Marker, decode
from tests.fuzz.__main__ import ROOT, corpus_of
from tests.fuzz.seeds import SEEDS
from tests.fuzz.targets import (
    ENV_SEPARATOR,
    REGIONS,
    STREAM,
    TARGETS,
    TOKEN,
    VS,
    Api,
    origins,
)

FUZZ = [sys.executable, "-m", "tests.fuzz"]


def seeds(target: str) -> list[bytes]:
    """The seeds kept in the target's corpus (`python -m tests.fuzz --write-seeds`)."""
    found = [p.read_bytes() for p in sorted(corpus_of(target).glob("seed-*"))]
    assert len(found) == len(SEEDS[target]()), f"{target}: run python -m tests.fuzz --write-seeds"
    return found


def test_marker_seeds_decode() -> None:
    for seed in seeds("markers"):
        assert isinstance(decode(seed[1:], stream=STREAM, regions=REGIONS), Marker)


def test_origin_seeds_name_their_origin() -> None:
    for seed in seeds("origins"):
        origins(seed)
        assert data_entry(VS, 1, {SOURCE_HEADER: seed.decode()}).origin in REGIONS


def test_config_seeds_load(tmp_path: Path) -> None:
    for i, seed in enumerate(seeds("config")):
        env_part, _, text = seed.rpartition(ENV_SEPARATOR)
        env = dict(line.split("=", 1) for line in env_part.decode().splitlines())
        env.pop("RSUB_REGOIN", None)  # the near miss is refused on purpose
        path = tmp_path / f"{i}.yaml"
        path.write_bytes(text)
        assert isinstance(load_config(path, env), Config)


def test_api_seeds_are_answered() -> None:
    api = Api()
    refused = {
        api.methods[seed[0]][0]: api.call(seed[0], seed[2:], f"Bearer {TOKEN}")
        for seed in seeds("api")
    }
    assert refused == {name: None for name, _, _ in api.methods}


def test_a_short_budget_of_every_target_has_no_escape(tmp_path: Path) -> None:
    run = subprocess.run(
        [*FUZZ, "--seconds", "8", "--quiet", "--work", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(TARGETS)
    for line in lines:
        assert line.endswith("escapes 0") and " 0 inputs" not in line, line


def test_an_escape_is_found_reported_and_replayable(tmp_path: Path) -> None:
    run = subprocess.run(
        [*FUZZ, "markers-unguarded", "--seconds", "60", "--quiet", "--work", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]
    [crash] = tmp_path.glob("markers-unguarded-crash-*")
    assert f"ESCAPE in markers-unguarded: python -m tests.fuzz.one markers-unguarded {crash}" in (
        run.stdout
    )
    replay = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.one", "markers-unguarded", str(crash)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode != 0
    assert "DecodeError" in replay.stdout + replay.stderr
    # The same input through the real decoder is a rejection, not an escape.
    TARGETS["markers"](crash.read_bytes())
