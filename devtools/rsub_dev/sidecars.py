"""One rsub sidecar per region on a `LocalSuperCluster`, for the demo, scenario tests and benches.

In process (a `Service` per region: its `Runtime`, serving the API unless `serve=False`)::

    async with RegionSidecars(cluster, streams=["orders"], interval_ms=200) as sidecars:
        sidecars["west"]                      # the Service of west (ready, leading)
        await sidecars.stop("west")           # graceful stop (releases the lease)
        async with sidecars.replica("west") as follower: ...   # a second replica

In a subprocess (`rsub run --config`), when the sidecar must be SIGKILLed or measured, or
outlive the caller (`detached=True`, for `rsub dev up --sidecars`)::

    proc = SidecarProcess(sidecar_settings(cluster, "west"), workdir)
    await proc.start(); await proc.wait_ready(60); ...; await proc.kill()

`read_stored()` / `read_markers()` read what a stream holds (with stored timestamps) and
`snapshot_latencies_ms()` measures snapshot completion from the markers themselves, and
`percentile()` sums such durations up for the demo and the benches.

`sidecar_settings()` builds the configuration mapping (what a YAML file holds) from the
cluster: servers of the region, all regions, the streams, snapshot intervals, lease TTL and
listen addresses (port 0 = any free port for in-process runtimes).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import structlog
import yaml
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from rsub_dev.cluster import (
    ClusterError,
    LocalSuperCluster,
    log_tail,
    spawn_process,
    stop_process,
)
from rsub_dev.ports import HOST, free_ports
from sidecar.api.service import Service
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.consumers import REPLICATE_KEY
from sidecar.protocol import Marker, Rejected, Request, Snapshot, decode

log = structlog.get_logger(__name__)

DEFAULT_STREAMS = ("orders",)
READY_TIMEOUT_S = 60.0
_POLL_S = 0.05
_READ_WAIT_S = 10.0
_START_ATTEMPTS = 3


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    timeout_s: float = 60.0,
    *,
    poll_s: float = _POLL_S,
) -> None:
    """Poll `check` until it returns True; raise TimeoutError naming `what` after the deadline.

    A check whose own request times out (a JetStream API call on a loaded machine, a meta
    leader being elected) counts as "not yet"; the last such timeout is chained to the error.
    """
    deadline = time.monotonic() + timeout_s
    last: TimeoutError | None = None
    while True:
        try:
            if await check():
                return
        except TimeoutError as err:  # nats-py's request timeouts are TimeoutErrors too
            last = err
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}") from last
        await asyncio.sleep(poll_s)


@dataclass(frozen=True)
class Stored:
    """One message as a stream stores it."""

    seq: int
    subject: str
    stored_unix_ms: float
    headers: Mapping[str, str]
    data: bytes


async def read_stored(nc: Client, stream: str, subject_filter: str) -> list[Stored]:
    """Every message of `stream` matching `subject_filter` at the time of the call, in order.

    Uses an ordered consumer, so it needs the JetStream meta leader.
    """
    js = nc.jetstream()
    info = await js.stream_info(stream, subjects_filter=subject_filter)
    count = sum((info.state.subjects or {}).values())
    stored: list[Stored] = []
    if count == 0:
        return stored
    sub = await js.subscribe(
        subject_filter,
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        while len(stored) < count:
            msg = await sub.next_msg(timeout=_READ_WAIT_S)
            meta = msg.metadata
            stored.append(
                Stored(
                    meta.sequence.stream,
                    msg.subject,
                    meta.timestamp.timestamp() * 1000,
                    dict(msg.headers or {}),
                    msg.data,
                )
            )
            if meta.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return stored


@dataclass(frozen=True)
class ReadStreamMarker:
    """A marker as a region's read stream holds it: stream sequence, stored time, decoded.

    Not `sidecar.nats.marker_log.StoredMarker`, the raw message the runtime replays: this one
    is what tests and benches inspect after the fact, so it carries the decoded marker (or why
    it was rejected) and the server's stored timestamp.
    """

    seq: int
    stored_unix_ms: float
    marker: Marker | Rejected


async def read_markers(nc: Client, vs: VirtualStream, region: str) -> list[ReadStreamMarker]:
    """Every marker in `region`'s read stream, decoded (or rejected), in stream order."""
    stored = await read_stored(nc, vs.read_stream(region), vs.marker_filter())
    return [
        ReadStreamMarker(
            s.seq, s.stored_unix_ms, decode(s.data, stream=vs.name, regions=vs.regions)
        )
        for s in stored
    ]


