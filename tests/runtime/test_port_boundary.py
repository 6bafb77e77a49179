"""The runtime reaches NATS only through `JetStreamPort`, and `NatsPort` offers all of it;
the runtime reads the time only from the clock it is given.

No module of `sidecar/runtime`, nor the adapter modules it reads and writes JetStream
through, imports nats-py's client types (its error classes it may), the direct request
path or the stream reader, or touches a client (`.nc`, `.js`, `.jsm`): what they ask of
NATS goes through the port a simulation can replace. That holds for the root's bring-up
(the topology and the regional KV bucket are made through the port) and for stream
discovery (its `STREAM.NAMES` listing is a port operation) as for the rest. The one
exception is a name, not a path: the composition root (`root.py`) imports `NatsPort` to
build the region's port, and nothing else of `sidecar.nats.nats_port`.

The clock is `RegionHandles.clock` (the wall clock unless given another): no runtime module
but `clock` imports a source of time, and only `handles` names the wall clock (its default).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import sidecar.nats
import sidecar.runtime
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort

RUNTIME = Path(sidecar.runtime.__file__).parent
ADAPTER = Path(sidecar.nats.__file__).parent
THROUGH_THE_PORT = [
    *sorted(RUNTIME.glob("*.py")),
    *(
        ADAPTER / f"{name}.py"
        for name in (
            "consumers",
            "effective",
            "marker_log",
            "origin_log",
            "signals",
            "cursors",
            "lease",
            "shards",
            "regional_kv",
        )
    ),
]
ALLOWED_NATS = {"nats.errors", "nats.js.errors"}
BYPASSES = {"sidecar.nats.jsapi", "sidecar.nats.stream_reader", "sidecar.nats.nats_port"}
CLIENT_ATTRIBUTES = {"nc", "js", "jsm"}
# The composition root builds the real port: it may import that one name.
COMPOSITION_ROOT = "root.py"
REAL_PORT = ("sidecar.nats.nats_port", ["NatsPort"])


def offences(path: Path, source: str | None = None) -> list[str]:
    """What in the module at `path` (or in `source`, named as that module) reaches NATS
    other than through the port."""
    text = path.read_text() if source is None else source
    found: list[str] = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Attribute) and node.attr in CLIENT_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            continue
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [alias.name for alias in node.names]
            if path.name == COMPOSITION_ROOT and (node.module, names) == REAL_PORT:
                continue
            modules = [node.module]
            if node.module == "sidecar.nats":
                modules += [f"sidecar.nats.{name}" for name in names]
        else:
            continue
        for module in modules:
            nats_client = module.split(".")[0] == "nats" and module not in ALLOWED_NATS
            if nats_client or module in BYPASSES:
                found.append(f"{path.name}:{node.lineno}: imports {module}")
    return found


def test_the_runtime_reaches_nats_only_through_the_port() -> None:
    assert len(THROUGH_THE_PORT) >= 14
    assert [o for path in THROUGH_THE_PORT for o in offences(path)] == []


def test_the_check_sees_every_way_around_the_port() -> None:
    """What the check is for: a path of its own to NATS is caught in any runtime module,
    the root included, beyond the one name the root may import."""
    root, discovery = RUNTIME / "root.py", RUNTIME / "discovery.py"
    assert offences(root) == []
    caught = {
        "from sidecar.nats import jsapi": "imports sidecar.nats.jsapi",
        "from sidecar.nats.jsapi import stream_names": "imports sidecar.nats.jsapi",
        "from sidecar.nats.nats_port import MarkerPublisher": "imports sidecar.nats.nats_port",
        "from sidecar.nats.nats_port import NatsPort, MarkerPublisher": "nats_port",
        "from nats.js import JetStreamContext": "imports nats.js",
        "import nats": "imports nats",
        "names = conn.nc": ".nc",
        "kv = conn.js": ".js",
    }
    for source, offence in caught.items():
        for path in (root, discovery):
            found = offences(path, source)
            assert len(found) == 1 and offence in found[0], (path.name, source, found)
    assert offences(discovery, "from sidecar.nats.nats_port import NatsPort") != []
    assert offences(root, "from sidecar.nats.nats_port import NatsPort") == []


def operations(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_nats_port_offers_every_operation_of_the_port_as_declared() -> None:
    """mypy checks it where the runtime is given a `NatsPort` (`sidecar.runtime.root`); this
    also holds the parameter names, kinds and defaults that callers pass by keyword."""
    declared = operations(JetStreamPort)
    assert {"publish", "read", "consumer_reset", "key_value", "listen"} <= declared.keys()
    assert operations(NatsPort) == declared


TIME_SOURCES = {"time", "datetime"}


def clock_offences(path: Path) -> list[str]:
    """Where the module at `path` reads the time other than from the clock it is given."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
            if node.module == "sidecar.runtime.clock" and path.name != "handles.py":
                modules += [f"clock.{a.name}" for a in node.names if a.name != "Clock"]
        else:
            continue
        found += [
            f"{path.name}:{node.lineno}: imports {module}"
            for module in modules
            if module.split(".")[0] in TIME_SOURCES or module.startswith("clock.")
        ]
    return found


def test_the_runtime_reads_the_time_only_from_the_clock_it_is_given() -> None:
    modules = [path for path in sorted(RUNTIME.glob("*.py")) if path.name != "clock.py"]
    assert len(modules) >= 11
    assert [o for path in modules for o in clock_offences(path)] == []
