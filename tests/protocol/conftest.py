"""Protocol tests: tests marked slow run only with RSUB_SLOW=1 or when `-m` names `slow`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("RSUB_SLOW") == "1" or "slow" in config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="slow: set RSUB_SLOW=1 or run `make soak`")
    for item in items:
        if item.get_closest_marker("slow") and HERE in item.path.parents:
            item.add_marker(skip)
