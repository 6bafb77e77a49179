"""protos/breaking.py, the breaking-change check of `make lint`, run with the real buf (from
.tools, `make lint` installs it) on a copy of the repository's protos that a test changes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
API = Path("protos/rsub/v1/api.proto")
COMMIT_REQUEST = """message CommitCursorRequest {
  string stream = 1;
  string subscription = 2;"""


def commit_request_line() -> int:
    """The line of `message CommitCursorRequest {` in api.proto (buf reports there)."""
    return (ROOT / API).read_text().splitlines().index(COMMIT_REQUEST.splitlines()[0]) + 1


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """buf.yaml and protos/ (script, released schema, accepted breaks) copied: the script
    finds its repository from its own location, so it checks the copy."""
    assert BUF.exists(), f"{BUF} is missing: `make lint` (or npm ci --prefix .tools) installs it"
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "protos", tmp_path / "protos", ignore=shutil.ignore_patterns("__*"))
    return tmp_path


def breaking(repo: Path, *args: str) -> tuple[int, str]:
    argv = [sys.executable, str(repo / "protos" / "breaking.py"), *(args or ("--buf", str(BUF)))]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return result.returncode, result.stdout + result.stderr


def edit(repo: Path, old: str, new: str) -> None:
    path = repo / API
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_the_repository_passes_with_its_accepted_breaks(copy: Path) -> None:
    code, out = breaking(copy)
    assert (code, out.strip()) == (
        0,
        "no breaking change against protos/released (2 accepted)",
    )


def test_a_removed_field_is_reported_and_fails(copy: Path) -> None:
    edit(copy, COMMIT_REQUEST, COMMIT_REQUEST.replace("  string subscription = 2;", ""))
    code, out = breaking(copy)
    assert code == 1
    assert out.startswith(
        f"{API}:{commit_request_line()}:1: FIELD_NO_DELETE: Previously present field "
        '"2" with name "subscription" '
        'on message "CommitCursorRequest" was deleted.\n'
    )
    assert out.rstrip().endswith(
        "breaking-change check failed (docs/api.md, 'Evolving the protos')"
    )


def test_a_renumbered_field_is_reported_and_fails(copy: Path) -> None:
    edit(copy, COMMIT_REQUEST, COMMIT_REQUEST.replace("subscription = 2;", "subscription = 4;"))
    code, out = breaking(copy)
    assert code == 1
    assert '"CommitCursorRequest"' in out
    assert "FIELD_NO_DELETE" in out


def test_an_accepted_break_passes_and_a_stale_one_fails(copy: Path) -> None:
    edit(copy, COMMIT_REQUEST, COMMIT_REQUEST.replace("  string subscription = 2;", ""))
    reported = [
        line.split(": ", 1)[1]
        for line in breaking(copy)[1].splitlines()
        if line.startswith(f"{API}:")
    ]
    assert reported
    accepted = copy / "protos" / "accepted-breaks.txt"
    original = accepted.read_text()
    accepted.write_text(original + "# The test's break.\n" + "".join(f"{r}\n" for r in reported))
    code, out = breaking(copy)
    assert (code, out.strip().splitlines()[-1]) == (
        0,
        f"no breaking change against protos/released ({2 + len(reported)} accepted)",
    )

    # The field is back: the accepted lines name breaks buf no longer reports.
    shutil.copy(ROOT / API, copy / API)
    code, out = breaking(copy)
    assert code == 1
    stale = [line for line in out.splitlines() if line.startswith("no longer reported")]
    assert stale == [
        f"no longer reported, remove it from protos/accepted-breaks.txt: {r}"
        for r in sorted(reported)
    ]


def test_a_release_makes_the_change_the_baseline(copy: Path) -> None:
    edit(copy, COMMIT_REQUEST, COMMIT_REQUEST.replace("  string subscription = 2;", ""))
    assert breaking(copy)[0] == 1
    code, out = breaking(copy, "--release")
    assert code == 0, out
    assert (copy / "protos" / "released" / API.relative_to("protos")).read_text() == (
        copy / API
    ).read_text()
    assert breaking(copy) == (0, "no breaking change against protos/released (0 accepted)\n")
    # The repository's own baseline is untouched.
    assert (
        "string subscription = 2;"
        in (ROOT / "protos" / "released" / "rsub" / "v1" / "api.proto").read_text()
    )


def test_buf_failing_is_not_taken_for_a_clean_check(copy: Path) -> None:
    edit(copy, COMMIT_REQUEST, COMMIT_REQUEST + "\n  not proto at all")
    code, out = breaking(copy)
    assert code != 0
    assert "buf breaking failed: the protos do not compile" in out
    # The line after the edited block: the message's line + 3.
    assert f"{API}:{commit_request_line() + 3}: cannot find `not` in this scope" in out
    # Not mistaken for accepted breaks that buf no longer reports.
    assert "no longer reported" not in out
