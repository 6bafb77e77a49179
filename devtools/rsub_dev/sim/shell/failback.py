"""The failback guard (docs/protocol.md §7) and a subscription consumed in two regions (§8)
in the runtime's world.

A returning region (`ShellParams.failback_ms`): the home region `a`, lost at `failover_ms`,
comes back (`SimJetStream.restart`: its servers with what they stored, its streams under new
leaders, each of its sources (its own region's included) resuming only `reconnect_ms` and up to
2 s later), its sidecars start again and the applications of the durables homed there
first consume there at once; each one in the region it failed over to stops, or goes on
(`both_consume`); with `silent`, the third region is cut off from then on and never answers.
The durables homed elsewhere stay where they are (their copies in `a` are held or not as the
guard decides: no application of theirs consumes there).

Checked as it goes (`Failback`), for each durable:

- failback safety, at every fetch in `a` once back: it is never delivered a message another
  region consumed before `a` returned, but for what docs/protocol.md §7 leaves: until the
  first positions read of `a`'s new leader has decided and its hold landed (the hold starts
  at that read), and a message after one no region had consumed (`position_for` stops at the
  first uncovered one; the next move over the run after it waits for a read after that one
  was delivered, or removed undelivered by the read stream's limits);
- no healthy hold, as a pause lands: the guard's pause (any but a move's) lands only in a
  region that returned;
- failback liveness, every interval: `a`'s durable is not held longer than
  `release_window_ms` after sourcing between `a` and every other region resumed (and the
  hold landed), nor longer than its deadline (`hold_ms`) whatever happens;
- consumed in, every input and interval: a region is reported consuming (`Update.consuming`,
  `consumed_in`) only after an application consumed the durable there: a machine's own sign
  only over consumption since its previous positions read, an update's only over
  consumption since its writer's previous update, a remote region only from an update read
  live (not replayed) within the window; and with two regions consuming at once after the
  return, every leader reports both within `consumed_in_bound_ms`.
"""

from __future__ import annotations

import asyncio
import random
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from rsub_dev.sim.outcome import Violation
from rsub_dev.sim.shell.ledger import DataId
from rsub_dev.sim.shell.params import MOVE_PAUSE_MS, ShellParams, durable_names
from rsub_dev.simjs import Delivery
from rsub_dev.simjs.stream import Stream
from sidecar.nats.origin_log import data_entry
from sidecar.protocol import (
    HoldConsumer,
    Marker,
    MarkerRead,
    MarkerRejected,
    Output,
    PositionsListing,
    StreamMachine,
    SubscriptionAction,
    Update,
)

if TYPE_CHECKING:
    from rsub_dev.sim.shell.durables import Durable
    from rsub_dev.sim.shell.world import ShellWorld


@dataclass(slots=True)
class _Watched:
    """What the checks follow of one durable."""

    elsewhere: set[DataId] = field(default_factory=set)
    """What regions other than the returned one consumed of it before it returned."""
    consumed_by: dict[str, set[DataId]] = field(default_factory=lambda: defaultdict(set))
    fetched: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Per region, when its application was delivered data."""
    first: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Per region, when its application was delivered data no other region had consumed
    (no move can have passed it: only consumption there did)."""
    hold_asked: bool = False
    hold_landed_ms: int | None = None
    released_ms: int | None = None
    both: tuple[str, ...] = ()
    """The regions consuming it at once after the return (`both_consume`)."""
    start: int | None = None
    """In the returned region: where its deliveries run from since its last skip (a move
    landing, or data passed)."""
    run_end: int | None = None
    """In the returned region: the end of that run, the last message delivered once the
    guard settled or where a move landed (from where it stood as it returned)."""
    uncovered_at: dict[int, int] = field(default_factory=dict)
    """In the returned region once the guard settled: when each message no region had
    consumed before the return was delivered (by its sequence there)."""
    removed_at: dict[int, int] = field(default_factory=dict)
    """In the returned region from the return on: when each message no region had consumed
    before it, never delivered there, was seen removed from its read stream (limits or a
    purge: the durable passes it as if acked; by its sequence there)."""


