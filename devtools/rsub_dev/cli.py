"""`rsub dev up|down`: a detached local super-cluster for manual work and the demo.

Every process `up` starts is listed in cluster.json under "pids"; `down` stops exactly
those (after checking each still runs from DIR) and nothing else. With `--sidecars`, `up`
also starts one detached `rsub run --config DIR/sidecar-REGION.yaml` per region once the
servers are ready, and describes them under "sidecars" (their PIDs are in "pids" too);
`down` stops those first so they can drain while NATS is still there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from rsub_dev.cluster import (
    CLUSTER_FILE,
    ClusterError,
    LocalSuperCluster,
    pid_alive,
    process_belongs_to,
    read_cluster_json,
    write_cluster_json,
)
from rsub_dev.ports import HOST
from rsub_dev.sidecars import SidecarProcess, sidecar_settings
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream

log = structlog.get_logger(__name__)

_DOWN_TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="local multi-region NATS super-cluster",
        description="Local multi-region NATS super-cluster on 127.0.0.1 (for demos and tests).",
    )
    commands = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")

    up = commands.add_parser(
        "up",
        help="start a detached super-cluster and write DIR/cluster.json",
        description=(
            "Start one nats-server cluster per region (cluster name = region, servers "
            "REGION-0..), JetStream on, regions linked by gateways, as detached processes. "
            "Returns once every server is healthy and the JetStream meta leader is elected, "
            "then writes DIR/cluster.json with the client and monitoring URLs and the PIDs. "
            "In this mode gateways connect directly (no proxy, since no Python process stays "
            "behind), so links cannot be cut or delayed; use the Python API "
            "(rsub_dev.cluster.LocalSuperCluster) for that."
        ),
    )
    up.add_argument(
        "--regions",
        default="west,central,east",
        help="comma-separated region names (default: %(default)s)",
    )
    up.add_argument("--dir", required=True, type=Path, help="directory for configs, data, logs")
    up.add_argument("--servers-per-region", type=int, choices=(1, 3), default=1)
    up.add_argument("--max-memory", default="256MB", help="JetStream memory store per server")
    up.add_argument("--max-file", default="2GB", help="JetStream file store per server")
    up.add_argument(
        "--timeout",
        type=float,
        default=60,
        help="seconds to wait for the servers' readiness, and then for each sidecar's",
    )
    up.add_argument(
        "--sidecars",
        action="store_true",
        help=(
            "also start one detached sidecar per region (`rsub run --config "
            "DIR/sidecar-REGION.yaml`, log in DIR/sidecar-REGION.log), one after the other, "
            "each waited for until its /readyz answers 200"
        ),
    )
    up.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="NAME",
        help="virtual stream the sidecars serve (repeatable; required with --sidecars)",
    )
    up.set_defaults(handler=cmd_up)

    down = commands.add_parser(
        "down",
        help="stop the processes listed in DIR/cluster.json",
        description=(
            "Stop exactly the processes listed in DIR/cluster.json (SIGTERM, then SIGKILL), "
            "sidecars first (they drain while NATS is up), then servers, skipping any PID "
            "that no longer runs from DIR. Data and logs stay in DIR."
        ),
    )
    down.add_argument("--dir", required=True, type=Path, help="directory given to `up`")
    down.set_defaults(handler=cmd_down)


def _live_pids(directory: Path, description: dict[str, Any]) -> list[int]:
    return [
        pid
        for pid in description.get("pids", [])
        if isinstance(pid, int) and pid_alive(pid) and process_belongs_to(pid, directory)
    ]


def _parse_regions(text: str) -> list[str]:
    return [r.strip() for r in text.split(",") if r.strip()]


def _check_streams(args: argparse.Namespace) -> str:
    """Why `--sidecars`/`--stream` cannot be used as given, or "" (checked before any start)."""
    if args.sidecars and not args.stream:
        return "--sidecars needs at least one --stream NAME (the virtual streams they serve)"
    if args.stream and not args.sidecars:
        return "--stream is only used with --sidecars"
    if dups := sorted({s for s in args.stream if args.stream.count(s) > 1}):
        return f"--stream: {dups} given more than once"
    regions = tuple(_parse_regions(args.regions))
    for name in args.stream:
        try:
            VirtualStream(name, regions)
        except ValueError as exc:
            return f"--stream {name!r}: {exc}"
    return ""


async def _start_sidecar(
    cluster: LocalSuperCluster, region: str, streams: list[str], timeout_s: float
) -> SidecarProcess:
    """Start `rsub run --config DIR/sidecar-REGION.yaml` detached and wait (`timeout_s` in
    all) until its /readyz answers 200; a sidecar that does not get there is stopped."""
    settings = sidecar_settings(cluster, region, streams=streams, log_level="info")
    sidecar = SidecarProcess(settings, cluster.directory, detached=True)
    started = time.monotonic()
    await sidecar.start(timeout_s)
    try:
        await sidecar.wait_ready(timeout_s - (time.monotonic() - started))
    except BaseException:
        await sidecar.stop()
        raise
    seconds = round(time.monotonic() - started, 2)
    log.info("sidecar_ready", region=region, pid=sidecar.pid, seconds=seconds)
    return sidecar


def _describe(sidecar: SidecarProcess) -> dict[str, Any]:
    return {
        "grpc": f"{HOST}:{sidecar.grpc_port}",
        "http": f"http://{HOST}:{sidecar.http_port}",
        "pid": sidecar.pid,
        "log": str(sidecar.log_path),
    }


async def _start(args: argparse.Namespace) -> dict[str, Any]:
    """Start the servers (and sidecars); return the cluster.json content. Whatever was
    started is stopped again when a later step fails."""
    cluster = LocalSuperCluster(
        _parse_regions(args.regions),
        args.dir,
        servers_per_region=args.servers_per_region,
        proxy_gateways=False,
        max_memory=args.max_memory,
        max_file=args.max_file,
        detached=True,
    )
    await cluster.start(ready_timeout=args.timeout)
    sidecars: list[SidecarProcess] = []
    try:
        if args.sidecars:
            # One after the other: the first applies the topology, the others find it.
            for region in cluster.regions:
                sidecars.append(await _start_sidecar(cluster, region, args.stream, args.timeout))
    except BaseException:
        await asyncio.gather(*(s.stop() for s in sidecars))
        await cluster.stop()
        raise
    description = cluster.describe()
    if sidecars:
        description["pids"] += [s.pid for s in sidecars]
        description["sidecars"] = {s.region: _describe(s) for s in sidecars}
    return description


def cmd_up(args: argparse.Namespace) -> int:
    configure_logging("auto", "info")  # the servers' start-up details are debug lines
    directory: Path = args.dir.resolve()
    if problem := _check_streams(args):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        existing = read_cluster_json(directory)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if existing is not None and (live := _live_pids(directory, existing)):
        print(
            f"error: a cluster is already running from {directory} (pids {live}); "
            f"run `rsub dev down --dir {args.dir}` first",
            file=sys.stderr,
        )
        return 1
    started = time.monotonic()
    try:
        description = asyncio.run(_start(args))
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    path = write_cluster_json(directory, description)
    print(f"cluster ready in {time.monotonic() - started:.1f}s, described in {path}")
    for region, urls in description["regions"].items():
        print(f"  {region}: {' '.join(urls['servers'])}")
    for region, sidecar in description.get("sidecars", {}).items():
        print(f"  {region} sidecar: grpc {sidecar['grpc']}, http {sidecar['http']}")
    return 0


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    remaining = [pid for pid in pids if pid_alive(pid)]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.1)
        remaining = [pid for pid in remaining if pid_alive(pid)]
    return remaining


def stop_pids(directory: Path, pids: list[int]) -> list[int]:
    """SIGTERM (then SIGKILL) the given PIDs that still run from `directory`; return those."""
    ours = _live_pids(directory, {"pids": pids})
    _signal_all(ours, signal.SIGTERM)
    stubborn = _wait_gone(ours, _DOWN_TIMEOUT_S)
    _signal_all(stubborn, signal.SIGKILL)
    if left := _wait_gone(stubborn, _DOWN_TIMEOUT_S):
        raise ClusterError(f"processes {left} did not exit after SIGKILL")
    return ours


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    try:
        description = read_cluster_json(directory)
        if description is None:
            print(f"error: no {CLUSTER_FILE} in {directory}", file=sys.stderr)
            return 1
        listed = [pid for pid in description.get("pids", []) if isinstance(pid, int)]
        sidecar_pids = {
            entry.get("pid")
            for entry in (description.get("sidecars") or {}).values()
            if isinstance(entry, dict)
        }
        # Sidecars first: on SIGTERM they drain and give their lease up, which needs NATS.
        sidecars = stop_pids(directory, [pid for pid in listed if pid in sidecar_pids])
        others = stop_pids(directory, [pid for pid in listed if pid not in sidecar_pids])
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    skipped = sorted(set(listed) - set(sidecars) - set(others))
    (directory / CLUSTER_FILE).unlink()
    if sidecars:
        print(f"stopped {len(sidecars)} sidecar(s) from {directory}: {sidecars}")
    print(f"stopped {len(others)} server process(es) from {directory}: {others}")
    if skipped:
        print(f"skipped (not running, or not a process of {directory}): {skipped}")
    return 0
