"""The applications of the runtime's world: producers publishing in every region and the
consumer of each replicated durable in its home region, straight on the simulated JetStream
(not through a sidecar's port: no fault, no delay), acks signalled as the server does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.js.errors import NotFoundError, ServiceUnavailableError

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.port import SimNet
from rsub_dev.sim.shell.checks import Checks
from rsub_dev.sim.shell.durables import Durable
from rsub_dev.sim.shell.params import ShellParams
from rsub_dev.simjs import ConsumerConfig, Delivery
from sidecar.naming import VirtualStream
from sidecar.nats.consumers import REPLICATE_KEY
from sidecar.nats.origin_log import data_entry


class Applications:
    def __init__(
        self,
        world: LoopWorld[ShellParams],
        vs: VirtualStream,
        net: SimNet,
        checks: Checks,
        live: Callable[[str], bool],
    ) -> None:
        self._world = world
        self._vs = vs
        self._net = net
        self._js = net.js
        self._checks = checks
        self._live = live
        self.on_fetched: list[Callable[[Durable, str, list[Delivery]], None]] = []
        """Told of every fetch that delivered, before its acks: the durable, the region, the
        deliveries."""
        self.on_finished: list[Callable[[Durable, str], None]] = []
        """Told of every message a slow worker finished (consumed) after its fetch: the
        durable, the region."""
        self._sent: dict[str, int] = dict.fromkeys(vs.regions, 0)
        """Per region, the messages its producers sent: a producer started again (a region
        back) goes on numbering its `Nats-Msg-Id`s, as a real one would not repeat them."""

    async def produce(self, region: str, until_ms: int) -> None:
        world, p = self._world, self._world.p
        while world.now_ms() < until_ms:
            await asyncio.sleep(world.rng.randint(1, 2 * p.produce_gap_ms) / 1000)
            if not self._live(region):
                return
            self._sent[region] += 1
            msg_id = f"{region}-{self._sent[region]}"
            subject = self._vs.publish_subject(region, "x")
            ack = self._js.publish(subject, msg_id.encode(), {"Nats-Msg-Id": msg_id})
            self._checks.written[region].append(ack.seq)
            world.stats["published"] += 1
            if p.twins and world.rng.random() < p.twins:
                self._twin(region, ack.seq, msg_id)

    def _twin(self, region: str, seq: int, msg_id: str) -> None:
        """The producer publishes the message again in another live region, with the same
        `Nats-Msg-Id` (a twin)."""
        world = self._world
        others = [r for r in self._vs.regions if r != region and self._live(r)]
        if not others:
            return
        other = world.rng.choice(others)
        subject = self._vs.publish_subject(other, "x")
        ack = self._js.publish(subject, msg_id.encode(), {"Nats-Msg-Id": msg_id})
        self._checks.written[other].append(ack.seq)
        self._checks.twins[(region, seq)] = (other, ack.seq)
        self._checks.twins[(other, ack.seq)] = (region, seq)
        world.stats["twins"] += 1

    def create_durable(self, durable: Durable, region: str) -> None:
        read, name = self._vs.read_stream(region), durable.name
        config = ConsumerConfig(name, (self._vs.data_filter(),), metadata={REPLICATE_KEY: "true"})
        with self._js.faults.suspended():
            self._js.consumer_create(read, config)
        self._net.signal(f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{read}.{name}")

    def replay(self, durable: Durable, region: str) -> None:
        """Its user resets `durable` in `region` backwards, from anywhere between the
        stream's first message and the durable's ack floor (a replay)."""
        world, js, name = self._world, self._js, durable.name
        js.settle()
        consumer = js.stream(self._vs.read_stream(region)).consumers.get(name)
        if consumer is None:
            return
        info = consumer.info(js.now_ms)
        first = js.stream(self._vs.read_stream(region)).first_seq
        config = consumer.config
        if config.deliver_policy == "by_start_sequence" and config.opt_start_seq > first:
            # A copy a sidecar created starts at a sequence: JetStream refuses a reset below
            # it, so its user's replay goes no lower (none when it acked nothing past it).
            if config.opt_start_seq > info.ack_floor.stream_seq:
                return
            first = config.opt_start_seq
        seq = world.rng.randint(first, max(first, info.ack_floor.stream_seq))
        with js.faults.suspended():
            js.consumer_reset(self._vs.read_stream(region), name, seq)
        self._checks.user_changes[region] += 1
        world.stats["user_resets"] += 1
        world.note(f"user resets {name} in {region} to {seq}")

    async def delete(self, durable: Durable, region: str) -> None:
        """Its user deletes `durable` in `region`; in its home, creates it again (delivering
        all) a while later, unless a sidecar did first."""
        world, js, read, name = self._world, self._js, self._vs.read_stream(region), durable.name
        js.settle()
        if name not in js.stream(read).consumers:
            return
        with js.faults.suspended():
            js.consumer_delete(read, name)
        self._net.signal(f"$JS.EVENT.ADVISORY.CONSUMER.DELETED.{read}.{name}")
        self._checks.user_changes[region] += 1
        world.stats["user_deletions"] += 1
        world.note(f"user deletes {name} in {region}")
        durable.deleted.add(region)
        if region != durable.home:
            return
        await asyncio.sleep(world.rng.randint(50, 1_000) / 1000)
        self.recreate(durable, region)

    def recreate(self, durable: Durable, region: str, *, deleted: bool = True) -> None:
        """In `durable`'s home: the user creates it again (delivering all) if they deleted
        it there (or whatever happened: `deleted=False`) and no sidecar created it since."""
        world, js, read, name = self._world, self._js, self._vs.read_stream(region), durable.name
        js.settle()
        if (deleted and region not in durable.deleted) or not self._live(region):
            return
        durable.deleted.discard(region)
        if name in js.stream(read).consumers:
            return
        self.create_durable(durable, region)
        self._checks.user_changes[region] += 1
        world.stats["user_creations"] += 1
        world.note(f"user creates {name} in {region}")

    async def consume(
        self, durable: Durable, region: str, until_ms: int, keep: Callable[[], bool] | None = None
    ) -> None:
        """The application, consuming `durable` in `region` while it is its home (or while
        `keep` says)."""
        world, p, js, name = self._world, self._world.p, self._js, durable.name
        read = self._vs.read_stream(region)
        while world.now_ms() < until_ms and (durable.home == region if keep is None else keep()):
            await asyncio.sleep(world.rng.randint(1, 2 * p.consume_gap_ms) / 1000)
            js.settle()
            try:
                deliveries = js.fetch(read, name, p.consume_batch)
            except (NotFoundError, ServiceUnavailableError):
                continue  # not there (not created yet, or deleted): a pull gets a bare 503
            if deliveries:
                for fetched in self.on_fetched:
                    fetched(durable, region, deliveries)
            slow = None
            if deliveries and p.slow and world.rng.random() < p.slow:
                slow = world.rng.choice(deliveries)
                self._signal_ack(read, name, slow, b"+WPI")
                ms = world.rng.randint(100, 2_000)
                later = asyncio.get_running_loop().call_later
                later(ms / 1000, self._finish, durable, region, slow)
                world.stats["slow_messages"] += 1
            for d in deliveries:
                if d is not slow:
                    self._consume(durable, region, d)
            if deliveries:
                last = deliveries[-1].stream_seq
                world.note(f"{region} consumed {len(deliveries)} of {name} to {last}")

    def _consume(self, durable: Durable, region: str, d: Delivery) -> None:
        """The application consumed `d` of `durable` in `region`: counted, acked, the ack
        signalled."""
        world, consumed = self._world, durable.consumed
        entry = data_entry(self._vs, d.stream_seq, d.headers)
        key = (entry.origin, entry.origin_seq)
        if consumed[key]:
            world.stats["duplicates"] += 1
        consumed[key] += 1
        read = self._vs.read_stream(region)
        self._js.ack(read, durable.name, d.stream_seq)
        self._signal_ack(read, durable.name, d, b"+ACK")
        world.stats["consumed"] += 1

    def _signal_ack(self, read: str, name: str, d: Delivery, payload: bytes) -> None:
        """What the server's subscribers see of an ack the application sends for `d`."""
        self._net.signal(
            f"$JS.ACK.{read}.{name}.1.{d.stream_seq}.{d.consumer_seq}"
            f".{self._world.now_ms() * 1_000_000}.0",
            payload,
        )

    def _finish(self, durable: Durable, region: str, d: Delivery) -> None:
        """A slow worker finishes `d`, if `region` is still `durable`'s live home."""
        if region != durable.home or not self._live(region):
            self._world.stats["slow_messages_dropped"] += 1
            return
        self._js.settle()
        try:
            self._consume(durable, region, d)
        except NotFoundError:  # deleted meanwhile: consumed, its ack goes nowhere
            return
        for finished in self.on_finished:
            finished(durable, region)
        self._world.note(f"{region} finished slow {d.stream_seq} of {durable.name}")
