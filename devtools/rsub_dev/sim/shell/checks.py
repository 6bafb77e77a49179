"""The properties the runtime's world checks as it goes, against the simulated JetStream as
it stands (no request: no fault, no delay)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.ledger import Ledger
from rsub_dev.sim.shell.params import DURABLE, ShellParams
from rsub_dev.simjs import ConsumerInfo, SimJetStream
from sidecar.naming import VirtualStream
from sidecar.nats.origin_log import data_entry
from sidecar.protocol import (
    Action,
    Marker,
    MarkerIgnored,
    MarkerRejected,
    Output,
    Snapshot,
    StreamMachine,
    Update,
)


class Checks:
    def __init__(self, world: LoopWorld[ShellParams], vs: VirtualStream, js: SimJetStream) -> None:
        self._world = world
        self._vs = vs
        self._js = js
        self.consumed: Counter[tuple[str, int]] = Counter()
        """How many times each data message (its origin and origin sequence) was consumed."""
        self._reached: dict[str, int] = {}
        self.ledger = Ledger(vs, js)

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

    def vector(self, region: str, update: Update) -> None:
        """Claim 1 (DESIGN §7), as a sidecar of `region` publishes an update with a progress
        vector v read at M: every data message (o, s), s <= v[o], that `region`'s read stream
        holds or will hold lies at or below M, and every one it dropped as a duplicate was
        dropped for a copy stored at or below M (docs/protocol.md §6, case 2)."""
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
        world, vs = self._world, self._vs
        world.stats[f"{how}s"] += 1
        world.note(f"{region} {how} {durable} from {start}")
        stream = self._js.stream(vs.read_stream(region))
        reached = self._reached.get(region, 0)
        for msg in stream.matching(reached + 1, (vs.data_filter(),), start - 1):
            entry = data_entry(vs, msg.seq, msg.headers)
            if self.consumed[(entry.origin, entry.origin_seq)] == 0:
                raise world.fail(
                    f"moved over unconsumed data: {region} {how} {durable} from {start}, "
                    f"over {entry} never consumed"
                )
        self._reached[region] = max(reached, start - 1)

    def resetting(self, region: str, durable: str, start: int) -> None:
        """A reset of `durable` in `region` to deliver from `start` lands: it must not rewind
        what the consumer delivered (a client fetching meanwhile would be delivered it
        again, its acks unanswered), and must pass over at least one message it delivers
        (a reset over markers alone gains nothing and disturbs a consumer in use)."""
        world, vs = self._world, self._vs
        info = self.consumer(region, durable)
        assert info is not None, "a reset of a durable that is not there cannot land"
        reached = max(info.delivered.stream_seq, info.ack_floor.stream_seq)
        if reached > start - 1:
            raise world.fail(
                f"rewound: {region} reset {durable} to {start}, it had delivered to {reached}"
            )
        stream = self._js.stream(vs.read_stream(region))
        if next(stream.matching(reached + 1, (vs.data_filter(),), start - 1), None) is None:
            raise world.fail(
                f"over markers alone: {region} reset {durable} from {reached} to {start}"
            )

    def consumer(self, region: str, durable: str) -> ConsumerInfo | None:
        """The durable as the model holds it."""
        consumer = self._js.stream(self._vs.read_stream(region)).consumers.get(durable)
        return consumer.info(self._js.now_ms) if consumer is not None else None

    def _standing(self, region: str) -> int | None:
        """Where the durable stands in `region`: its ack floor extended over what it never
        delivers (markers), or the stream's end with nothing pending (None: absent)."""
        info = self.consumer(region, DURABLE)
        if info is None:
            return None
        stream = self._js.stream(self._vs.read_stream(region))
        floor = info.ack_floor.stream_seq
        after = next(stream.matching(floor + 1, (self._vs.data_filter(),)), None)
        return stream.last_seq if after is None else after.seq - 1

    def reported(self, machines: Iterable[tuple[str, str, StreamMachine]]) -> None:
        """What every replica's machine answers for the durable (`mark_delete`, the API's
        answer), leader or follower, is never beyond where the durable stands; `machines`
        are (replica, region, machine)."""
        for name, region, machine in machines:
            view = machine.subscription(DURABLE)
            if view is None or not view.exists or view.mark_delete is None:
                continue
            standing = self._standing(region)
            if standing is None or view.mark_delete > standing:
                raise self._world.fail(
                    f"reported: {name} reports {DURABLE} at {view.mark_delete}, it stands at "
                    f"{standing}"
                )

    def no_loss(self, home: str) -> None:
        """Every data message the durable has passed in `home`, where it is consumed now, was
        consumed (what lies after it, it delivers next)."""
        self._js.settle()
        info = self.consumer(home, DURABLE)
        if info is None:
            raise self._world.fail(f"loss: {DURABLE} is not there in {home}, its home now")
        vs = self._vs
        passed = info.ack_floor.stream_seq
        for msg in self._js.stream(vs.read_stream(home)).matching(1, (vs.data_filter(),), passed):
            entry = data_entry(vs, msg.seq, msg.headers)
            if not self.consumed[(entry.origin, entry.origin_seq)]:
                raise self._world.fail(f"loss: {entry} in {home} never consumed")


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


_INPUTS = ("tick", "marker_seen", "positions_listed", "action_done", "action_failed")
"""The machine's methods every input of the runtime goes through (the driver posts some
unbound, `StreamMachine.interval` and `marker_read`, which call these on the machine)."""


def fenced(factory: type[StreamMachine], fencing: Fencing) -> type[StreamMachine]:
    """`factory`'s machines, each decoded marker they are fed checked (`Fencing.fed`), and
    what they ask for after every input (`Fencing.asked`)."""

    def wrap(name: str) -> Callable[..., list[Output]]:
        method = getattr(factory, name)

        def checked(machine: StreamMachine, *args: Any, **kwargs: Any) -> list[Output]:
            outputs: list[Output] = method(machine, *args, **kwargs)
            if name == "marker_seen":
                fencing.fed(machine, args[1], outputs)
            fencing.asked(machine, outputs)
            return outputs

        return checked

    return type(f"Fenced{factory.__name__}", (factory,), {n: wrap(n) for n in _INPUTS})
