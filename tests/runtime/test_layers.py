"""No module of `sidecar/` imports from a layer above its own (issue 19): the protocol, then
the JetStream adapter (`sidecar.nats`), then the runtime, then the API and the command line
(with `sidecar.exact`, a client of the API). The shared modules below every layer
(`naming`, `logs`, `config`, `metrics`, the generated wire code, the package itself) import
no layer; the protocol, pure, imports of them only the generated wire code.

Read from the source with `ast` (an import inside a function counts as well).

The API and the command line sit on the runtime: the metrics are shared (`sidecar.metrics`),
the views and errors of the backend contract are the runtime's (`sidecar.runtime.views`,
`sidecar.runtime.errors`), and the servers are started around the runtime by
`sidecar.api.service.Service`. No module imports from a layer above its own, with no
exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sidecar

ROOT = Path(sidecar.__file__).parent
LAYERS = {"protocol": 1, "nats": 2, "runtime": 3, "api": 4, "cli": 4, "exact": 4}
SHARED = {"sidecar", "_gen", "naming", "logs", "config", "metrics"}


def part_of(module: str) -> str:
    """The layer or shared module `module` (dotted, under `sidecar`) belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported(path: Path, source: str | None = None) -> list[str]:
    """The `sidecar` modules the module at `path` (or `source`) imports."""
    found: list[str] = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "sidecar"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "sidecar":
                continue
            if node.module in ("sidecar", "sidecar.api", "sidecar.nats", "sidecar.protocol"):
                # `from sidecar.api import backend`: a module of the package, or a name of it
                package = ROOT.joinpath(*node.module.split(".")[1:])
                found += [
                    f"{node.module}.{a.name}"
                    if (package / f"{a.name}.py").exists() or (package / a.name).is_dir()
                    else node.module
                    for a in node.names
                ]
            else:
                found.append(node.module)
    return found


def upward(path: Path, source: str | None = None) -> set[tuple[str, str]]:
    """(module, what it imports) for each import of the module at `path` that breaks the
    rule."""
    name = str(path.relative_to(ROOT))
    own = name.split("/")[0].removesuffix(".py")
    found: set[tuple[str, str]] = set()
    for module in imported(path, source):
        target = part_of(module)
        if target == own:
            continue
        if own in SHARED:
            broken = target in LAYERS or (own == "_gen" and target != "_gen")
        elif own == "protocol":
            broken = target != "_gen"
        else:
            broken = target in LAYERS and LAYERS[target] > LAYERS[own]
        if broken:
            found.add((name, module))
    return found


def modules() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if "_gen" not in p.relative_to(ROOT).parts]


def test_every_module_belongs_to_a_layer_or_is_shared() -> None:
    parts = {str(p.relative_to(ROOT)).split("/")[0].removesuffix(".py") for p in modules()}
    assert parts <= set(LAYERS) | SHARED | {"__init__"}
    assert set(LAYERS) <= parts


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    found = {offence for path in modules() for offence in upward(path)}
    assert found == set()


def test_the_check_sees_an_upward_import() -> None:
    nats, protocol, runtime = (
        ROOT / "nats/lease.py",
        ROOT / "protocol/leases.py",
        ROOT / "runtime/x.py",
    )
    assert upward(nats, "from sidecar.runtime.handles import RegionHandles") == {
        ("nats/lease.py", "sidecar.runtime.handles")
    }
    assert upward(nats, "from sidecar.api import grpc_server") == {
        ("nats/lease.py", "sidecar.api.grpc_server")
    }
    assert upward(protocol, "import sidecar.nats.port") == {
        ("protocol/leases.py", "sidecar.nats.port")
    }
    assert upward(protocol, "from sidecar.config import Config") == {
        ("protocol/leases.py", "sidecar.config")
    }
    assert upward(ROOT / "config.py", "from sidecar.protocol import StreamMachine") != set()
    assert upward(ROOT / "metrics.py", "from sidecar.runtime.clock import Clock") != set()
    assert upward(runtime, "from sidecar.nats.port import JetStreamPort") == set()
    assert upward(runtime, "from sidecar.protocol import StreamMachine") == set()
    assert upward(ROOT / "cli/run.py", "from sidecar.runtime import Runtime") == set()
    assert upward(runtime, "from sidecar.api.service import Service") == {
        ("runtime/x.py", "sidecar.api.service")
    }
    assert upward(ROOT / "api/service.py", "from sidecar.runtime import Runtime") == set()
