"""One chaos run: the plan of a seed carried out on a real super-cluster, its history recorded.

Three servers per region, R3 streams, one `rsub run` sidecar process per region, producers in
every region, replicated durables consumed with random pacing and moved between regions, the
nemesis schedule of the plan; then a heal (everything restarted and reconnected), a drain,
and the checker. Everything recorded goes through public contracts: JetStream streams and
consumers (nats-py) and the sidecar's gRPC API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError

from rsub_dev.chaos.checker import Violation, check, summary
from rsub_dev.chaos.history import (
    Delivery,
    Failover,
    Fault,
    History,
    Position,
    Removal,
    UserDeletion,
    View,
)
from rsub_dev.chaos.plan import LEASE_TTL_S, SNAPSHOT_WAIT_S, DurablePlan, Event, Plan, draw
from rsub_dev.cluster import ClusterError, LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, read_stored, sidecar_settings
from rsub_dev.workload import Producer
from sidecar.api.client import SidecarClient, SidecarError
from sidecar.exact import covered
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.connection import connect_options

log = structlog.get_logger(__name__)

STREAM = "orders"
REPLICAS = 3
SERVERS_PER_REGION = 3
_CALL_TIMEOUT_S = 3.0
_POLL_S = 1.0
_READY_S = 120.0
_SOURCES_S = 180.0
_SNAPSHOT_S = 90.0
_DRAIN_S = 150.0
_RESTART_ATTEMPTS = 3
_Reply = TypeVar("_Reply")


@dataclass(frozen=True)
class Outcome:
    seed: int
    violations: list[Violation]
    summary: dict[str, object]
    directory: Path
    wall_s: float


def replay_command(seed: int, seconds: float, max_regions: int) -> str:
    return (
        f"PYTHONPATH=$PWD:$PWD/devtools .venv/bin/python -m rsub_dev.chaos --first-seed {seed} "
        f"--seeds 1 --seconds {seconds:g} --max-regions {max_regions}"
    )


async def run_seed(
    seed: int, seconds: float, directory: Path, *, max_regions: int = 3, keep: bool = False
) -> Outcome:
    """Run seed `seed` in `directory` (kept with the logs and history.json when the run fails
    or `keep`), return what the checker decided."""
    started = time.monotonic()
    plan = draw(seed, seconds, max_regions)
    _prepare(directory, plan)
    run = Run(plan, directory)
    try:
        async with LocalSuperCluster(
            plan.regions, directory / "cluster", servers_per_region=SERVERS_PER_REGION
        ) as cluster:
            run.cluster = cluster
            try:
                await run.execute()
            finally:
                await run.close()
    except (ClusterError, NatsError, TimeoutError, OSError) as exc:
        run.history.notes.append(f"run stopped early: {exc!r}")
        log.warning("chaos_run_stopped", seed=seed, problem=repr(exc))
    return _finish(run.history, directory, time.monotonic() - started, keep=keep)


def leader_floor(info: ConsumerInfo) -> int | None:
    """The ack floor a `CONSUMER.INFO` answer reports, or None when no consumer leader gave it.

    A server that holds a replica of the consumer but has not set it up yet (restarting)
    answers by itself with the configuration, an empty state and no cluster information
    (nats-server `jsConsumerInfoRequest`: "assigned but have not created a node yet"), and
    a replica of a consumer that never had a leader since it started answers with its own
    state and no leader. Neither is the consumer's position: chaos seed 33 read floor 0 so,
    0.3 s after west's servers restarted from a region kill, then 450 from its leader.
    The campaign's regions are clusters, so every real answer names the consumer's leader.
    """
    if info.cluster is None or not info.cluster.leader:
        return None
    return info.ack_floor.stream_seq if info.ack_floor else 0


def _prepare(directory: Path, plan: Plan) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "plan.txt").write_text(f"{plan}\n")


def _finish(history: History, directory: Path, wall_s: float, *, keep: bool) -> Outcome:
    """Keep the history, decide the run; the folder goes when it passed (unless `keep`)."""
    history.save(directory / "history.json")
    violations = check(history)
    if not violations and not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return Outcome(history.seed, violations, summary(history), directory, wall_s)


class Run:
    def __init__(self, plan: Plan, directory: Path) -> None:
        self.plan = plan
        self.directory = directory
        self.vs = VirtualStream(STREAM, plan.regions)
        self.cluster: LocalSuperCluster | None = None
        self.history = History(
            plan.seed, list(plan.regions), [d.name for d in plan.durables], STREAM
        )
        self.rng = random.Random(f"{plan.seed}-run")
        self.t0 = time.monotonic()
        self.sidecars: dict[str, SidecarProcess] = {}
        self.frozen: set[str] = set()
        self.region_down: set[str] = set()
        self.ncs: dict[str, Client] = {}
        self.producers: dict[str, Producer] = {}
        self.home = {d.name: d.home for d in plan.durables}
        self.durables = [d.name for d in plan.durables if d.kind == "durable"]
        self.stopping = asyncio.Event()
        self.delivered: dict[str, set[str]] = {d.name: set() for d in plan.durables}
        self._tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def note(self, text: str) -> None:
        self.history.notes.append(f"{self.now():.1f}s {text}")
        log.info("chaos_note", seed=self.plan.seed, note=text)

    @property
    def c(self) -> LocalSuperCluster:
        if self.cluster is None:
            raise RuntimeError("cluster not started")
        return self.cluster

    # ----- setup and teardown --------------------------------------------------------------

    def _settings(self, region: str) -> dict[str, Any]:
        settings = sidecar_settings(
            self.c,
            region,
            streams=[STREAM],
            interval_ms=self.plan.interval_ms,
            timeout_s=self.plan.timeout_s,
            lease_ttl_s=LEASE_TTL_S,
            log_level="info",
        )
        settings["streams"] = [{"name": STREAM, "replicas": REPLICAS}]
        return settings

    async def execute(self) -> None:
        for region in self.plan.regions:  # one after the other: the first applies the topology
            proc = self.sidecars[region] = SidecarProcess(
                self._settings(region), self.directory / "sidecars"
            )
            await proc.start()
            await proc.wait_ready(_READY_S)
        for region in self.plan.regions:
            options = connect_options(self.c.nats_config(region))
            self.ncs[region] = await nats.connect(**options, error_cb=_expected_error)
        self.t0 = time.monotonic()  # the plan's times, and every time recorded, from here
        for d in self.plan.durables:
            if d.kind == "cursor":
                await self.register_cursor(d)
            else:
                await (
                    self.ncs[d.home]
                    .jetstream()
                    .add_consumer(self.vs.read_stream(d.home), durable_config(self.vs, d.name))
                )
        self.producers = {
            r: Producer(self.ncs[r], self.vs, r, self.plan.rates[r]) for r in self.plan.regions
        }
        self._tasks += [asyncio.create_task(p.run()) for p in self.producers.values()]
        self._tasks += [
            asyncio.create_task(self.consume(d) if d.kind == "durable" else self.follow_cursor(d))
            for d in self.plan.durables
        ]
        self._tasks.append(asyncio.create_task(self.poll_positions()))
        self._tasks.append(asyncio.create_task(self.move_consumers()))
        nemesis = [asyncio.create_task(self.inject(e)) for e in self.plan.events]
        await asyncio.sleep(self.plan.seconds)
        await asyncio.gather(*nemesis)
        await self.heal()
        await self.check_snapshots()
        for producer in self.producers.values():
            producer.stopped.set()
        self._record_published()
        await self.drain()
        await self.read_positions()

    async def close(self) -> None:
        self.stopping.set()
        for producer in self.producers.values():
            producer.stopped.set()
        if not self.history.published:  # stopped before the heal: what was published so far
            self._record_published()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for region in list(self.frozen):
            self._signal(region, signal.SIGCONT)
        await asyncio.gather(*(p.stop() for p in self.sidecars.values()), return_exceptions=True)
        for nc in self.ncs.values():
            with contextlib.suppress(OSError, NatsError):
                await nc.close()

    def _record_published(self) -> None:
        self.history.published = {
            r: [p.decode() for p in producer.confirmed] for r, producer in self.producers.items()
        }

    # ----- the application -----------------------------------------------------------------

    async def consume(self, plan: DurablePlan) -> None:
        """The application on one durable: fetch, record, ack, with random pacing; follows
        `self.home` (a failover) and records each move."""
        rng = random.Random(f"{self.plan.seed}-{plan.name}")
        name, stint, region = plan.name, 0, plan.home
        while not self.stopping.is_set():
            if self.home[name] != region:
                source, region, stint = region, self.home[name], stint + 1
                await self.record_failover(name, stint, source, region)
            try:
                sub = (
                    await self.ncs[region]
                    .jetstream()
                    .pull_subscribe_bind(name, stream=self.vs.read_stream(region))
                )
            except (NatsError, TimeoutError) as exc:
                self.note(f"{name} cannot bind in {region}: {exc!r}")
                await asyncio.sleep(1)
                continue
            try:
                await self._consume_stint(plan, rng, sub, region, stint)
            finally:
                with contextlib.suppress(NatsError, TimeoutError, OSError):
                    await sub.unsubscribe()

    async def _consume_stint(
        self, plan: DurablePlan, rng: random.Random, sub: Any, region: str, stint: int
    ) -> None:
        name = plan.name
        while self.home[name] == region and not self.stopping.is_set():
            try:
                msgs: list[Msg] = await sub.fetch(plan.batch, timeout=0.5)
            except TimeoutError:
                continue
            except NatsError:
                await asyncio.sleep(0.2)
                continue
            for msg in msgs:
                if self.home[name] != region:
                    break  # not processed, not acked: redelivered where it stays pending
                self.record_delivery(name, stint, region, msg)
                with contextlib.suppress(NatsError, TimeoutError):
                    await msg.ack_sync(timeout=5)
                if plan.pause_s:
                    await asyncio.sleep(rng.expovariate(1 / plan.pause_s))
            if rng.random() < 0.03:
                await asyncio.sleep(rng.uniform(0.5, 3))

    def record_delivery(self, name: str, stint: int, region: str, msg: Msg) -> None:
        header = (msg.headers or {}).get(SOURCE_HEADER)
        origin = self.vs.origin_of(header) if header else None
        seq = msg.metadata.sequence.stream
        self._record(name, stint, region, msg.data, msg.subject, seq, origin)

    def _record(
        self,
        name: str,
        stint: int,
        region: str,
        data: bytes,
        subject: str,
        seq: int,
        origin: tuple[str, int] | None,
    ) -> None:
        payload = data.decode(errors="replace")
        self.delivered[name].add(payload)
        self.history.deliveries.append(
            Delivery(name, stint, region, payload, subject, seq, origin, self.now())
        )

    async def record_failover(
        self, name: str, stint: int, source: str, target: str, *, wait_view: bool = False
    ) -> View | None:
        """Record a move of `name` to `target` with `target`'s view of it; with `wait_view`
        (a cursor cannot start without it), ask for the view until it comes (30 s at most)."""
        at = self.now()
        try:
            js = self.ncs[target].jetstream(timeout=_CALL_TIMEOUT_S)
            info = await js.stream_info(self.vs.read_stream(target))
            last_seq = info.state.last_seq
        except (NatsError, TimeoutError):
            last_seq = 0
        view = await self.view(target, name)
        deadline = time.monotonic() + 30
        while wait_view and view is None and time.monotonic() < deadline:
            await asyncio.sleep(1)
            view = await self.view(target, name)
        if view is not None:
            self.history.positions.append(
                Position(name, target, at, self.now(), view.mark_delete, "sidecar")
            )
        self.history.failovers.append(Failover(name, stint, source, target, at, view, last_seq))
        log.info("chaos_failover", durable=name, source=source, target=target, view=view)
        return view

    async def register_cursor(self, plan: DurablePlan) -> None:
        """Register the cursor at 0 in its home region, as the Spark source does first."""
        deadline = time.monotonic() + _READY_S
        while await self.commit(plan.name, plan.home, 0) is None:
            if time.monotonic() > deadline:
                raise ClusterError(f"cursor {plan.name} could not be registered in {plan.home}")
            await asyncio.sleep(1)

    async def commit(self, name: str, region: str, seq: int) -> int | None:
        """CommitCursor in `region`; the cursor after it (None: the sidecar did not answer)."""
        started = self.now()
        mark_delete = await self._grpc(region, lambda client: client.commit(STREAM, name, seq))
        if mark_delete is None:
            return None
        self.history.positions.append(
            Position(name, region, started, self.now(), mark_delete, "cursor")
        )
        return mark_delete

    async def follow_cursor(self, plan: DurablePlan) -> None:
        """A Spark-style reader: direct gets from the read stream after its cursor, commits
        through gRPC; after a failover it starts after the target's `mark_delete` and leaves
        out what the target's progress covers (docs/spark.md, Failover)."""
        rng = random.Random(f"{self.plan.seed}-{plan.name}")
        name, stint, region = plan.name, 0, plan.home
        next_seq, skip, committed_at = 1, dict[str, int](), time.monotonic()
        while not self.stopping.is_set():
            if self.home[name] != region:
                source, region, stint = region, self.home[name], stint + 1
                view = await self.record_failover(name, stint, source, region, wait_view=True)
                next_seq = view.mark_delete + 1 if view is not None else 1
                skip = dict(view.progress) if view is not None else {}
            if time.monotonic() - committed_at > 0.5:
                await self.commit(name, region, next_seq - 1)
                committed_at = time.monotonic()
            js = self.ncs[region].jetstream(timeout=_CALL_TIMEOUT_S)
            try:
                raw = await js.get_msg(
                    self.vs.read_stream(region),
                    next_seq,
                    subject=self.vs.data_filter(),
                    next=True,
                    direct=True,
                )
            except NotFoundError:
                await asyncio.sleep(0.2)
                continue
            except (NatsError, TimeoutError):
                await asyncio.sleep(0.5)
                continue
            seq = int(raw.seq or next_seq)
            header = (raw.headers or {}).get(SOURCE_HEADER)
            origin = self.vs.origin_of(header) if header else None
            if not covered(origin, skip):
                self._record(name, stint, region, raw.data or b"", raw.subject or "", seq, origin)
            next_seq = seq + 1
            if plan.pause_s:
                await asyncio.sleep(rng.expovariate(1 / plan.pause_s))

    async def move_consumers(self) -> None:
        for failover in self.plan.failovers:
            await self._sleep_until(failover.at)
            self.fail_over(failover.durable, failover.target)

    def fail_over(self, name: str, wanted: str | None = None) -> None:
        """Move durable `name` to `wanted` (another region that is up when it is not)."""
        live = [r for r in self.plan.regions if r not in self.region_down and r != self.home[name]]
        if not live:
            return
        self.home[name] = wanted if wanted in live else self.rng.choice(live)

    # ----- recorder ------------------------------------------------------------------------

    async def poll_positions(self) -> None:
        while not self.stopping.is_set():
            await self.read_positions()
            await asyncio.sleep(_POLL_S)

    async def read_positions(self) -> None:
        for name in self.durables:
            for region in self.plan.regions:
                if region in self.region_down:
                    continue
                started = self.now()
                try:
                    info = (
                        await self.ncs[region]
                        .jetstream()
                        .consumer_info(self.vs.read_stream(region), name, timeout=_CALL_TIMEOUT_S)
                    )
                except (NatsError, TimeoutError):
                    continue
                floor = leader_floor(info)
                if floor is not None:
                    self.history.positions.append(
                        Position(name, region, started, self.now(), floor, "consumer")
                    )

    async def _grpc(self, region: str, call: Callable[[SidecarClient], _Reply]) -> _Reply | None:
        """`call` on `region`'s sidecar; None when it is down, frozen or did not answer."""
        proc = self.sidecars.get(region)
        if proc is None or not proc.running or region in self.frozen:
            return None

        def blocking() -> _Reply | None:
            address = f"127.0.0.1:{proc.grpc_port}"
            with SidecarClient(address, timeout_s=_CALL_TIMEOUT_S) as client:
                try:
                    return call(client)
                except SidecarError:
                    return None

        return await asyncio.to_thread(blocking)

    async def view(self, region: str, name: str) -> View | None:
        state = await self._grpc(region, lambda client: client.subscription(STREAM, name))
        if state is None:
            return None
        return View(state.mark_delete, dict(state.progress), state.failover_exposure)

    async def snapshot_pending(self, region: str) -> bool:
        status = await self._grpc(region, lambda client: client.status())
        return status is not None and any(s.snapshot_pending for s in status.streams)

    async def newest_snapshot_ms(self, region: str) -> int:
        snapshots = await self._grpc(region, lambda client: client.snapshots(STREAM))
        return max((s.completed_unix_ms for s in snapshots or ()), default=0)

    # ----- nemesis -------------------------------------------------------------------------

    async def _sleep_until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - self.t0)))

    async def inject(self, event: Event) -> None:
        await self._sleep_until(event.at)
        at = self.now()
        detail = ""
        try:
            detail = await self._fault(event)
        except Exception as exc:  # a fault that failed is recorded (and counted); the run goes on
            detail = f"error: {exc!r}"
            self.note(f"{event.kind} {event.target}: {exc!r}")
        self.history.faults.append(Fault(event.kind, event.target, at, self.now(), detail))

    async def _fault(self, event: Event) -> str:
        region = event.regions()[0]
        match event.kind:
            case "sidecar_kill":
                waited = ""
                if event.amount:
                    waited = await self._wait_snapshot_in_flight(region)
                await self.sidecars[region].kill()
                await asyncio.sleep(event.duration)
                await self.restart_sidecar(region)
                return waited
            case "sidecar_freeze":
                self._signal(region, signal.SIGSTOP)
                self.frozen.add(region)
                try:
                    await asyncio.sleep(event.duration)
                finally:
                    self.frozen.discard(region)
                    self._signal(region, signal.SIGCONT)
                return ""
            case "region_kill":
                self.region_down.add(region)
                for name, home in self.home.items():
                    if home == region:
                        self.fail_over(name)
                await self.sidecars[region].kill()
                await self.c.stop_region(region)
                try:
                    await asyncio.sleep(event.duration)
                finally:
                    await self.c.start_region(region)
                    self.region_down.discard(region)
                await self.c.wait_ready(_READY_S)
                await self.restart_sidecar(region)
                return ""
            case "server_kill":
                index = int(event.amount)
                await self.c.stop_server(region, index)
                try:
                    await asyncio.sleep(event.duration)
                finally:
                    await self.c.start_server(region, index)
                return f"server {index}"
            case "link_cut":
                a, b = event.regions()
                await self.c.cut_link(a, b)
                try:
                    await asyncio.sleep(event.duration)
                finally:
                    await self.c.restore_link(a, b)
                return ""
            case "link_delay":
                a, b = event.regions()
                await self.c.set_link_delay(a, b, event.amount)
                try:
                    await asyncio.sleep(event.duration)
                finally:
                    await self.c.set_link_delay(a, b, 0)
                return f"{event.amount}s"
            case "durable_delete":
                return await self._delete_durable(region)
            case "read_purge":
                return await self._purge(region, event.amount)
        raise ValueError(f"unknown fault kind {event.kind!r}")

    def _signal(self, region: str, sig: signal.Signals) -> None:
        proc = self.sidecars[region]
        if proc.running:
            os.kill(proc.pid, sig)

    async def _wait_snapshot_in_flight(self, region: str) -> str:
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while time.monotonic() < deadline:
            if await self.snapshot_pending(region):
                return "mid-snapshot"
            await asyncio.sleep(0.05)
        return f"no snapshot in flight within {SNAPSHOT_WAIT_S:g} s"

    async def restart_sidecar(self, region: str) -> None:
        """What an orchestrator does for a dead sidecar: start it again (a few attempts)."""
        proc = self.sidecars[region]
        if proc.running:  # another fault on the region restarted it already
            return
        for attempt in range(1, _RESTART_ATTEMPTS + 1):
            try:
                await proc.start()
                return
            except ClusterError as exc:
                self.note(f"sidecar {region} restart attempt {attempt} failed: {exc}")
                await asyncio.sleep(2)

    async def _delete_durable(self, region: str) -> str:
        names = [n for n in self.durables if self.home[n] != region]
        if not names:
            return "skipped: every durable is consumed there"
        name = self.rng.choice(names)
        js = self.ncs[region].jetstream(timeout=_CALL_TIMEOUT_S)
        stream = self.vs.read_stream(region)
        try:
            created = (await js.consumer_info(stream, name)).created
        except NotFoundError:
            return f"{name} absent"
        sent = self.now()
        try:
            await js.delete_consumer(stream, name)
        except NotFoundError:
            return f"{name} absent"
        except (NatsError, TimeoutError) as exc:
            # The request may have deleted it all the same (seed 72: the sidecar had to
            # create it again 1.8 s after the request timed out): ask until it is known.
            if not await self._deleted(js, stream, name, created):
                raise
            self.history.deletions.append(UserDeletion(name, region, sent, self.now()))
            return f"{name} (the request failed: {exc!r}; the durable was deleted)"
        self.history.deletions.append(UserDeletion(name, region, sent, self.now()))
        return name

    async def _deleted(
        self, js: JetStreamContext, stream: str, name: str, created: datetime
    ) -> bool:
        """Whether durable `name`, created at `created`, is gone or was replaced since (30 s
        of asking; False when no leader answered)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                info = await js.consumer_info(stream, name)
            except NotFoundError:
                return True
            except (NatsError, TimeoutError):
                info = None
            if info is not None and leader_floor(info) is not None:
                return bool(info.created != created)
            await asyncio.sleep(1)
        return False

    async def _purge(self, region: str, fraction: float) -> str:
        stored = await read_stored(
            self.ncs[region], self.vs.read_stream(region), self.vs.data_filter()
        )
        cut = int(len(stored) * fraction)
        if cut == 0:
            return "nothing to purge"
        below = stored[cut].seq if cut < len(stored) else stored[-1].seq + 1
        await self.ncs[region].jetstream().purge_stream(self.vs.read_stream(region), seq=below)
        removed = [s.data.decode(errors="replace") for s in stored[:cut]]
        undelivered = {n: [p for p in removed if p not in got] for n, got in self.delivered.items()}
        self.history.removals.append(Removal(region, self.now(), below, removed, undelivered))
        return f"{cut} messages below seq {below}"

    # ----- heal, snapshots, drain ----------------------------------------------------------

    async def heal(self) -> None:
        regions = self.plan.regions
        for a in regions:
            await self.c.start_region(a)
            for b in regions:
                if a < b:
                    await self.c.restore_link(a, b)
                    await self.c.set_link_delay(a, b, 0)
        await self.c.wait_ready(_READY_S)
        await self.c.wait_sources_active(_SOURCES_S)
        for region, proc in self.sidecars.items():
            ready = proc.running
            if ready:
                try:
                    await proc.wait_ready(_READY_S)
                except ClusterError as exc:
                    ready = False
                    self.note(f"sidecar {region} not ready after the heal: {exc}")
            else:
                self.note(f"sidecar {region} not running after the heal")
            self.history.sidecars_ready[region] = ready
        self.history.healed_at = self.now()

    async def check_snapshots(self) -> None:
        since_ms = time.time() * 1000

        async def completed(region: str) -> bool:
            return await self.newest_snapshot_ms(region) > since_ms

        await self._until(lambda: _all(completed(r) for r in self.plan.regions), _SNAPSHOT_S)
        for region in self.plan.regions:
            self.history.snapshots_after_heal[region] = await completed(region)

    async def drain(self) -> None:
        published = {p for payloads in self.history.published.values() for p in payloads}

        async def drained() -> bool:
            for name, got in self.delivered.items():
                excused = {p for r in self.history.removals for p in r.undelivered.get(name, [])}
                if not published <= got | excused:
                    return False
            return True

        if not await self._until(drained, _DRAIN_S):
            self.note("drain deadline passed")

    async def _until(self, check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not await check():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
        return True


async def _expected_error(exc: Exception) -> None:
    """Connection errors are what the nemesis causes: logged at debug level, not printed."""
    log.debug("chaos_client_error", error=repr(exc))


async def _all(checks: Any) -> bool:
    for item in checks:
        if not await item:
            return False
    return True
