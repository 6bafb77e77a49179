"""Deterministic simulation of rsub regions driving the real protocol core.

`run(seed)` (or `World(seed, params, factory).run()`) plays one whole schedule from a single
integer seed and returns a `SimResult` with the first violated property and the last events.
"""

from rsub_dev.sim.world import MachineFactory, SimParams, SimResult, World, run

__all__ = ["MachineFactory", "SimParams", "SimResult", "World", "run"]
