"""The `rsub` command: one argparse tree, each command group in its own module.

Every module named in COMMAND_MODULES exposes `register(subparsers)`, which adds its
commands and sets `handler(args) -> int` on each parser it adds.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "sidecar.api.cli",
    "sidecar.dev.cli",
    "sidecar.nats.topology_cli",
    "sidecar.run_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsub", description="Replicated subscriptions for NATS JetStream."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    raise SystemExit(main())
