"""Run the simulations over fresh seeds for a while: `python -m rsub_dev.sim.soak --seconds N`.

Per seed, the leases' world (`leases`: the real `Lease` over a simulated bucket on virtual
time) and the runtime's (`shell`: the real sidecar runtime over the simulated JetStream on
virtual time). Every run draws its parameters from its seed; the
first violation prints the seed, the parameters and the last events, and exits with status 1.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from rsub_dev.sim.leases import run_leases
from rsub_dev.sim.shell import run_shell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rsub_dev.sim.soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(2**40)
    deadline = time.monotonic() + args.seconds
    totals: dict[str, int] = {}
    runs = 0
    seed = first
    started = time.monotonic()
    while time.monotonic() < deadline:
        try:
            leases, shell = run_leases(seed), run_shell(seed)
        except Exception:
            print(f"CRASHED at seed {seed}; reproduce with --seed {seed}", file=sys.stderr)
            raise
        runs += 1
        for prefix, stats in (("lease_", leases.stats), ("shell_", shell.stats)):
            for key, value in stats.items():
                totals[prefix + key] = totals.get(prefix + key, 0) + value
        for failed in (leases, shell):
            if failed.violation:
                print(failed.report())
                print(f"FAILED after {runs} runs; reproduce with --seed {seed}", file=sys.stderr)
                return 1
        seed += 1
    elapsed = time.monotonic() - started
    print(
        f"seeds {first}..{seed - 1}: {runs} runs of each world in {elapsed:.1f}s "
        f"({runs / elapsed:.1f} seeds/s)"
    )
    print("totals: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
