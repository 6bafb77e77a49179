"""`rsub dev up|down`: a detached local super-cluster for manual work and the demo.

Every process `up` starts is listed in cluster.json under "pids"; `down` stops exactly
those (after checking each still runs from DIR) and nothing else. To start more processes
with the cluster (e.g. one sidecar per region), spawn them with `spawn_process(...,
detached=True)` after `_start_cluster`, add their PIDs to "pids" and their details under a
new key of the description before `write_cluster_json`.
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

from sidecar.dev.cluster import (
    CLUSTER_FILE,
    ClusterError,
    LocalSuperCluster,
    pid_alive,
    process_belongs_to,
    read_cluster_json,
    write_cluster_json,
)

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
            "(sidecar.dev.cluster.LocalSuperCluster) for that."
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
    up.add_argument("--timeout", type=float, default=60, help="seconds to wait for readiness")
    up.set_defaults(handler=cmd_up)

    down = commands.add_parser(
        "down",
        help="stop the processes listed in DIR/cluster.json",
        description=(
            "Stop exactly the processes listed in DIR/cluster.json (SIGTERM, then SIGKILL), "
            "skipping any PID that no longer runs from DIR. Data and logs stay in DIR."
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


async def _start_cluster(args: argparse.Namespace) -> LocalSuperCluster:
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
    return cluster


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
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
        cluster = asyncio.run(_start_cluster(args))
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    description = cluster.describe()
    path = write_cluster_json(directory, description)
    print(f"cluster ready in {time.monotonic() - started:.1f}s, described in {path}")
    for region, urls in description["regions"].items():
        print(f"  {region}: {' '.join(urls['servers'])}")
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
        stopped = stop_pids(directory, listed)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    skipped = sorted(set(listed) - set(stopped))
    (directory / CLUSTER_FILE).unlink()
    print(f"stopped {len(stopped)} process(es) from {directory}: {stopped}")
    if skipped:
        print(f"skipped (not running, or not a process of {directory}): {skipped}")
    return 0
