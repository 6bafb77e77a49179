"""Deterministic simulations of rsub, each from one integer seed:

- `leases`: the real lease over a simulated bucket on virtual time (`run_leases`);
- `shell`: the real sidecar runtime over the simulated JetStream on virtual time
  (`run_shell`).

Each returns a `SimResult` (`outcome`) with the first violated property and the last events.
"""

from rsub_dev.sim.outcome import SimResult

__all__ = ["SimResult"]
