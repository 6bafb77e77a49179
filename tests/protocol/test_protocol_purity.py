"""The protocol core stays pure: no module under sidecar/protocol imports I/O, time or randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import sidecar.protocol

FORBIDDEN = {"asyncio", "nats", "grpc", "time", "random", "socket", "threading", "os", "datetime"}


def test_protocol_modules_import_nothing_impure() -> None:
    root = Path(sidecar.protocol.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) >= 3
    offenders = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
