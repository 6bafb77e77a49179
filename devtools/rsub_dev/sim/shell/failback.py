"""The failback guard (docs/protocol.md §7) and a subscription consumed in two regions (§8)
in the runtime's world.

A returning region (`ShellParams.failback_ms`): the home region `a`, lost at `failover_ms`,
comes back (`SimJetStream.restart`: its servers with what they stored, its streams under new
leaders, each of its sources (its own region's included) resuming only `reconnect_ms` and up to
2 s later), its sidecars start again and its application consumes at once; the one in the
region it failed over to stops, or goes on (`both_consume`); with `silent`, the third
region is cut off from then on and never answers.

Checked as it goes (`Failback`):

- failback safety, at every fetch in `a` once back: it is never delivered a message another
  region consumed before `a` returned, but for what docs/protocol.md §7 leaves: until the
  first positions read of `a`'s new leader has decided and its hold landed (the hold starts
  at that read), and a message after one no region had consumed (`position_for` stops at the
  first uncovered one; the next move over the run after it waits for a read);
- no healthy hold, as a pause lands: the guard's pause (any but a move's) lands only in a
  region that returned;
- failback liveness, every interval: `a`'s durable is not held longer than
  `failback_window_ms` after sourcing between `a` and every other region resumed (and the
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
from bisect import bisect_right
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from rsub_dev.sim.outcome import Violation
from rsub_dev.sim.shell.ledger import DataId
from rsub_dev.sim.shell.params import DURABLE, MOVE_PAUSE_MS, ShellParams
from rsub_dev.simjs import Delivery
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
    from rsub_dev.sim.shell.world import ShellWorld


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
        self._elsewhere: set[DataId] = set()
        """What regions other than the returned one consumed before it returned."""
        self._consumed_by: dict[str, set[DataId]] = defaultdict(set)
        self._fetched: dict[str, list[int]] = defaultdict(list)
        """Per region, when its application was delivered data."""
        self._first: dict[str, list[int]] = defaultdict(list)
        """Per region, when its application was delivered data no other region had consumed
        (no move can have passed it: only consumption there did)."""
        self._decided_ms: int | None = None
        """When the returned region's new leader applied its first positions read."""
        self._hold_asked = False
        self._held: dict[str, tuple[int, int]] = {}
        """Per region, the guard's pause that stands (since, until)."""
        self._hold_landed_ms: int | None = None
        self._released_ms: int | None = None
        self._caught_up_ms: int | None = None
        """When sourcing between the returned region and every other region resumed (None:
        not all of them will)."""
        self._from: int | None = None
        self._last_delivered: int | None = None
        self._uncovered_at: dict[int, int] = {}
        """In the returned region once the guard settled: when each message no region had
        consumed before the return was delivered (by its sequence there)."""
        self._listed_ms: dict[StreamMachine, int] = {}
        """Per machine, when it last applied a positions read."""
        self._local_sign_ms: dict[StreamMachine, int] = {}
        self._remote_sign_ms: dict[tuple[StreamMachine, str], int] = {}
        self._leading_since: dict[StreamMachine, int] = {}
        self._update_ms: dict[str, int] = {}
        """Per region, when its last update of the durable landed."""
        self._tasks: list[asyncio.Task[Any]] = []

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
                leading, sign = self.is_leader, checks._sign(self)
                out: list[Output] = super().positions_listed(listing)
                checks._listed(self, leading, sign, out)
                return out

            def action_done(
                self, action: SubscriptionAction, mark_delete: int, done_ms: int = 0
            ) -> list[Output]:
                sign = checks._sign(self)
                out: list[Output] = super().action_done(action, mark_delete, done_ms)
                checks._signed(self, sign)
                return out

            def marker_seen(self, read_seq: int, marker: Marker) -> list[Output]:
                out: list[Output] = super().marker_seen(read_seq, marker)
                body = marker.body
                if (
                    not Observed._restoring
                    and isinstance(body, Update)
                    and body.subscription == DURABLE
                    and body.consuming
                    and marker.region != self.config.region
                ):
                    checks._remote_sign_ms[(self, marker.region)] = checks._world.now_ms()
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

    def checking(self) -> None:
        """The checks of every interval (the world's, the model settled)."""
        self._reports()
        self._holding()

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
        self._elsewhere = set().union(*(self._consumed_by[r] for r in others))
        world.js.faults.clear()  # calm from here: no failing request
        if p.silent:
            silent = world.vs.regions[2]
            world.note(f"{silent} cut off for good")
            world.js.partition(silent)
        world.js.restart(a, reconnect)
        self._returned, self._back_ms = a, world.now_ms()
        if not p.silent:
            self._caught_up_ms = self._back_ms + max(reconnect[r] for r in others)
        world.note(f"{a} back (sourcing resumes after {reconnect})")
        world.stats["returns"] += 1
        world._live.add(a)
        apps = world.apps
        if p.both_consume:
            self._tasks.append(loop.create_task(apps.consume(a, p.run_ms, keep=lambda: True)))
        else:
            world._home = a
            self._tasks.append(loop.create_task(apps.consume(a, p.run_ms)))
        self._tasks.append(loop.create_task(self._producing(a, max(reconnect.values()))))
        for sidecar in world._sidecars:
            if sidecar.region == a:
                await world._start(sidecar)
        # A healthy region's sidecars restart meanwhile: they hold nothing, and rebuilt from
        # their read stream report no region consuming that stopped long ago.
        healthy = world.vs.regions[-1]
        for sidecar in world._sidecars:
            if sidecar.region == healthy:
                world.note(f"{sidecar.name} restarts")
                await sidecar.stop()
                await world._start(sidecar)

    async def _producing(self, region: str, reconnect_ms: int) -> None:
        """The returned region's producers: at once, or once every source there reconnected
        (`quiet_return`)."""
        world, p = self._world, self._p
        if p.quiet_return and await world.until(self._back_ms + reconnect_ms):
            return
        await world.apps.produce(region, p.produce_until_ms)

    # ---- failback safety and the holds ----------------------------------------------------

    def _settled(self) -> bool:
        """Whether the guard decided, and its hold (if it asked for one) landed."""
        return self._decided_ms is not None and (
            not self._hold_asked or self._hold_landed_ms is not None
        )

    def _finished(self, region: str) -> None:
        """A slow worker consumed a message fetched before: consumption there now."""
        self._fetched[region].append(self._world.now_ms())

    def _delivered(self, region: str, deliveries: list[Delivery]) -> None:
        world, vs = self._world, self._world.vs
        now = world.now_ms()
        self._fetched[region].append(now)
        entries = [(d.stream_seq, data_entry(vs, d.stream_seq, d.headers)) for d in deliveries]
        ids = [(e.origin, e.origin_seq) for _, e in entries]
        others = [self._consumed_by[r] for r in vs.regions if r != region]
        if any(all(i not in seen for seen in others) for i in ids):
            self._first[region].append(now)
        self._consumed_by[region].update(ids)
        if region != self._returned or not self._settled():
            return
        stream = world.js.stream(vs.read_stream(region))
        first = deliveries[0].stream_seq
        last = self._last_delivered
        if (
            last is None
            or self._from is None
            or next(stream.matching(last + 1, (vs.data_filter(),), first - 1), None) is not None
        ):
            self._from = first - 1  # the first after the guard, or after a move skipped data
        self._last_delivered = deliveries[-1].stream_seq
        for seq, entry in entries:
            data = (entry.origin, entry.origin_seq)
            if data not in self._elsewhere:
                self._uncovered_at[seq] = now
                continue
            # The last message before it since the durable's last skip that no region had
            # consumed: the move over what follows it waits for the read after its ack.
            uncovered = max((u for u in self._uncovered_at if self._from < u < seq), default=None)
            if uncovered is not None and now - self._uncovered_at[uncovered] <= self._move_ms:
                world.stats["failback_after_uncovered"] += 1
                continue
            raise world.fail(
                f"failback safety: {region} delivered {data} at {seq}, consumed elsewhere "
                f"before {region} returned at {self._back_ms} ms (guard decided at "
                f"{self._decided_ms} ms, held {self._hold_landed_ms}, released "
                f"{self._released_ms}; the last message consumed nowhere before it, since "
                f"{self._from}: {uncovered})"
            )
        world.stats["failback_checked"] += len(entries)

    def _paused(self, stream: str, name: str, until_ms: int | None) -> None:
        """A pause lands: the guard's (any but a move's) only in a region that returned."""
        world = self._world
        if name != DURABLE:
            return
        region = next(r for r in world.vs.regions if world.vs.read_stream(r) == stream)
        now = world.js.now_ms
        if until_ms is None:
            if self._held.pop(region, None) is not None:
                world.note(f"{DURABLE} released in {region}")
                self._released_ms = now
            return
        if until_ms - now == MOVE_PAUSE_MS:
            return
        if region != self._returned:
            raise world.fail(
                f"no healthy hold: {DURABLE} held in {region} for {until_ms - now} ms, "
                f"a region that did not return"
            )
        world.note(f"{DURABLE} held in {region} until {until_ms}")
        world.stats["holds"] += 1
        self._held[region] = (now, until_ms)
        if self._hold_landed_ms is None:
            self._hold_landed_ms = now

    def _holding(self) -> None:
        """Failback liveness: a hold ends within the window once sourcing resumed with every
        other region, and at its deadline whatever happens."""
        world, p = self._world, self._p
        now = world.now_ms()
        for region, (since, until) in list(self._held.items()):
            if now >= until:
                del self._held[region]
                continue
            if now > since + p.hold_ms + 2 * p.interval_ms:
                raise world.fail(
                    f"failback expiry: {DURABLE} in {region} held since {since} ms, past its "
                    f"deadline of {p.hold_ms} ms"
                )
            caught_up = self._caught_up_ms
            if caught_up is not None and now > max(caught_up, since) + p.failback_window_ms:
                raise world.fail(
                    f"failback liveness: {DURABLE} in {region} held since {since} ms, though "
                    f"sourcing with every region resumed at {caught_up} ms"
                )

    # ---- consumed in --------------------------------------------------------------------

    def _sign(self, machine: StreamMachine) -> int | None:
        """When `machine` last took its own region's consumers' sign (its own clock)."""
        sub = machine._subs.get(DURABLE)
        return None if sub is None else sub.consumed_ms.get(machine.config.region)

    def _last_fetch(self, region: str) -> int | None:
        times = self._fetched[region]
        return times[-1] if times else None

    def _consumed_since(self, region: str, since_ms: int) -> bool:
        times = self._fetched[region]
        return bool(times) and times[-1] >= since_ms

    def _listed(
        self, machine: StreamMachine, leading: bool, sign: int | None, out: list[Output]
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
            self._hold_asked = any(isinstance(o, HoldConsumer) for o in out)
            world.note(f"{region}'s guard decided: hold={self._hold_asked}")
        self._signed(machine, sign)
        self._listed_ms[machine] = now

    def _signed(self, machine: StreamMachine, sign: int | None) -> None:
        """After an input that may take the sign (`sign`: as it was before): one taken only
        over consumption there since the machine's previous positions read."""
        world, region = self._world, machine.config.region
        taken = self._sign(machine)
        if taken is None or taken == sign:
            return  # none taken (a subscription deleted forgets its signs), or the same
        now, previous = world.now_ms(), self._listed_ms.get(machine, 0)
        if not self._consumed_since(region, previous - self._read_slack_ms):
            raise world.fail(
                f"consumed in: {region}'s machine took its consumers' sign at {now} ms, none "
                f"consumed there since its previous read at {previous} ms"
            )
        self._local_sign_ms[machine] = now

    def _update(self, region: str, update: Update) -> None:
        """An update lands: one saying its writer's consumers passed data, only after they
        did within the window before its writer's previous update (a sign taken after that
        update may rest on consumption a little before it: a move's outcome read back)."""
        if update.subscription != DURABLE:
            return
        world, now = self._world, self._world.now_ms()
        previous = self._update_ms.get(region, 0)
        self._update_ms[region] = now
        if not update.consuming:
            return
        since = previous - 10 * self._p.interval_ms - self._read_slack_ms
        if not self._consumed_since(region, since):
            raise world.fail(
                f"consumed in: {region} sent an update saying it consumed {DURABLE}, none "
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
            view = machine.subscription(DURABLE)
            if view is None:
                continue
            window = machine.config.active_window_ms
            since = now - window - slack
            for r in view.consumed_in:
                signed = (
                    self._local_sign_ms.get(machine)
                    if r == s.region
                    else self._remote_sign_ms.get((machine, r))
                )
                if (signed is None or signed < since) and not self._consumed_since(r, since):
                    raise world.fail(
                        f"consumed in: {s.name}-{s.starts} reports {r} consuming {DURABLE}, "
                        f"its last sign from there read at {signed} ms, the last consumption "
                        f"there at {self._last_fetch(r)} ms"
                    )
            self._both_reported(s.name, s.region, machine, view.consumed_in, now)

    def _both_reported(
        self, name: str, region: str, machine: StreamMachine, reported: tuple[str, ...], now: int
    ) -> None:
        """Two regions consuming at once after the return: a leader leading since before
        reports each region whose application consumed data no other region had (no move
        passed it) within the window, but the last `consumed_in_bound_ms`."""
        world, p = self._world, self._p
        if (
            not p.both_consume
            or not machine.is_leader
            or self._released_ms is None
            or self._caught_up_ms is None
        ):
            return
        since = self._leading_since.get(machine)
        bound = self.consumed_in_bound_ms
        start = max(self._caught_up_ms, self._released_ms, since or now) + bound
        window = machine.config.active_window_ms
        for r in (world.vs.regions[0], world.vs.regions[1]):
            times = self._first[r]
            k = bisect_right(times, now - bound)
            if not k or times[k - 1] < max(start, now - window):
                continue
            world.stats["both_reported_checked"] += 1
            if r not in reported:
                raise world.fail(
                    f"consumed in: {name} in {region} does not report {r} consuming, its "
                    f"application consumed there at {times[k - 1]} ms"
                )
