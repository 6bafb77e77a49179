"""The search every broken-variant test of the runtime's world makes: seeds from 0, the first
violation must be the symptom named, and one must come within the budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rsub_dev.sim.shell import ShellParams, run_shell


def caught(
    what: str,
    params: Callable[[int], ShellParams],
    budget: int,
    symptom: str | tuple[str, ...],
    **run: Any,
) -> None:
    """Fails unless a run of seed 0, 1, ... below `budget` (with `run_shell`'s `run`
    arguments) ends in a violation, and the first one starts with `symptom`."""
    for seed in range(budget):
        result = run_shell(seed, params(seed), **run)
        if result.violation is not None:
            assert result.violation.startswith(symptom), result.report()
            print(f"caught {what} at seed {seed} of {budget}: {result.violation[:60]}")
            return
    pytest.fail(f"{what} not caught in {budget} seeds")