class Failback:
    """The return (`run`) and the checks of the module's docstring, wired by the world:
    `observed` wraps its machines, `attach` hooks the model, the applications and the
    checks, `checking` runs every interval."""

    def __init__(self, world: ShellWorld) -> None:
        self._world = world
        p: ShellParams = world.p
        self._p = p
        self._returned: str | None = None
        """The region back, once it is."""
        self._back_ms = 0
        self._watched = {name: _Watched() for name in durable_names(p.durables)}
        self._decided_ms: int | None = None
        """When the returned region's new leader applied its first positions read."""
        self._held: dict[tuple[str, str], tuple[int, int]] = {}
        """Per region and durable, the guard's pause that stands (since, until)."""
        self._caught_up_ms: int | None = None
        """When sourcing between the returned region and every other region resumed (None:
        not all of them will)."""
        self._stalled_until_ms: int | None = None
        """When the returned region's stalled leader woke (`ShellParams.stall`)."""
        self._stall_began_ms: int | None = None
        self._listed_ms: dict[StreamMachine, int] = {}
        """Per machine, when the last positions read it applied ended (`_listed`)."""
        self._local_sign_ms: dict[tuple[StreamMachine, str], int] = {}
        self._remote_sign_ms: dict[tuple[StreamMachine, str, str], int] = {}
        """(machine, region, durable) -> when it read that region's last consuming sign."""
        self._leading_since: dict[StreamMachine, int] = {}
        self._update_ms: dict[tuple[str, str], int] = {}
        """Per region and durable, when its last update landed."""
        self._tasks: list[asyncio.Task[Any]] = []
        self._read: Stream | None = None
        """The returned region's read stream, once back (read without settling the model:
        `_removals` runs inside its settling)."""
        self._first_seen = 0
        """Its first sequence as last seen (`_removals`)."""

    # ---- bounds -------------------------------------------------------------------------

    @property
    def _read_slack_ms(self) -> int:
        """How long a positions read (its listing, the effective positions) or a publish
        may take, the tails lagging: requests delayed both ways."""
        return 30 * self._p.max_delay_ms + self._p.tail_lag_ms

    @property
    def _move_ms(self) -> int:
        """How long a move over covered messages may follow the ack of the message no region
        consumed before them: the ack's signal, a read and the move (an interval each),
        requests delayed."""
        return 3 * self._p.interval_ms + self._read_slack_ms

    @property
    def consumed_in_bound_ms(self) -> int:
        """How soon consumption is reported by every leader: the acks' signal, a read (an
        interval each), an update (a vector interval, an interval), its link, the marker
        tail, requests delayed, and slack."""
        p = self._p
        return 4 * p.interval_ms + p.link_delay_ms + 2 * p.tail_lag_ms + 40 * p.max_delay_ms + 500

    # ---- wiring -------------------------------------------------------------------------

    def observed(self, factory: type[StreamMachine]) -> type[StreamMachine]:
        """`factory`'s machines, observed after their inputs: the guard's first decision,
        the consumption signs they take and read, their leadership."""
        checks = self

        class Observed(factory):  # type: ignore[valid-type,misc]
            _restoring = False

            @classmethod
            def restore(
                cls, *args: Any, **kwargs: Any
            ) -> tuple[StreamMachine, list[MarkerRead | MarkerRejected]]:
                Observed._restoring = True
                try:
                    machine, read = super().restore(*args, **kwargs)
                finally:
                    Observed._restoring = False
                checks._listed_ms[machine] = checks._world.now_ms()  # the rebuild's clock
                return machine, read

            def became_leader(self, epoch: int) -> list[Output]:
                checks._leading_since.setdefault(self, checks._world.now_ms())
                return super().became_leader(epoch)  # type: ignore[no-any-return]

            def became_follower(self) -> list[Output]:
                checks._leading_since.pop(self, None)
                return super().became_follower()  # type: ignore[no-any-return]

            def positions_listed(self, listing: PositionsListing) -> list[Output]:
                leading, signs = self.is_leader, checks._signs(self)
                out: list[Output] = super().positions_listed(listing)
                checks._listed(self, leading, signs, out, listing.read_ms)
                return out

            def action_done(
                self,
                action: SubscriptionAction,
                mark_delete: int,
                done_ms: int = 0,
                *,
                first_seq: int = 0,
                lease_epoch: int | None = None,
            ) -> list[Output]:
                signs = checks._signs(self)
                out: list[Output] = super().action_done(
                    action, mark_delete, done_ms, first_seq=first_seq, lease_epoch=lease_epoch
                )
                checks._signed(self, signs)
                return out

            def marker_seen(self, read_seq: int, marker: Marker) -> list[Output]:
                out: list[Output] = super().marker_seen(read_seq, marker)
                body = marker.body
                if (
                    not Observed._restoring
                    and isinstance(body, Update)
                    and body.subscription in checks._watched
                    and body.consuming
                    and marker.region != self.config.region
                ):
                    key = (self, marker.region, body.subscription)
                    checks._remote_sign_ms[key] = checks._world.now_ms()
                return out

        Observed.__name__ = f"Observed{factory.__name__}"
        return Observed

    def attach(self) -> None:
        """Hooks on the simulated JetStream, the applications and the checks (once `_main`
        built them)."""
        world = self._world
        world.js.on_paused = self._paused
        world.apps.on_fetched.append(self._delivered)
        world.apps.on_finished.append(self._finished)
        world.checks.on_update.append(self._update)
        world.checks.on_moved.append(self._moved)
        world.js.on_stored = self._stored

    def _stored(self, stream: str) -> None:
        """A message stored anywhere: the limits may have removed some of the returned
        region's since it was last looked at."""
        self._removals()

    def checking(self) -> None:
        """The checks of every interval (the world's, the model settled)."""
        self._reports()
        self._holding()
        if self._returned is not None:  # the same stream unless it was created again
            self._read = self._world.js.stream(self._world.vs.read_stream(self._returned))
            self._removals()

    async def run(self) -> None:
        """The return at `failback_ms`; the tasks it starts run until the world ends."""
        try:
            await self._returning()
            await asyncio.Event().wait()
        finally:
            for task in self._tasks:
                task.cancel()
            ended = await asyncio.gather(*self._tasks, return_exceptions=True)
            broken = [e for e in ended if isinstance(e, Exception) and not isinstance(e, Violation)]
            if broken:
                raise broken[0]

    # ---- the return ---------------------------------------------------------------------

    async def _returning(self) -> None:
        world, p = self._world, self._p
        if await world.until(p.failback_ms):
            return
        loop = asyncio.get_running_loop()
        a = world.vs.regions[0]
        others = [r for r in world.vs.regions if r != a]
        reconnect = {r: p.reconnect_ms + world.rng.randint(0, 2_000) for r in world.vs.regions}
        for watched in self._watched.values():
            watched.elsewhere = set().union(*(watched.consumed_by[r] for r in others))
        world.js.faults.clear()  # calm from here: no failing request
        if p.silent:
            silent = world.vs.regions[2]
            world.note(f"{silent} cut off for good")
            world.js.partition(silent)
        world.js.restart(a, reconnect)
        self._returned, self._back_ms = a, world.now_ms()
        self._read = world.js.stream(world.vs.read_stream(a))
        self._first_seen = self._read.first_seq
        for name, watched in self._watched.items():
            watched.start = watched.run_end = world.checks.standing(a, name)
        if not p.silent:
            self._caught_up_ms = self._back_ms + max(reconnect[r] for r in others)
            if p.stall:
                self._tasks.append(loop.create_task(self._stall(a, self._caught_up_ms)))
        world.note(f"{a} back (sourcing resumes after {reconnect})")
        world.stats["returns"] += 1
        world._live.add(a)
        apps = world.apps
        for d in self._returning_home(a):
            if p.both_consume:
                self._watched[d.name].both = (a, d.home)
                consume = apps.consume(d, a, p.run_ms, keep=lambda: True)
            else:
                d.home = a
                consume = apps.consume(d, a, p.run_ms)
            self._tasks.append(loop.create_task(consume))
        self._tasks.append(loop.create_task(self._producing(a, max(reconnect.values()))))
        for sidecar in world._sidecars:
            if sidecar.region == a:
                # The failover's stop of a replica frozen then ends only at its wake (its
                # tasks' cancellation waits on its frozen requests): waited for, not run
                # beside (seed 2 with seed 9746887200's parameters: "started while it runs").
                await sidecar.stop()
                await world._start(sidecar)
        # A healthy region's sidecars restart meanwhile: they hold nothing, and rebuilt from
        # their read stream report no region consuming that stopped long ago.
        healthy = world.vs.regions[-1]
        for sidecar in world._sidecars:
            if sidecar.region == healthy:
                world.note(f"{sidecar.name} restarts")
                await sidecar.stop()
                await world._start(sidecar)

    async def _stall(self, a: str, caught_up_ms: int) -> None:
        """`ShellParams.stall`: `a`'s leader stalls past its lease as sourcing resumes."""
        world, p = self._world, self._p
        rng = random.Random(world.seed ^ 0x57A11)  # its own: the world's draws stay as they were
        if await world.until(caught_up_ms + rng.randint(0, p.failback_window_ms // 2)):
            return
        leader = next((s for s in world.sidecars if s.region == a and world._led(a, s)), None)
        if leader is None:
            return
        # Not with a reset of its own under way: one sent before the stall lands after it,
        # over the next leader's moves (JetStream's reset takes no fencing token: seed 13's
        # limit, docs/simulation.md, pinned by its own tests). No reset starts during it:
        # each first reads the consumer, which waits for the wake, and checks the lease.
        await leader.port.no_reset_out()
        ms = rng.randint(p.lease_ttl_ms * 6 // 5, 2 * p.lease_ttl_ms)
        holding = any(region == a for region, _ in self._held)
        world.note(f"{leader.name} stalls for {ms} ms ({'holding' if holding else 'no hold'})")
        world.stats["stalls_holding" if holding else "stalls"] += 1
        self._stall_began_ms = world.now_ms()
        self._stalled_until_ms = world.now_ms() + ms
        await leader.freeze(ms)
        world.note(f"{leader.name} wakes")

    def _returning_home(self, a: str) -> list[Durable]:
        """The durables first homed in `a`, whose applications consume there again."""
        return [d for d in self._world.durables if d.first_home == a]

    async def _producing(self, region: str, reconnect_ms: int) -> None:
        """The returned region's producers: at once, or once every source there reconnected
        (`quiet_return`)."""
        world, p = self._world, self._p
        if p.quiet_return and await world.until(self._back_ms + reconnect_ms):
            return
        await world.apps.produce(region, p.produce_until_ms)

    # ---- failback safety and the holds ----------------------------------------------------

    def _settled(self, watched: _Watched) -> bool:
        """Whether the guard decided, and its hold of the durable (if it asked for one)
        landed."""
        return self._decided_ms is not None and (
            not watched.hold_asked or watched.hold_landed_ms is not None
        )

    def _finished(self, durable: Durable, region: str) -> None:
        """A slow worker consumed a message of `durable` fetched before: consumption there now."""
        self._watched[durable.name].fetched[region].append(self._world.now_ms())

    def _delivered(self, durable: Durable, region: str, deliveries: list[Delivery]) -> None:
        world, vs, w = self._world, self._world.vs, self._watched[durable.name]
        now = world.now_ms()
        w.fetched[region].append(now)
        entries = [(d.stream_seq, data_entry(vs, d.stream_seq, d.headers)) for d in deliveries]
        ids = [(e.origin, e.origin_seq) for _, e in entries]
        others = [w.consumed_by[r] for r in vs.regions if r != region]
        if any(all(i not in seen for seen in others) for i in ids):
            w.first[region].append(now)
        w.consumed_by[region].update(ids)
        if region != self._returned or not self._settled(w):
            return
        stream = world.js.stream(vs.read_stream(region))
        first = deliveries[0].stream_seq
        last = w.run_end
        if (
            last is None
            or w.start is None
            or next(stream.matching(last + 1, (vs.data_filter(),), first - 1), None) is not None
        ):
            w.start = first - 1  # the first after the guard, or after data passed unseen
        w.run_end = deliveries[-1].stream_seq
        for seq, entry in entries:
            data = (entry.origin, entry.origin_seq)
            if data not in w.elsewhere:
                w.uncovered_at[seq] = now
                continue
            # The last message before it since the durable's last skip that no region had
            # consumed: the move over what follows it waits for the read after its ack, or
            # after its removal when the read stream's limits removed it undelivered (`make
            # soak` seed 57639939165: nothing tells the runtime before its next read).
            uncovered = max(
                (u for u in chain(w.uncovered_at, w.removed_at) if w.start < u < seq),
                default=None,
            )
            passed_ms = (
                None
                if uncovered is None
                else w.uncovered_at.get(uncovered, w.removed_at.get(uncovered))
            )
            if passed_ms is not None and now - passed_ms <= self._move_ms + self._stalled_ms(
                passed_ms
            ):
                how = "removed" if uncovered in w.removed_at else "uncovered"
                world.stats[f"failback_after_{how}"] += 1
                continue
            raise world.fail(
                f"failback safety: {region} delivered {data} of {durable.name} at {seq}, "
                f"consumed elsewhere before {region} returned at {self._back_ms} ms (guard "
                f"decided at {self._decided_ms} ms, held {w.hold_landed_ms}, released "
                f"{w.released_ms}; the last message consumed nowhere before it, since "
                f"{w.start}: {uncovered})"
            )
        world.stats["failback_checked"] += len(entries)

    def _stalled_ms(self, since_ms: int) -> int:
        """How much longer than usual the returned region's leader may take to act on what
        happened at `since_ms`: a stall that ended after it, and a lease for the next leader
        (`ShellParams.stall`; soak seed 69154255959: the move over a covered run waited out
        a stall that began after the release)."""
        stalled, since = self._stalled_until_ms, self._stall_began_ms
        if stalled is None or since is None or stalled + self._p.lease_ttl_ms < since_ms:
            return 0
        return stalled - since + self._p.lease_ttl_ms

    def _moved(self, region: str, name: str, start: int) -> None:
        """A sidecar's move or creation landed: in the returned region, a skip."""
        w = self._watched.get(name)
        if w is not None and region == self._returned:
            w.start = w.run_end = start - 1

    def _removals(self) -> None:
        """Stamp the messages no region had consumed before the return that the returned
        region's read stream removed (limits, a purge) before its application was delivered
        them, as the check first sees them gone (at the next message stored anywhere, or
        the next interval)."""
        a, read = self._returned, self._read
        if a is None or read is None:
            return
        world, first = self._world, read.first_seq
        if first <= self._first_seen:
            return
        stored = world.checks.ledger.stored[a]
        now = world.now_ms()
        for i in range(bisect_left(stored, self._first_seen, key=lambda e: e[0]), len(stored)):
            seq, data = stored[i]
            if seq >= first:
                break
            for w in self._watched.values():
                if data not in w.elsewhere and data not in w.consumed_by[a]:
                    w.removed_at[seq] = now
        self._first_seen = first

    def _paused(self, stream: str, name: str, until_ms: int | None) -> None:
        """A pause lands: the guard's (any but a move's) only in a region that returned."""
        world, w = self._world, self._watched.get(name)
        if w is None:
            return
        region = next(r for r in world.vs.regions if world.vs.read_stream(r) == stream)
        now = world.js.now_ms
        if until_ms is None:
            if self._held.pop((region, name), None) is not None:
                world.note(f"{name} released in {region}")
                w.released_ms = now
            return
        if until_ms - now == MOVE_PAUSE_MS:
            return
        if region != self._returned:
            raise world.fail(
                f"no healthy hold: {name} held in {region} for {until_ms - now} ms, "
                f"a region that did not return"
            )
        world.note(f"{name} held in {region} until {until_ms}")
        world.stats["holds"] += 1
        self._held[(region, name)] = (now, until_ms)
        if w.hold_landed_ms is None:
            w.hold_landed_ms = now

    def _holding(self) -> None:
        """Failback liveness: a hold ends within the window once sourcing resumed with every
        other region, and at its deadline whatever happens."""
        world, p = self._world, self._p
        now = world.now_ms()
        for (region, name), (since, until) in list(self._held.items()):
            if now >= until:
                del self._held[(region, name)]
                continue
            if now > since + p.hold_ms + 2 * p.interval_ms:
                raise world.fail(
                    f"failback expiry: {name} in {region} held since {since} ms, past its "
                    f"deadline of {p.hold_ms} ms"
                )
            caught_up = self._caught_up_ms
            stalled = self._stalled_until_ms
            if caught_up is None:
                continue
            # After a stall, a leader to lead after the stalled one: its lease lapses, the
            # next takes it and reads its first listing (`_adopt`) within a lease of the wake.
            led = caught_up if stalled is None else max(caught_up, stalled + p.lease_ttl_ms)
            if now > max(led, since) + p.release_window_ms:
                raise world.fail(
                    f"failback liveness: {name} in {region} held since {since} ms, though "
                    f"sourcing with every region resumed at {caught_up} ms"
                    + ("" if stalled is None else f" (its leader stalled until {stalled} ms)")
                )

    # ---- consumed in --------------------------------------------------------------------

    def _signs(self, machine: StreamMachine) -> dict[str, int | None]:
        """Per durable, when `machine` last took its own region's consumers' sign (its own
        clock)."""
        region = machine.config.region
        return {
            name: None if (sub := machine._subs.get(name)) is None else sub.consumed_ms.get(region)
            for name in self._watched
        }

    def _last_fetch(self, name: str, region: str) -> int | None:
        times = self._watched[name].fetched[region]
        return times[-1] if times else None

    def _consumed_since(self, name: str, region: str, since_ms: int) -> bool:
        times = self._watched[name].fetched[region]
        return bool(times) and times[-1] >= since_ms

    def _listed(
        self,
        machine: StreamMachine,
        leading: bool,
        signs: dict[str, int | None],
        out: list[Output],
        read_ms: int,
    ) -> None:
        world, region = self._world, machine.config.region
        now = world.now_ms()
        if (
            region == self._returned
            and leading
            and self._decided_ms is None
            and now >= self._back_ms
        ):
            self._decided_ms = now
            held = {o.subscription for o in out if isinstance(o, HoldConsumer)}
            for name, w in self._watched.items():
                w.hold_asked = name in held
            world.note(f"{region}'s guard decided: hold={sorted(held)}")
        self._signed(machine, signs)
        # As of when the read ended (`read_ms`), not when the machine took it in: a read
        # ended before a freeze reaches it only at the wake (`make soak` seed 215106356017:
        # the next read's acks, heard during the freeze, are consumption after it).
        self._listed_ms[machine] = min(now, read_ms) if read_ms else now

    def _signed(self, machine: StreamMachine, signs: dict[str, int | None]) -> None:
        """After an input that may take a durable's sign (`signs`: as they were before): one
        taken only over consumption of it there since the machine's previous positions
        read."""
        world, region = self._world, machine.config.region
        for name, taken in self._signs(machine).items():
            if taken is None or taken == signs[name]:
                continue  # none taken (a subscription deleted forgets its signs), or the same
            now, previous = world.now_ms(), self._listed_ms.get(machine, 0)
            if not self._consumed_since(name, region, previous - self._read_slack_ms):
                raise world.fail(
                    f"consumed in: {region}'s machine took its consumers' sign of {name} at "
                    f"{now} ms, none consumed there since its previous read at {previous} ms"
                )
            self._local_sign_ms[(machine, name)] = now

    def _update(self, region: str, update: Update) -> None:
        """An update lands: one saying its writer's consumers passed data, only after they
        did within the window before its writer's previous update (a sign taken after that
        update may rest on consumption a little before it: a move's outcome read back)."""
        name = update.subscription
        if name not in self._watched:
            return
        world, now = self._world, self._world.now_ms()
        previous = self._update_ms.get((region, name), 0)
        self._update_ms[(region, name)] = now
        if not update.consuming:
            return
        since = previous - 10 * self._p.interval_ms - self._read_slack_ms
        if not self._consumed_since(name, region, since):
            raise world.fail(
                f"consumed in: {region} sent an update saying it consumed {name}, none "
                f"consumed there within the window before its previous update at {previous} ms"
            )
        world.stats["consuming_updates"] += 1

    def _reports(self) -> None:
        """What every running machine reports consuming: backed by a sign within the window;
        and, two regions consuming at once after the return, both by every leader."""
        world, p = self._world, self._p
        now = world.now_ms()
        slack = 2 * p.interval_ms + self._read_slack_ms
        for s in world._sidecars:
            machine = s.driver.machine if s.driver is not None else None
            if not s.tasks or not s.port.net.awake.is_set() or machine is None:
                continue
            for name in self._watched:
                view = machine.subscription(name)
                if view is None:
                    continue
                # As of the machine's own clock: one just woken from a pause reports what
                # it knew when it last heard the clock, until its next tick (`make soak`
                # seed 55647414837: a replica woken after 3.6 s, one interval stale).
                since = min(now, machine._now) - machine.config.active_window_ms - slack
                for r in view.consumed_in:
                    signed = (
                        self._local_sign_ms.get((machine, name))
                        if r == s.region
                        else self._remote_sign_ms.get((machine, r, name))
                    )
                    if (signed is None or signed < since) and not self._consumed_since(
                        name, r, since
                    ):
                        raise world.fail(
                            f"consumed in: {s.name}-{s.starts} reports {r} consuming {name}, "
                            f"its last sign from there read at {signed} ms, the last "
                            f"consumption there at {self._last_fetch(name, r)} ms"
                        )
                self._both_reported(s.name, s.region, machine, name, view.consumed_in, now)

    def _both_reported(
        self,
        name: str,
        region: str,
        machine: StreamMachine,
        durable: str,
        reported: tuple[str, ...],
        now: int,
    ) -> None:
        """Two regions consuming `durable` at once after the return: a leader leading since
        before reports each region whose application consumed data no other region had (no
        move passed it) within the window, but the last `consumed_in_bound_ms`."""
        world, w, p = self._world, self._watched[durable], self._p
        if (
            not w.both
            or not machine.is_leader
            or w.released_ms is None
            or self._caught_up_ms is None
        ):
            return
        since = self._leading_since.get(machine)
        bound = self.consumed_in_bound_ms
        start = max(self._caught_up_ms, w.released_ms, since or now) + bound
        if self._stalled_until_ms is not None:
            # The returned region's stalled leader reports nothing, nor does its successor
            # before it leads (a lease after the wake at most).
            start = max(start, self._stalled_until_ms + p.lease_ttl_ms + bound)
        window = machine.config.active_window_ms
        for r in w.both:
            times = w.first[r]
            k = bisect_right(times, now - bound)
            if not k or times[k - 1] < max(start, now - window):
                continue
            world.stats["both_reported_checked"] += 1
            if r not in reported:
                raise world.fail(
                    f"consumed in: {name} in {region} does not report {r} consuming "
                    f"{durable}, its application consumed there at {times[k - 1]} ms"
                )
