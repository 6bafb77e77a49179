"""`rsub run --config FILE`: run the sidecar of one region until SIGTERM or SIGINT.

Exit status: 0 after a signal, 2 for a bad configuration or a listen address the gRPC or
HTTP server cannot take (in use), 3 when NATS refuses the credentials or TLS settings at the
first connection; the reason is printed on stderr, one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
from pathlib import Path

import structlog
import uvloop

from sidecar.api.errors import ListenError
from sidecar.api.service import Service
from sidecar.config.checks import ConfigError
from sidecar.config.environment import unrelated_env
from sidecar.config.loading import load_config
from sidecar.config.schema import Config
from sidecar.logs import configure_logging
from sidecar.nats.connection import NatsRefused

log = structlog.get_logger(__name__)

# Collections of the youngest generation every this many allocations (not 700), and of the
# older ones more rarely: what survives is mostly long-lived, and no cyclic garbage was found
# (docs/benchmarks.md, "Many streams": the collector's passes grew with the heap).
_GC_THRESHOLDS = (50_000, 50, 50)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser(
        "run",
        help="run the sidecar of one region",
        description="Run the rsub sidecar: snapshots, updates and the gRPC/HTTP API. "
        "Settings come from the YAML file, overridden by RSUB_* environment variables.",
    )
    run.add_argument("--config", type=Path, help="YAML configuration file (optional with RSUB_*)")
    run.set_defaults(handler=run_sidecar)


async def serve(config: Config) -> NatsRefused | ListenError | None:
    """Run a `Service` until SIGTERM/SIGINT, then stop it cleanly.

    Returns early, with the error, when a server cannot listen (what started is stopped) or
    NATS refuses the credentials at the first connection.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = Service(config)
    try:
        await runtime.start()
    except ListenError as error:
        await runtime.stop()
        return error
    frozen = asyncio.create_task(_freeze_when_ready(runtime))
    waits = (asyncio.create_task(stop.wait()), asyncio.create_task(runtime.wait_failed()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*waits, frozen):
            task.cancel()
        await runtime.stop()
    return runtime.failure


async def _freeze_when_ready(runtime: Service) -> None:
    """Once every stream is rebuilt, leave what the bring-up built (it lives as long as the
    process) out of the cyclic GC's collections: `gc.freeze`. What of a stream dropped later
    (discovery) was frozen and sits in reference cycles stays until the process ends: about
    a stream's share of the memory, once per dropped stream."""
    with contextlib.suppress(NatsRefused):
        await runtime.wait_ready(None)
        gc.freeze()
        log.debug("gc_frozen", objects=gc.get_freeze_count())


def run_sidecar(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, os.environ)
    except ConfigError as err:
        print(f"rsub run: {err}", file=sys.stderr)
        return 2
    configure_logging(config.log.format, config.log.level)
    if unrelated := unrelated_env(os.environ):
        # Names only: a value may be a secret. Typos of settings were refused by load_config.
        log.warning("env_ignored", variables=unrelated, reason="RSUB_ variables naming no setting")
    # The sidecar holds millions of long-lived objects and allocates steadily under load: at
    # CPython's default thresholds the cyclic GC takes a good part of a core at a thousand
    # loaded streams (docs/benchmarks.md, "Many streams", "How it got there").
    gc.set_threshold(*_GC_THRESHOLDS)
    # uvloop: the sidecar's work is many small messages and wake-ups, which its event loop
    # carries for less CPU than asyncio's (bench/bench_publish.py; docs/benchmarks.md).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        failure = runner.run(serve(config))
    if failure is not None:
        print(f"rsub run: {failure}", file=sys.stderr)
        return 2 if isinstance(failure, ListenError) else 3
    return 0
