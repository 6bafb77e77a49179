"""The properties the runtime's world checks as it goes, against the simulated JetStream as
it stands (no request: no fault, no delay)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.applied import Applied
from rsub_dev.sim.shell.coverage import CheckedIndex, Coverage
from rsub_dev.sim.shell.durables import Durable
from rsub_dev.sim.shell.ledger import DataId, Ledger
from rsub_dev.sim.shell.limits import Excuses, Removals
from rsub_dev.sim.shell.params import ShellParams, durable_names
from rsub_dev.simjs import ConsumerInfo, SimJetStream
from sidecar.naming import VirtualStream
from sidecar.nats.origin_log import data_entry
from sidecar.protocol import (
    Action,
    MachineConfig,
    Marker,
    MarkerIgnored,
    MarkerRejected,
    Output,
    PositionsListing,
    Snapshot,
    StreamMachine,
    SubscriptionAction,
    Update,
)


class Checks:
    def __init__(
        self,
        world: LoopWorld[ShellParams],
        vs: VirtualStream,
        js: SimJetStream,
        excuses: type[Excuses] = Excuses,
    ) -> None:
        self._world = world
        self._vs = vs
        self._js = js
        self.user_changes: Counter[str] = Counter()
        """Per region, how many times a user reset, deleted or created a durable there."""
        self.ledger = Ledger(vs, js)
        self.on_update: list[Callable[[str, Update], None]] = []
        """Told of every update a sidecar publishes, as it lands (`vector`)."""
        self.on_moved: list[Callable[[str, str, int], None]] = []
        """Told of every move or creation by a sidecar, as it lands (`moved`): region,
        durable, the sequence it delivers from."""
        self.removals = Removals(vs, js)
        self.twins: dict[DataId, DataId] = {}
        """Each copy of a message published twice with one `Nats-Msg-Id`: the other."""
        self.durables: list[Durable] = []
        """The run's replicated durables, the i-th first homed in region i modulo the
        regions, each with its own excuses (`limits`)."""
        for i, name in enumerate(durable_names(world.p.durables)):
            home = vs.regions[i % len(vs.regions)]
            consumed: Counter[DataId] = Counter()
            why = excuses(vs, js, self.ledger, consumed, self.removals, self.twins)
            self.durables.append(Durable(name, home, home, consumed, why))
        self._named = {d.name: d for d in self.durables}
        self.written: dict[str, list[int]] = {r: [] for r in vs.regions}
        """Per region, the sequences of the data messages its producers wrote, in order."""
        self.coverage = Coverage(world, self.written, self.durables)
        self.snapshot_started: dict[str, int] = {}
        """Per region, when the latest snapshot of it published started."""

    def durable(self, name: str) -> Durable:
        return self._named[name]

    def unconsumed(self, durable: Durable, data: DataId) -> bool:
        """Whether `data`'s logical message (a twin's copy counts) was never consumed from
        `durable`, and no excuse (`Excuses.why`) lets it be passed."""
        if durable.excuses.consumed(data):
            return False
        # How far each copy got, as of now: the interval's refresh (`reported`) may lag a
        # copy that passed a gap since and sent its vector (`make soak` seed 31537660956).
        for region in self.regions:
            durable.excuses.stood(region, self.standing(region, durable.name))
        why = durable.excuses.why(data)
        if why is None:
            return True
        self._world.stats["excused_" + why.split(" ", 1)[0]] += 1
        return False

    def note(self, what: str) -> None:
        self._world.note(what)

    @property
    def regions(self) -> tuple[str, ...]:
        return self._vs.regions

    def snapshot(self, region: str, snap: Snapshot) -> None:
        """Snapshot safety, as a sidecar publishes a completed snapshot of `region`: it names
        every other region x, and every data message at or below its position in x's read
        stream lies at or below its local position in `region`'s."""
        for x in self._vs.regions:
            if x == region:
                continue
            p = snap.positions.get(x)
            if p is None:
                raise self._world.fail(f"snapshot {snap.id} of {region} has no position for {x}")
            reach = self.ledger.reach(x, region, p)
            if reach is None:
                raise self._world.fail(
                    f"snapshot {snap.id}: data at or below {p} in {x} has not reached {region}"
                )
            if reach > snap.local_position:
                raise self._world.fail(
                    f"snapshot {snap.id}: data at or below {p} in {x} lies at {reach} in "
                    f"{region}, beyond the local position {snap.local_position}"
                )
        self._world.stats["snapshots_checked"] += 1
        started = self.snapshot_started.get(region, -1)
        self.snapshot_started[region] = max(started, snap.started_ms)

    def vector(self, region: str, update: Update) -> None:
        """Claim 1 (DESIGN §7), as a sidecar of `region` publishes an update with a progress
        vector v read at M: every data message (o, s), s <= v[o], that `region`'s read stream
        holds or will hold lies at or below M, and every one it dropped as a duplicate was
        dropped for a copy stored at or below M (docs/protocol.md §6, case 2)."""
        for published in self.on_update:
            published(region, update)
        if not update.progress:
            return
        m, name, progress = update.progress_position, update.subscription, dict(update.progress)
        last = self._js.stream(self._vs.read_stream(region)).last_seq
        if m > last:
            raise self._world.fail(f"claim 1: {region} read a vector at {m}, past its end {last}")
        for origin, seq in progress.items():
            if origin not in self._vs.regions:
                raise self._world.fail(f"claim 1: {region} sent progress for unknown {origin}")
            first = self.ledger.next_data(region, origin, m)
            if seq >= first:
                raise self._world.fail(
                    f"claim 1: {region} sent {name} progress {progress} read at {m}, but "
                    f"({origin}, {first}) lies above it in {region} (or has not reached it)"
                )
            stored_at = self.ledger.dropped_above(region, origin, seq, m)
            if stored_at is not None:
                raise self._world.fail(
                    f"case 2: {region} sent {name} progress {progress} read at {m}, covering "
                    f"a duplicate of {origin} it dropped for a copy stored at {stored_at}"
                )
        self._world.stats["vectors_checked"] += 1

    def moved(self, region: str, durable: str, start: int, how: str) -> None:
        """A sidecar moved or created `durable` in `region` to deliver from `start`: every
        data message below it, above where the durable had got, must have been consumed."""
        world, vs, d = self._world, self._vs, self.durable(durable)
        world.stats[f"{how}s"] += 1
        world.note(f"{region} {how} {durable} from {start}")
        stream = self._js.stream(vs.read_stream(region))
        reached = d.reached.get(region, 0)
        for msg in stream.matching(reached + 1, (vs.data_filter(),), start - 1):
            entry = data_entry(vs, msg.seq, msg.headers)
            if self.unconsumed(d, (entry.origin, entry.origin_seq)):
                raise world.fail(
                    f"moved over unconsumed data: {region} {how} {durable} from {start}, "
                    f"over {entry} never consumed"
                )
        d.reached[region] = max(reached, start - 1)
        d.excuses.stood(region, self.standing(region, durable))
        for landed in self.on_moved:
            landed(region, durable, start)

    def resetting(self, region: str, durable: str, start: int) -> None:
        """A reset of `durable` in `region` to deliver from `start` lands: it must not rewind
        what the consumer delivered (a client fetching meanwhile would be delivered it
        again, its acks unanswered), and must pass over at least one message it delivers
        (a reset over markers alone gains nothing and disturbs a consumer in use)."""
        world, vs = self._world, self._vs
        info = self.consumer(region, durable)
        assert info is not None, "a reset of a durable that is not there cannot land"
        reached = max(info.delivered.stream_seq, info.ack_floor.stream_seq)
        stream = self._js.stream(vs.read_stream(region))
        # Only what is still stored can be delivered again: a purge between the move's check
        # and its reset moves the consumer over what it removed (soak seed 479096479710: reset
        # to 50 after a purge had moved it to 108, all of 50..108 removed).
        if reached >= max(start, stream.first_seq):
            raise world.fail(
                f"rewound: {region} reset {durable} to {start}, it had delivered to {reached}"
            )
        if reached >= start:  # past it already, over removed messages only: a reset moot
            world.stats["resets_after_removals"] += 1
            return
        if next(stream.matching(reached + 1, (vs.data_filter(),), start - 1), None) is None:
            if self.ledger.removed_between(region, reached, start - 1, stream.first_seq):
                # Limits removed the data it passes since the runtime looked (under the
                # pause): the reset was worth it then.
                world.stats["resets_over_removed"] += 1
                return
            raise world.fail(
                f"over markers alone: {region} reset {durable} from {reached} to {start}"
            )

    def consumer(self, region: str, durable: str) -> ConsumerInfo | None:
        """The durable as the model holds it."""
        consumer = self._js.stream(self._vs.read_stream(region)).consumers.get(durable)
        return consumer.info(self._js.now_ms) if consumer is not None else None

    def standing(self, region: str, durable: str) -> int | None:
        """Where `durable` stands in `region`: its ack floor extended over what it never
        delivers (markers), or the stream's end with nothing pending (None: absent)."""
        info = self.consumer(region, durable)
        if info is None:
            return None
        stream = self._js.stream(self._vs.read_stream(region))
        floor = info.ack_floor.stream_seq
        after = next(stream.matching(floor + 1, (self._vs.data_filter(),)), None)
        return stream.last_seq if after is None else after.seq - 1

    def reported(self, machines: Iterable[tuple[str, str, StreamMachine, bool]]) -> None:
        """What every replica's machine answers for each durable (`mark_delete`, the API's
        answer), leader or follower, is never beyond where the durable stands; `machines`
        are (replica, region, machine, stale): a stale one (`Replica.stale`) read the
        durables before their user last changed them, and is excused."""
        for d in self.durables:
            for region in self.regions:
                d.excuses.stood(region, self.standing(region, d.name))
        for name, region, machine, stale in machines:
            if stale:
                continue
            for d in self.durables:
                view = machine.subscription(d.name)
                if view is None or not view.exists or view.mark_delete is None:
                    continue
                standing = self.standing(region, d.name)
                if standing is None or view.mark_delete > standing:
                    raise self._world.fail(
                        f"reported: {name} reports {d.name} at {view.mark_delete}, it stands "
                        f"at {standing}"
                    )

    def behind_home(self, durable: Durable, region: str) -> int | None:
        """Where `durable` stands in `region` when the next data message above it there
        lies at or below where it stands in its home (its home's progress covers it: a
        vector must move it); None otherwise."""
        home = durable.home
        standing, at_home = self.standing(region, durable.name), self.standing(home, durable.name)
        if standing is None or at_home is None:
            return None
        stream = self._js.stream(self._vs.read_stream(region))
        after = next(stream.matching(standing + 1, (self._vs.data_filter(),)), None)
        if after is None:
            return None
        entry = data_entry(self._vs, after.seq, after.headers)
        # That very copy stored in the home: one the home dropped as a twin's duplicate is
        # covered by its vectors only once its origin writes again (case 2).
        there = self.ledger.stored_at(home, (entry.origin, entry.origin_seq))
        return standing if there is not None and there <= at_home else None

    def no_loss(self, durable: Durable) -> None:
        """Every data message `durable` has passed in its home, where it is consumed now, was
        consumed (what lies after it, it delivers next)."""
        self._js.settle()
        home, name = durable.home, durable.name
        info = self.consumer(home, name)
        if info is None:
            raise self._world.fail(f"loss: {name} is not there in {home}, its home now")
        vs = self._vs
        passed = info.ack_floor.stream_seq
        for msg in self._js.stream(vs.read_stream(home)).matching(1, (vs.data_filter(),), passed):
            entry = data_entry(vs, msg.seq, msg.headers)
            if self.unconsumed(durable, (entry.origin, entry.origin_seq)):
                raise self._world.fail(f"loss: {entry} of {name} in {home} never consumed")


