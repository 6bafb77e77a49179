"""The `rsub` command: one argparse tree, each command group in a module of this package.

- `remote`: commands against a running sidecar over gRPC (status, subscriptions, snapshots,
  trigger-snapshot, set-replicated, create-cursor, reset-cursor);
- `topology`: `rsub topology apply`, the streams of virtual streams;
- `run`: `rsub run`, the sidecar itself.

Each module exposes `register(subparsers)`, which adds its commands and sets
`handler(args) -> int` on each parser it adds. Installed extensions add
command groups the same way through the `rsub.commands` entry-point group: the development
tools (`devtools/`, never shipped) add `rsub dev` there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

import sidecar
from sidecar.cli import remote, run, topology

EXTENSION_GROUP = "rsub.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsub", description="Replicated subscriptions for NATS JetStream."
    )
    parser.add_argument("--version", action="version", version=f"rsub {sidecar.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (remote, topology, run):
        group.register(subparsers)
    for extension in entry_points(group=EXTENSION_GROUP):
        extension.load()(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return result
