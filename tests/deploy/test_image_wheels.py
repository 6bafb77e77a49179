"""What the image installs: scripts/image_tool.py's wheels, built here without podman.

The Dockerfile installs these with `--no-index` and constraints.txt, so a runtime dependency
that constraints.txt does not pin would fail the image build; this finds it in the suite,
naming it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest


def test_the_wheels_are_rsub_and_its_pinned_runtime_dependencies(
    image_tool: ModuleType, tmp_path: Path
) -> None:
    wheels = image_tool.build_wheels(tmp_path / "wheels")
    built = dict(map(image_tool.wheel_pin, wheels))
    assert built.pop("rsub") == image_tool.image_name().rpartition(":")[2]
    pins = image_tool.pins()
    assert built == {name: pins[name] for name in image_tool.runtime_closure()}


def test_a_runtime_dependency_without_its_pin_is_named(
    image_tool: ModuleType, tmp_path: Path
) -> None:
    constraints = tmp_path / "constraints.txt"
    lines = image_tool.CONSTRAINTS.read_text().splitlines()
    constraints.write_text("\n".join(x for x in lines if not x.startswith("structlog==")) + "\n")
    with pytest.raises(image_tool.ImageError, match=r"constraints\.txt pins them: structlog=="):
        image_tool.build_wheels(tmp_path / "wheels", constraints)
