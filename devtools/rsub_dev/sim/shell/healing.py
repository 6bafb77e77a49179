"""The healed end of a run of the runtime's world (`ShellParams.healed`) and the liveness it
must show (the deleted protocol world's healed phase).

At `ShellParams.heal_at_ms` the chaos stops where it is, requests stop failing, every cut
link is healed (a region lost to a failover stays lost), every sidecar of a live region runs
and is awake, and each durable's user creates it again in its home if they deleted it there.
Then, for each durable:

- every live region holding it completes a snapshot started since (when no region
  is lost: a snapshot needs every region's answer, and when the snapshot timeout leaves the
  two rounds time, `ShellParams.snapshot_rounds_ms`: a shorter one times every attempt out
  over slow links, which no sidecar can help), within the snapshot timeout (an attempt
  begun before may wait for it), a vector window and a lease (a sidecar started at the heal
  waits out its old lease);
- every copy of it away from its home advances (or is created) once the home's copy
  passed the next data message above it there, within a vector window and a lease
  (`ShellParams.vector_window_ms`): what the home consumes after the heal reaches every copy.

Checked at the end of the run, over what stood a window earlier; a healed end too short for
its windows checks nothing (counted: `liveness_unchecked`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rsub_dev.sim.shell.durables import Durable
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
    checks = world.checks
    window = p.vector_window_ms + p.lease_ttl_ms
    copies_by = p.run_ms - window
    if copies_by < heal_at + window:
        world.stats["liveness_unchecked"] += 1
        return
    if await world.until(heal_at + window):
        return
    world.js.settle()
    home_mid = {d.name: checks.standing(d.home, d.name) or 0 for d in world.durables}
    if await world.until(copies_by):
        return
    world.js.settle()
    owed = [_owed(world, d, home_mid[d.name]) for d in world.durables]
    if await world.until(p.run_ms - 1):
        return
    world.js.settle()
    for d, (behind, absent) in zip(world.durables, owed, strict=True):
        _advanced(world, d, behind, absent)
    # An attempt begun before the heal may wait for its timeout (a responder's leader
    # crashed before it answered).
    if p.timeout_ms < p.snapshot_rounds_ms:
        world.stats["snapshots_unchecked"] += 1  # no attempt may have the time to complete
    elif world.live == set(world.vs.regions) and heal_at + p.timeout_ms + window <= p.run_ms:
        for region in sorted(world.live):
            if all(checks.standing(region, d.name) is None for d in world.durables):
                continue
            if checks.snapshot_started.get(region, -1) < heal_at:
                raise world.fail(f"liveness: {region} completed no snapshot after healing")
            world.stats["healed_snapshots"] += 1


def _owed(world: ShellWorld, d: Durable, home_mid: int) -> tuple[dict[str, int], set[str]]:
    """A window before the end: where each copy of `d` stood behind its home's, and, if the
    home's copy moved on since the middle (`home_mid`), the regions where it is absent
    (its user deleted it since the heal: the next update creates it again)."""
    checks, home = world.checks, d.home
    behind = {
        r: at for r in sorted(world.live - {home}) if (at := checks.behind_home(d, r)) is not None
    }
    if (checks.standing(home, d.name) or 0) <= home_mid:
        return behind, set()
    return behind, {r for r in world.live - {home} if checks.standing(r, d.name) is None}


def _advanced(world: ShellWorld, d: Durable, owed: dict[str, int], absent: set[str]) -> None:
    """At the end: each copy owed advanced, each absent one was created again."""
    checks = world.checks
    for region, behind in owed.items():
        standing = checks.standing(region, d.name)
        if standing is None or standing <= behind:
            raise world.fail(
                f"liveness: {d.name} in {region} still at {standing} since {behind} after "
                f"healing, behind its home {d.home}'s copy"
            )
        world.stats["healed_advances"] += 1
    for region in sorted(absent):
        if checks.standing(region, d.name) is None:
            raise world.fail(
                f"liveness: {d.name} not created again in {region} after healing, its "
                f"home {d.home} consuming"
            )


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
    for durable in world.durables:
        world.apps.recreate(durable, durable.home)
