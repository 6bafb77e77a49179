"""A durable's application moving to another region and later back (`ShellParams.moves`):
a failover and a failback with every region up, as an operator moves a consumer (no region
lost). At a drawn time the application of one durable (drawn when there are several: the
others stay) stops consuming in its home and starts in another live region, which becomes
its home; later it moves back. If the durable is not there (no update ever reached that
region, or its user deleted it), its user creates it there, delivering all. The home's copy
is then moved by the new home's updates, as every other."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rsub_dev.sim.shell.durables import Durable
    from rsub_dev.sim.shell.world import ShellWorld


async def application_moves(world: ShellWorld, tasks: list[asyncio.Task[Any]]) -> None:
    """Move the application away at a drawn time and back later (its consumers go to
    `tasks`, the run's)."""
    p, rng = world.p, world.rng
    # Both before a healed end begins (its liveness follows one home).
    last = min(p.produce_until_ms, p.heal_at_ms if p.healed else p.run_ms) - 1_000
    away_at = rng.randint(1_000, max(1_000, last // 2))
    back_at = rng.randint(away_at + 1_000, max(away_at + 1_000, last))
    if await world.until(away_at):
        return
    durable = world.pick()
    first = durable.home
    others = sorted(world.live - {first})
    if not others:
        return
    _move(world, durable, rng.choice(others), tasks)
    if await world.until(back_at):
        return
    if first in world.live:
        _move(world, durable, first, tasks)


def _move(world: ShellWorld, durable: Durable, to: str, tasks: list[asyncio.Task[Any]]) -> None:
    was = durable.home
    durable.home = to
    world.note(f"the application of {durable.name} moves from {was} to {to}")
    world.stats["app_moves"] += 1
    world.apps.recreate(durable, to, deleted=False)
    consume = world.apps.consume(durable, to, world.p.run_ms)
    tasks.append(asyncio.get_running_loop().create_task(consume))