def snapshot_latencies_ms(markers: Sequence[ReadStreamMarker], region: str) -> dict[str, float]:
    """Per completed snapshot of `region`: ms from its first request to its completion marker,
    both as stored in `region`'s read stream (the markers of that read stream)."""
    requested: dict[str, float] = {}
    latencies: dict[str, float] = {}
    for item in markers:
        marker = item.marker
        if not isinstance(marker, Marker) or marker.region != region:
            continue
        body = marker.body
        if isinstance(body, Request) and body.round == 1:
            requested[str(body.id)] = item.stored_unix_ms
        elif isinstance(body, Snapshot) and str(body.id) in requested:
            latencies[str(body.id)] = item.stored_unix_ms - requested[str(body.id)]
    return latencies


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return float(ordered[int(rank) - 1])


async def in_flight_count(
    conns: Mapping[str, Client],
    vs: VirtualStream,
    receiver: str,
    after_seq: int,
    before_unix_ms: float,
    origins: Sequence[str],
) -> int:
    """Messages of `origins` that `receiver`'s read stream holds after `after_seq` although
    their write stream had them before `before_unix_ms`: in flight to `receiver` then.

    With three regions or more, the duplicates of a failover that resumes after position
    `p` of a snapshot started at `t` are at most the messages consumed in the old region that
    reached it after `t`, plus these (sourcing from one region to another can lag behind the
    snapshot's request). `conns` needs a client for `receiver` and for every origin.
    """
    late = [
        origin
        for s in await read_stored(conns[receiver], vs.read_stream(receiver), vs.data_filter())
        if s.seq > after_seq
        and (origin := vs.origin_of(s.headers.get(SOURCE_HEADER, ""))) is not None
        and origin[0] in origins
    ]
    written: dict[str, dict[int, float]] = {}
    for region in {r for r, _ in late}:
        stored = await read_stored(conns[region], vs.write_stream(region), vs.data_subject(region))
        written[region] = {s.seq: s.stored_unix_ms for s in stored}
    return sum(1 for r, seq in late if written[r].get(seq, before_unix_ms) < before_unix_ms)


def durable_config(vs: VirtualStream, name: str, *, replicated: bool = True) -> ConsumerConfig:
    """A data consumer as an application would create it: all of `vs`'s data, explicit acks,
    and (by default) the metadata that makes it a replicated subscription."""
    return ConsumerConfig(
        durable_name=name,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=vs.data_filter(),
        ack_policy=AckPolicy.EXPLICIT,
        metadata={REPLICATE_KEY: "true"} if replicated else None,
    )


def sidecar_settings(
    cluster: LocalSuperCluster,
    region: str,
    *,
    streams: Sequence[str] = DEFAULT_STREAMS,
    interval_ms: int = 200,
    timeout_s: float = 5.0,
    lease_ttl_s: float = 3.0,
    lease_shards: int | None = None,
    grpc_listen: str = f"{HOST}:0",
    http_listen: str = f"{HOST}:0",
    log_level: str = "warning",
    credentials: tuple[str, str] | None = None,
    progress: bool = True,
    progress_interval_ms: int | None = None,
    failback_hold_s: float | None = None,
) -> dict[str, Any]:
    """The configuration mapping of `region`'s sidecar on `cluster` (YAML-serialisable);
    `credentials` are the NATS user and password it connects with; `progress=False` makes it
    PIP-33 only, `progress_interval_ms` (default: the sidecar's, the snapshot interval) its
    vectors' cadence; `lease_shards` (default: the sidecar's) is the number of shards the replicas
    of a region share, 1 for one leader of every stream and the others standing by;
    `failback_hold_s` (default: the sidecar's) limits the failback guard, 0 turns it off."""
    nats: dict[str, Any] = {"servers": cluster.servers(region)}
    if credentials is not None:
        nats["user"], nats["password"] = credentials
    return {
        "region": region,
        "regions": list(cluster.regions),
        "nats": nats,
        "streams": [{"name": name} for name in streams],
        "snapshot": {"interval_ms": interval_ms, "timeout_s": timeout_s},
        "progress": {"enabled": progress}
        | ({"interval_ms": progress_interval_ms} if progress_interval_ms is not None else {}),
        "failback": {} if failback_hold_s is None else {"hold_s": failback_hold_s},
        "lease": {"ttl_s": lease_ttl_s}
        | ({"shards": lease_shards} if lease_shards is not None else {}),
        "grpc": {"listen": grpc_listen},
        "http": {"listen": http_listen},
        "log": {"level": log_level},
    }


