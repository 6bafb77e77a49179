"""Fixtures for the chart and image tests: the helm_tool script, loaded as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def helm_tool() -> ModuleType:
    pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) is not installed")
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) missing")
    spec = importlib.util.spec_from_file_location("helm_tool", ROOT / "scripts" / "helm_tool.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
