"""Run the fuzz targets: `python -m tests.fuzz [TARGET...] (--seconds S | --runs N)`.

Each target runs in its own process (`tests.fuzz.one`) from the corpus kept in the repository
(`tests/fuzz/corpus/<target>/`, read only) and a work folder (`.fuzz/<target>/` or `--work`, where
libFuzzer adds what it finds); libFuzzer's progress lines go through as they come. At the end,
one line per target: inputs run, seconds, inputs/s, coverage, and escapes. An escape leaves its
input in `.fuzz/<target>-crash-*` (replay: `python -m tests.fuzz.one <target> <that file>`)
and makes the exit status 1. `--merge` adds to the repository's corpus the inputs of the work
folder that reach new coverage (libFuzzer's `-merge=1`).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz import LAUNCHER
from tests.fuzz.seeds import SEEDS
from tests.fuzz.targets import BROKEN, TARGETS

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
DEFAULT_WORK = ROOT / ".fuzz"
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_COVERAGE = re.compile(r"\bcov: (\d+)")


@dataclass
class Result:
    target: str
    runs: int
    seconds: float
    coverage: int
    escapes: list[Path]

    def line(self) -> str:
        rate = self.runs / self.seconds if self.seconds else float(self.runs)
        return (
            f"{self.target:18} {self.runs:>10,} inputs {self.seconds:>7.1f} s "
            f"{rate:>9,.0f}/s  cov {self.coverage:>5}  escapes {len(self.escapes)}"
        )


def corpus_of(target: str) -> Path:
    return CORPUS / target.split("-")[0]


def write_seeds(target: str) -> None:
    """Put the target's seeds in its repository corpus (named by position: idempotent)."""
    folder = corpus_of(target)
    folder.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(SEEDS[target]()):
        (folder / f"seed-{i}").write_bytes(seed)


def run(target: str, budget: list[str], work_root: Path, *, quiet: bool = False) -> Result:
    work = work_root / target
    work.mkdir(parents=True, exist_ok=True)
    for old in work_root.glob(f"{target}-crash-*"):
        old.unlink()
    command = [
        sys.executable,
        "-m",
        "tests.fuzz.one",
        target,
        *budget,
        "-print_final_stats=1",
        f"-artifact_prefix={work_root}/{target}-",
        str(work),
        str(corpus_of(target)),
    ]
    started = time.monotonic()
    runs, coverage = 0, 0
    with subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    ) as child:
        assert child.stderr is not None
        for line in child.stderr:
            if not quiet:
                sys.stderr.write(f"[{target}] {line}")
            if found := _COVERAGE.search(line):
                coverage = int(found[1])
            if done := _DONE.search(line):
                runs = int(done[1])
    seconds = time.monotonic() - started
    escapes = sorted(work_root.glob(f"{target}-crash-*"))
    if child.returncode != 0 and not escapes:
        raise RuntimeError(f"fuzzing {target} failed (exit {child.returncode}), no input kept")
    return Result(target, runs, seconds, coverage, escapes)


def launcher(target: str, work_root: Path) -> Path:
    """An executable that fuzzes `target`: libFuzzer's merge runs its argv[0] again."""
    path = work_root / f"{target}.sh"
    path.write_text(
        f'#!/bin/sh\n{LAUNCHER}="$0" exec {shlex.quote(sys.executable)} '
        f'-m tests.fuzz.one {shlex.quote(target)} "$@"\n'
    )
    path.chmod(0o755)
    return path


def merge(target: str, work_root: Path) -> None:
    """Add to the repository's corpus the work folder's inputs that reach new coverage."""
    command = [str(launcher(target, work_root)), "-merge=1"]
    subprocess.run(
        [*command, str(corpus_of(target)), str(work_root / target)], cwd=ROOT, check=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz", description=__doc__.split("\n")[0]
    )
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"of {[*TARGETS, *BROKEN]}")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--seconds", type=int, help="time per target")
    budget.add_argument("--runs", type=int, help="inputs per target")
    parser.add_argument("--merge", action="store_true", help="keep new coverage in the corpus")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="work folder")
    parser.add_argument(
        "--write-seeds", action="store_true", help="(re)write the seeds into the corpus first"
    )
    parser.add_argument("--quiet", action="store_true", help="only the summary lines")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - {*TARGETS, *BROKEN}
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {[*TARGETS, *BROKEN]}")
    limit = [f"-max_total_time={args.seconds}"] if args.seconds else [f"-runs={args.runs}"]
    results = []
    for target in args.targets or TARGETS:
        if args.write_seeds and target in SEEDS:
            write_seeds(target)
        results.append(run(target, limit, args.work, quiet=args.quiet))
        if args.merge and not results[-1].escapes:
            merge(target, args.work)
    print("\n".join(r.line() for r in results))
    for result in results:
        for escape in result.escapes:
            print(f"ESCAPE in {result.target}: python -m tests.fuzz.one {result.target} {escape}")
    return 1 if any(r.escapes for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
