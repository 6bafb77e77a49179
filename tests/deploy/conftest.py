"""Fixtures for the chart and image tests: scripts/helm_tool.py, scripts/chart_readme.py,
scripts/config_schema.py and scripts/image_tool.py, loaded as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def helm_tool() -> ModuleType:
    pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) is not installed")
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) missing")
    return _load_script("helm_tool")


@pytest.fixture(scope="session")
def chart_readme() -> ModuleType:
    return _load_script("chart_readme")


@pytest.fixture(scope="session")
def config_schema() -> ModuleType:
    return _load_script("config_schema")


@pytest.fixture(scope="session")
def image_tool() -> ModuleType:
    return _load_script("image_tool")
