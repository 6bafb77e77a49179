"""Regenerate the Python code for protos/ into sidecar/_gen (run by `make proto`).

protoc writes imports relative to the proto root (`from rsub.v1 import ...`); they are
rewritten to the package the code lives in, so the generated modules import as
`sidecar._gen.rsub.v1.*` without touching sys.path.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from grpc_tools import protoc
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
# The schema; protos/released holds the last released copy, for `buf breaking` only.
SOURCES = PROTOS / "rsub"
PACKAGE = "sidecar._gen"
IMPORT_RE = re.compile(r"^from rsub\.v1 import ", re.MULTILINE)
# The runtime versions the generated code refuses to import below, and the distributions
# whose declared floor (pyproject.toml) must be at least that version.
GENCODE_FLOORS = {
    "protobuf": (re.compile(r"^# Protobuf Python Version: (\S+)$", re.MULTILINE), "_pb2.py"),
    "grpcio": (re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.MULTILINE), "_grpc.py"),
}
GRPC_COMPANIONS = ("grpcio-health-checking", "grpcio-reflection")


def generate(out: Path) -> None:
    sources = sorted(str(p.relative_to(PROTOS)) for p in SOURCES.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        text = IMPORT_RE.sub(f"from {PACKAGE}.rsub.v1 import ", path.read_text())
        path.write_text(text)
    for directory in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()


def main() -> int:
    target = ROOT / "sidecar" / "_gen"
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "_gen"
        out.mkdir()
        generate(out)
        if check:
            stale = _differences(out, target)
            if stale:
                print("generated protobuf code is stale; run `make proto`:", *stale, sep="\n  ")
                return 1
            floors = floor_problems(target, ROOT / "pyproject.toml")
            if floors:
                print("declared dependency floors below what the generated code needs:")
                print(*floors, sep="\n  ")
                return 1
            print("generated protobuf code is current; the declared floors admit it")
            return 0
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(out, target)
    print(f"generated {target.relative_to(ROOT)}")
    return 0


def floor_problems(generated: Path, pyproject: Path) -> list[str]:
    """Each dependency whose lowest declared version could not import the generated code.

    protobuf's gencode refuses an older runtime (VersionError) and grpc's refuses an older
    grpcio (RuntimeError): a floor below the generator's version is a false promise.
    """
    declared = {
        Requirement(r).name: Requirement(r)
        for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    }
    needed: dict[str, Version] = {}
    for dist, (pattern, suffix) in GENCODE_FLOORS.items():
        for path in generated.rglob(f"*{suffix}"):
            for found in pattern.findall(path.read_text()):
                needed[dist] = max(needed.get(dist, Version(found)), Version(found))
    if "grpcio" in needed:
        needed.update(dict.fromkeys(GRPC_COMPANIONS, needed["grpcio"]))
    problems = []
    for dist, version in sorted(needed.items()):
        floors = [Version(s.version) for s in declared[dist].specifier if s.operator == ">="]
        if not floors or max(floors) < version:
            problems.append(f"{dist}: declared {declared[dist].specifier}, needs >={version}")
    return problems


def _differences(fresh: Path, committed: Path) -> list[str]:
    names = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    names |= {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
    return sorted(
        str(n)
        for n in names
        if "__pycache__" not in n.parts
        and (
            not (fresh / n).exists()
            or not (committed / n).exists()
            or (fresh / n).read_bytes() != (committed / n).read_bytes()
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