class RegionSidecars:
    """One in-process `Service` per region; `async with` starts them and waits for leaders."""

    def __init__(
        self,
        cluster: LocalSuperCluster,
        *,
        streams: Sequence[str] = DEFAULT_STREAMS,
        regions: Sequence[str] | None = None,
        interval_ms: int = 200,
        timeout_s: float = 5.0,
        lease_ttl_s: float = 3.0,
        lease_shards: int | None = None,
        serve: bool = True,
        credentials: Mapping[str, tuple[str, str]] | None = None,
        progress: bool = True,
        failback_hold_s: float | None = None,
    ) -> None:
        """`credentials` maps a region to the NATS user and password of its sidecar;
        `progress=False` runs them PIP-33 only (no progress vectors); `lease_shards` and
        `failback_hold_s` as in `sidecar_settings`."""
        self.cluster = cluster
        self.streams = tuple(streams)
        self.regions = tuple(regions if regions is not None else cluster.regions)
        unknown = [r for r in self.regions if r not in cluster.regions]
        if unknown:
            raise ValueError(f"regions: {unknown} are not regions of the cluster {cluster.regions}")
        self.interval_ms = interval_ms
        self.timeout_s = timeout_s
        self.lease_ttl_s = lease_ttl_s
        self.lease_shards = lease_shards
        self.serve = serve
        self.credentials = dict(credentials or {})
        self.progress = progress
        self.failback_hold_s = failback_hold_s
        self.runtimes: dict[str, Service] = {}

    def config(self, region: str) -> Config:
        return config_from_mapping(
            sidecar_settings(
                self.cluster,
                region,
                streams=self.streams,
                interval_ms=self.interval_ms,
                timeout_s=self.timeout_s,
                lease_ttl_s=self.lease_ttl_s,
                lease_shards=self.lease_shards,
                credentials=self.credentials.get(region),
                progress=self.progress,
                failback_hold_s=self.failback_hold_s,
            )
        )

    def __getitem__(self, region: str) -> Service:
        return self.runtimes[region]

    def __iter__(self) -> Iterator[str]:
        return iter(self.runtimes)

    async def __aenter__(self) -> RegionSidecars:
        try:
            # One after the other: the first applies the topology, the others find it in place.
            for region in self.regions:
                await self.start(region)
            await self.wait_leaders()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self, region: str) -> Service:
        """Start `region`'s sidecar (again) and wait until it is ready."""
        if region in self.runtimes:
            raise RuntimeError(f"region {region!r}: its sidecar is already running")
        runtime = self.runtimes[region] = Service(self.config(region), serve=self.serve)
        await runtime.start()
        await runtime.wait_ready(READY_TIMEOUT_S)
        return runtime

    @contextlib.asynccontextmanager
    async def replica(self, region: str, *, serve: bool = False) -> AsyncIterator[Service]:
        """Another replica of `region`'s sidecar (a follower while another one leads),
        ready inside the block and stopped at its end."""
        replica = Service(self.config(region), serve=serve)
        try:
            await replica.start()
            await replica.wait_ready(READY_TIMEOUT_S)
            yield replica
        finally:
            await replica.stop()

    async def stop(self, region: str) -> None:
        """Stop `region`'s sidecar cleanly (it gives its lease up when it still can)."""
        runtime = self.runtimes.pop(region, None)
        if runtime is not None:
            await runtime.stop()

    async def wait_leaders(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the sidecar of every running region leads every stream (it is the only
        replica of its region: a second one is started with `replica`)."""

        async def all_lead() -> bool:
            return all(r.leadership(s).leader for r in self.runtimes.values() for s in self.streams)

        await wait_until(all_lead, "a leader of every stream in every region", timeout_s)

    async def close(self) -> None:
        runtimes = list(self.runtimes.values())
        self.runtimes.clear()
        await asyncio.gather(*(r.stop() for r in runtimes), return_exceptions=True)


class SidecarProcess:
    """`rsub run --config` in a child process; config and log in `workdir`.

    Attached (the default), the child is killed with the parent; `detached` gives it its own
    session so that it outlives the caller (`rsub dev up`). Either way its command line names
    the config file in `workdir`, which `process_belongs_to(pid, workdir)` recognises.
    """

    def __init__(
        self, settings: Mapping[str, Any], workdir: Path, *, detached: bool = False
    ) -> None:
        self.region = str(settings["region"])
        self.settings = {**settings, "log": {**settings.get("log", {}), "format": "json"}}
        config_from_mapping(self.settings)  # refuse a bad configuration here, not in the child
        self.detached = detached
        self.grpc_port = self.http_port = 0
        self.workdir = Path(workdir)
        self.config_path = self.workdir / f"sidecar-{self.region}.yaml"
        self.log_path = self.workdir / f"sidecar-{self.region}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"sidecar of {self.region!r} is not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Spawn it and wait until it serves HTTP (readiness comes later: `wait_ready`).

        Ports are chosen free but released before the child binds them; when another process
        took one in between (the child logs "cannot listen"), start again on new ports. A
        child that fails to start is stopped; the error is a `ClusterError` with its log tail.
        """
        if self.running:
            raise RuntimeError(f"sidecar of {self.region!r} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.grpc_port, self.http_port = free_ports(2)
            settings = {
                **self.settings,
                "grpc": {**self.settings.get("grpc", {}), "listen": f"{HOST}:{self.grpc_port}"},
                "http": {**self.settings.get("http", {}), "listen": f"{HOST}:{self.http_port}"},
            }
            self.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            proc = self._proc = spawn_process(self.command(), self.log_path, detached=self.detached)
            try:
                await self._wait_http("/healthz", lambda status: True, timeout_s)
                return
            except ClusterError:
                await stop_process(proc)
                taken = self._logged_since(log_offset, b"cannot listen")
                if not taken or attempt == _START_ATTEMPTS:
                    raise
                log.warning("sidecar_start_retrying", region=self.region, attempt=attempt)
            except BaseException:
                await stop_process(proc)
                raise

    def command(self) -> list[str]:
        """What runs the sidecar on `config_path` (written, and the ports chosen, before it is
        called): `rsub run` with this interpreter; a subclass may run it elsewhere (in a
        container, tests/deploy/test_image.py)."""
        return [sys.executable, "-m", "sidecar.cli", "run", "--config", str(self.config_path)]

    def _logged_since(self, offset: int, text: bytes) -> bool:
        with self.log_path.open("rb") as log_file:
            log_file.seek(offset)
            return text in log_file.read()

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until its /readyz answers 200 (connected, topology applied, leadership known)."""
        await self._wait_http("/readyz", lambda status: status == 200, timeout_s)

    def _failure(self, problem: str) -> ClusterError:
        return ClusterError(
            f"sidecar of region {self.region!r} {problem}; tail of {self.log_path}:\n"
            + log_tail(self.log_path)
        )

    async def _wait_http(self, path: str, accept: Callable[[int], bool], timeout_s: float) -> None:
        """Poll `path` until `accept` takes its status; a `ClusterError` when the child exits
        or the deadline passes, naming the last answer."""
        url = f"http://{HOST}:{self.http_port}{path}"
        last = f"{url} not asked yet"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:

            async def answered() -> bool:
                nonlocal last
                if self._proc is not None and (code := self._proc.poll()) is not None:
                    raise self._failure(f"exited with code {code}")
                try:
                    async with http.get(url) as resp:
                        if accept(resp.status):
                            return True
                        last = f"{url} answers {resp.status} {await resp.text()}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = f"{url} not reachable ({exc!r})"
                return False

            try:
                await wait_until(answered, f"{url} of the {self.region} sidecar", timeout_s)
            except TimeoutError as exc:
                raise self._failure(f"not ready: {exc}; last: {last}") from exc

    async def metrics_text(self, timeout_s: float = 5.0) -> str:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.get(f"http://{HOST}:{self.http_port}/metrics") as resp,
        ):
            return await resp.text()

    async def kill(self) -> None:
        """SIGKILL: no lease release, no flush (a crash)."""
        if self._proc is not None:
            await stop_process(self._proc, kill=True)

    async def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL after a grace period."""
        if self._proc is not None:
            await stop_process(self._proc)