class Fencing:
    """Fencing (docs/protocol.md §2), for one incarnation of one sidecar replica (`name`): a
    marker whose epoch is below one its writer's region already wrote, as fed to it, changes
    nothing (no action, nothing applied); once fed a marker its own region wrote with a newer
    epoch than its own, it publishes no marker of its old epoch again, nor moves or creates a
    consumer while its machine still has that epoch."""

    def __init__(self, world: LoopWorld[ShellParams], name: str, region: str) -> None:
        self._world = world
        self._name = name
        self._region = region
        self._seen: dict[str, int] = {}
        self.deposed: int | None = None
        """Its epoch when it was fed its region's newer one."""

    def fed(self, machine: StreamMachine, marker: Marker, outputs: list[Output]) -> None:
        seen = self._seen.get(marker.region, 0)
        if marker.epoch < seen:
            acted = [o for o in outputs if not isinstance(o, MarkerIgnored | MarkerRejected)]
            if acted:
                raise self._world.fail(
                    f"fencing: {self._name} acted on a marker of {marker.region} with epoch "
                    f"{marker.epoch} after {marker.region} wrote with epoch {seen}: {acted[0]}"
                )
        self._seen[marker.region] = max(seen, marker.epoch)
        newer = marker.region == self._region and machine.epoch < marker.epoch
        if newer and (self.deposed is None or machine.epoch > self.deposed):
            self.deposed = machine.epoch
            self._world.stats["deposed"] += 1

    def asked(self, machine: StreamMachine, outputs: list[Output]) -> None:
        """What its machine asks for after an input: nothing to publish or move once it was
        fed its region's newer epoch (while it still has its old one)."""
        if self.deposed is None or machine.epoch > self.deposed:
            return
        action = next((o for o in outputs if isinstance(o, Action)), None)
        if action is not None:
            raise self._world.fail(
                f"fencing: {self._name} asks for {type(action).__name__} with epoch "
                f"{machine.epoch} after it read its region's newer epoch"
            )

    def moving(self, epoch: int, what: str) -> None:
        """It starts moving or creating a consumer (`what`) with its machine at `epoch`
        (checked as the request goes out)."""
        if self.deposed is not None and epoch <= self.deposed:
            raise self._world.fail(
                f"fencing: {self._name} {what} with epoch {epoch} after it read its region's "
                f"newer epoch"
            )

    def publishing(self, marker: Marker) -> None:
        """It starts publishing `marker` (checked as the request goes out)."""
        if self.deposed is not None and marker.epoch <= self.deposed:
            raise self._world.fail(
                f"fencing: {self._name} publishes with epoch {marker.epoch} after it read its "
                f"region's newer epoch: {type(marker.body).__name__}"
            )


