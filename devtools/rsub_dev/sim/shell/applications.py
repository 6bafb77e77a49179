"""The applications of the runtime's world: producers publishing in every region and the
consumer of the replicated durable in its home region, straight on the simulated JetStream
(not through a sidecar's port: no fault, no delay), acks signalled as the server does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.js.errors import NotFoundError

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.port import SimNet
from rsub_dev.sim.shell.checks import Checks
from rsub_dev.sim.shell.params import DURABLE, ShellParams
from rsub_dev.simjs import ConsumerConfig
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
        home: Callable[[], str],
    ) -> None:
        self._world = world
        self._vs = vs
        self._net = net
        self._js = net.js
        self._checks = checks
        self._live = live
        self._home = home

    async def produce(self, region: str, until_ms: int) -> None:
        world, p = self._world, self._world.p
        n = 0
        while world.now_ms() < until_ms:
            await asyncio.sleep(world.rng.randint(1, 2 * p.produce_gap_ms) / 1000)
            if not self._live(region):
                return
            n += 1
            subject = self._vs.publish_subject(region, "x")
            self._js.publish(subject, f"{region}-{n}".encode(), {"Nats-Msg-Id": f"{region}-{n}"})
            world.stats["published"] += 1

    def create_durable(self, region: str) -> None:
        read = self._vs.read_stream(region)
        config = ConsumerConfig(
            DURABLE, (self._vs.data_filter(),), metadata={REPLICATE_KEY: "true"}
        )
        self._js.consumer_create(read, config)
        self._net.signal(f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{read}.{DURABLE}")

    async def consume(self, region: str, until_ms: int) -> None:
        """The application, consuming the durable in `region` while it is its home."""
        world, p, js = self._world, self._world.p, self._js
        read = self._vs.read_stream(region)
        consumed = self._checks.consumed
        while world.now_ms() < until_ms and self._home() == region:
            await asyncio.sleep(world.rng.randint(1, 2 * p.consume_gap_ms) / 1000)
            js.settle()
            try:
                deliveries = js.fetch(read, DURABLE, p.consume_batch)
            except NotFoundError:
                continue  # not created here yet
            for d in deliveries:
                entry = data_entry(self._vs, d.stream_seq, d.headers)
                key = (entry.origin, entry.origin_seq)
                if consumed[key]:
                    world.stats["duplicates"] += 1
                consumed[key] += 1
                js.ack(read, DURABLE, d.stream_seq)
                self._net.signal(f"$JS.ACK.{read}.{DURABLE}.1.{d.stream_seq}.{d.consumer_seq}")
            world.stats["consumed"] += len(deliveries)
            if deliveries:
                world.note(f"{region} consumed {len(deliveries)} to {deliveries[-1].stream_seq}")
