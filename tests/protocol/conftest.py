"""Protocol tests: tests marked slow run only when `-m` names `slow` (`pytest -m slow`).

The switch is the marker expression, not an environment variable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="slow: run `pytest -m slow` or `make soak`")
    for item in items:
        if item.get_closest_marker("slow") and HERE in item.path.parents:
            item.add_marker(skip)