class Replica:
    """The checks of one incarnation of one sidecar replica (`name`) of `region`: fencing
    (`Fencing`), retried, and how current its machine's view of the user's changes is."""

    def __init__(
        self, world: LoopWorld[ShellParams], checks: Checks, name: str, region: str
    ) -> None:
        self.fencing = Fencing(world, name, region)
        self.applied = Applied(world, checks, name, region)
        self.name = name
        self.world = world
        self.checks = checks
        self.region = region
        self._world = world
        self._checks = checks
        self._name = name
        self._region = region
        self.listed = 0
        """The user's changes in its region (`Checks.user_changes`) as the last listing of
        its consumers that landed saw them."""
        self._applied = 0
        """... as the listing its machine last took the subscriptions from saw them."""
        self._owed: dict[str, tuple[SubscriptionAction, int, int]] = {}
        """Per subscription: a move or creation told failed, the user's changes then, and
        the current reads its machine applied since without asking for it again."""
        self.updated: set[str] = set()
        """The subscriptions an update fed to its machine named."""

    def stale(self) -> bool:
        """Whether the user changed a durable in its region since its machine last read
        them: what it reports may be above a copy reset back, or name one deleted."""
        return self._checks.user_changes[self._region] > self._applied

    def asked(self, machine: StreamMachine, outputs: list[Output]) -> None:
        self.fencing.asked(machine, outputs)
        self._checks.coverage.accepted(self._region, machine, outputs, self._checks.unconsumed)
        changes = self._checks.user_changes[self._region]
        self.applied.asked(machine, outputs, min(changes, self._applied))
        for o in outputs:
            if isinstance(o, SubscriptionAction):
                self._owed.pop(o.subscription, None)

    def failed(self, machine: StreamMachine, action: SubscriptionAction) -> None:
        """Its machine was told `action` failed: owed, while it leads."""
        self.applied.failed(action.subscription)
        if machine.is_leader:
            changes = self._checks.user_changes[self._region]
            self._owed[action.subscription] = (action, min(changes, self._applied), 0)

    def listed_applied(
        self, machine: StreamMachine, listing: PositionsListing, current: bool
    ) -> None:
        """Retried: a move or creation told failed is asked for again by the second current
        positions read (one begun after every creation asked for) its machine applies since,
        unless the copy got there by itself (a reply lost), its user changed a durable in
        its region since (the machine then forgets one deleted: the next update creates it
        again), or it no longer leads."""
        self.applied.read(machine, current)
        if not current:
            return
        self._applied = self.listed
        if not machine.is_leader:
            self._owed.clear()
            return
        for name, (action, changes, reads) in list(self._owed.items()):
            standing = self._checks.standing(self._region, name)
            if (standing is not None and standing >= action.ack_floor) or self._checks.user_changes[
                self._region
            ] > changes:
                del self._owed[name]
            elif reads + 1 < 2:
                self._owed[name] = (action, changes, reads + 1)
            else:
                self._world.stats["retries_missed"] += 1
                raise self._world.fail(
                    f"retried: {self._name} was told {action} failed and has not asked for it "
                    f"again in two reads (it stands at {standing})"
                )


