"""`rsub run --config FILE`: run the sidecar of one region until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sidecar.config import Config, ConfigError, load_config
from sidecar.logs import configure_logging
from sidecar.runtime import Runtime


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="run the sidecar of one region",
        description="Run the rsub sidecar: snapshots, updates and the gRPC/HTTP API. "
        "Settings come from the YAML file, overridden by RSUB_* environment variables.",
    )
    run.add_argument("--config", type=Path, help="YAML configuration file (optional with RSUB_*)")
    run.set_defaults(handler=run_sidecar)


async def serve(config: Config) -> None:
    """Run a `Runtime` until SIGTERM/SIGINT, then stop it cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = Runtime(config)
    await runtime.start()
    try:
        await stop.wait()
    finally:
        await runtime.stop()


def run_sidecar(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, os.environ)
    except ConfigError as err:
        print(f"rsub run: {err}", file=sys.stderr)
        return 2
    configure_logging(config.log.format, config.log.level)
    asyncio.run(serve(config))
    return 0
