"""How fast the simulations run: the real runtime of a three-region cluster on virtual time
(`rsub_dev.sim.shell`), next to the leases' world, in one run.

    .venv/bin/python bench/bench_shell_sim.py [--seeds 10]

Prints, per world, whole schedules per wall-clock second and per CPU second, and for the
runtime's world simulated seconds per wall-clock and per CPU second (this machine is shared:
the CPU figures are the steadier ones). The runtime's runs are as drawn (limits, purges,
twins, moves and healed ends in some), with three regions.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Callable

from rsub_dev.sim.leases import run_leases
from rsub_dev.sim.shell import ShellParams, run_shell


def _timed(runs: int, one: Callable[[int], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for seed in range(runs):
        one(seed)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    seeds = args.seeds

    def shell_params(seed: int) -> ShellParams:
        params = ShellParams.draw(random.Random(seed ^ 0x5E11))
        return dataclasses.replace(params, regions=3)

    def shell(seed: int) -> object:
        return run_shell(seed, shell_params(seed))

    # Runs with a healed end are longer (`ShellParams.with_healed_end`).
    virtual_s = sum(shell_params(seed).run_ms for seed in range(seeds)) / 1000
    rows = [
        ("runtime (shell), 3 regions", *_timed(seeds, shell)),
        ("leases", *_timed(seeds, run_leases)),
    ]
    print(f"{seeds} seeds each")
    print(f"{'world':<30} {'schedules/s wall':>17} {'schedules/CPU s':>16}")
    for name, wall, cpu in rows:
        print(f"{name:<30} {seeds / wall:>17.2f} {seeds / cpu:>16.2f}")
    _, wall, cpu = rows[0]
    print(
        f"runtime: {virtual_s / wall:.1f} simulated s per wall s, "
        f"{virtual_s / cpu:.1f} per CPU s ({virtual_s:.0f} simulated s)"
    )


if __name__ == "__main__":
    main()