_INPUTS = ("tick", "marker_seen", "positions_listed", "action_done", "action_failed")
"""The machine's methods every input of the runtime goes through (the driver posts some
unbound, `StreamMachine.interval` and `marker_read`, which call these on the machine)."""


def checked(factory: type[StreamMachine], replica: Replica) -> type[StreamMachine]:
    """`factory`'s machines, checked after every input: each decoded marker they are fed
    (`Fencing.fed`), what they ask for (`Replica.asked`), the failures they are told of and
    the reads they apply (retried)."""

    def wrap(name: str) -> Callable[..., list[Output]]:
        method = getattr(factory, name)

        def inputs(machine: StreamMachine, *args: Any, **kwargs: Any) -> list[Output]:
            listing = args[0] if name == "positions_listed" else None
            current = listing is not None and listing.generation == machine.generation
            outputs: list[Output] = method(machine, *args, **kwargs)
            if name == "marker_seen":
                replica.fencing.fed(machine, args[1], outputs)
                if isinstance(args[1].body, Update):
                    replica.updated.add(args[1].body.subscription)
            replica.asked(machine, outputs)
            if name == "action_failed":
                replica.failed(machine, args[0])
            if listing is not None:
                replica.listed_applied(machine, listing, current)
            return outputs

        return inputs

    def init(machine: StreamMachine, config: MachineConfig) -> None:
        factory.__init__(machine, config)
        # Fed data through its index, whatever input feeds it (not data).
        machine._index = CheckedIndex(replica.world, replica.checks.ledger, replica.region)

    methods: dict[str, Any] = {n: wrap(n) for n in _INPUTS}
    return type(f"Checked{factory.__name__}", (factory,), methods | {"__init__": init})
