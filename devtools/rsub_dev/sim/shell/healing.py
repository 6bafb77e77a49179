"""The healed end of a run of the runtime's world (`ShellParams.healed`) and the liveness it
must show (world.py's healed phase).

At `ShellParams.heal_at_ms` the chaos stops where it is, requests stop failing, every cut
link is healed (a region lost to a failover stays lost), every sidecar of a live region runs
and is awake, and the home's user creates the durable again if they deleted it. Then:

- every live region holding the durable completes a snapshot started since (when no region
  is lost: a snapshot needs every region's answer), within the snapshot timeout (an attempt
  begun before may wait for it), a vector window and a lease (a sidecar started at the heal
  waits out its old lease);
- every copy of the durable away from its home advances (or is created) once the home's copy
  passed the next data message above it there, within a vector window and a lease
  (`ShellParams.vector_window_ms`): what the home consumes after the heal reaches every copy.

Checked at the end of the run, over what stood a window earlier; a healed end too short for
its windows checks nothing (counted: `liveness_unchecked`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from rsub_dev.sim.shell.params import DURABLE

if TYPE_CHECKING:
    from rsub_dev.sim.shell.world import ShellWorld


async def healed_end(world: ShellWorld, chaos: asyncio.Task[Any]) -> None:
    p = world.p
    heal_at = p.heal_at_ms
    if heal_at >= p.run_ms or await world.until(heal_at):
        return
    chaos.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await chaos
    await _heal(world)
    checks, home = world.checks, world.home
    window = p.vector_window_ms + p.lease_ttl_ms
    copies_by = p.run_ms - window
    if copies_by < heal_at + window:
        world.stats["liveness_unchecked"] += 1
        return
    if await world.until(heal_at + window):
        return
    world.js.settle()
    home_mid = checks.standing(home) or 0
    if await world.until(copies_by):
        return
    world.js.settle()
    owed = {
        r: behind
        for r in sorted(world.live - {home})
        if (behind := checks.behind_home(r, home)) is not None
    }
    # Absent since the heal (its user deleted it) while the home's copy moved on for a
    # window and a lease: the next update creates it again.
    absent = {r for r in world.live - {home} if checks.standing(r) is None}
    home_moved = (checks.standing(home) or 0) > home_mid
    if await world.until(p.run_ms - 1):
        return
    world.js.settle()
    for region, behind in owed.items():
        standing = checks.standing(region)
        if standing is None or standing <= behind:
            raise world.fail(
                f"liveness: {DURABLE} in {region} still at {standing} since {behind} after "
                f"healing, behind its home {home}'s copy"
            )
        world.stats["healed_advances"] += 1
    if home_moved:
        for region in sorted(absent):
            if checks.standing(region) is None:
                raise world.fail(
                    f"liveness: {DURABLE} not created again in {region} after healing, its "
                    f"home {home} consuming"
                )
    # An attempt begun before the heal may wait for its timeout (a responder's leader
    # crashed before it answered).
    if world.live == set(world.vs.regions) and heal_at + p.timeout_ms + window <= p.run_ms:
        for region in sorted(world.live):
            if checks.standing(region) is None:
                continue
            if checks.snapshot_started.get(region, -1) < heal_at:
                raise world.fail(f"liveness: {region} completed no snapshot after healing")
            world.stats["healed_snapshots"] += 1


async def _heal(world: ShellWorld) -> None:
    world.note("healed: no chaos, every link up, every sidecar running")
    world.stats["heals"] += 1
    js = world.js
    js.faults.clear()
    for region in sorted(world.live):
        js.partition(region, cut=False)
    for sidecar in world.sidecars:
        if sidecar.region not in world.live:
            continue
        sidecar.port.net.awake.set()  # a freeze cut short
        if not sidecar.tasks:
            world.note(f"{sidecar.name} restarts")
            await world.start(sidecar)
    world.apps.recreate(world.home)
