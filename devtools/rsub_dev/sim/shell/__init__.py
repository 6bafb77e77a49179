"""The sidecar's real runtime under deterministic simulation (`run_shell`): the world
(`world`), what a run is drawn from (`params`), its applications (`applications`), its
sidecar replicas (`sidecars`) and the properties it checks (`checks`)."""

from rsub_dev.sim.shell.params import ShellParams
from rsub_dev.sim.shell.world import ShellResult, ShellWorld, run_shell

__all__ = ["ShellParams", "ShellResult", "ShellWorld", "run_shell"]
