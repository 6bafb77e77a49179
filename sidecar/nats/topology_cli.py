"""`rsub topology apply`: create, check or adopt the streams of virtual streams."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import nats

from sidecar.logs import configure_logging
from sidecar.nats.names import VirtualStream
from sidecar.nats.topology import TopologyError, TopologyReport, apply_topology


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("topology", help="manage the streams of virtual streams")
    commands = group.add_subparsers(dest="topology_command", required=True, metavar="COMMAND")
    apply = commands.add_parser(
        "apply",
        help="create, update or adopt write and read streams",
        description="Bring the write and read streams of each virtual stream to rsub's layout. "
        "Existing streams are adopted in place or refused with a reason.",
    )
    apply.add_argument("--servers", required=True, help="NATS URLs, comma-separated")
    apply.add_argument("--regions", required=True, help="region names, comma-separated")
    apply.add_argument(
        "--stream", action="append", required=True, dest="streams", help="virtual stream name"
    )
    apply.add_argument("--dry-run", action="store_true", help="report differences only")
    apply.add_argument("--replicas", type=int, help="replicas of streams created (default 1)")
    apply.add_argument(
        "--no-placement",
        action="store_true",
        help="do not place streams in the cluster named like their region",
    )
    apply.add_argument("--json", action="store_true", help="print the reports as JSON")
    apply.set_defaults(handler=run_apply)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def format_report(report: TopologyReport) -> str:
    head = f"virtual stream {report.vstream}" + (" (dry run)" if report.dry_run else "")
    lines = [head]
    for s in report.streams:
        action = (
            s.action if not report.dry_run or s.action == "unchanged" else f"would be {s.action}"
        )
        detail = f" ({', '.join(s.fields)})" if s.fields and s.action == "updated" else ""
        lines.append(f"  {s.role:5} {s.stream}: {action}{detail}")
        lines.extend(f"        {note}" for note in s.notes)
    return "\n".join(lines)


async def _apply(args: argparse.Namespace) -> list[TopologyReport]:
    vstreams = [VirtualStream(name, tuple(_split(args.regions))) for name in args.streams]
    nc = await nats.connect(
        servers=_split(args.servers), connect_timeout=5, max_reconnect_attempts=2
    )
    reports: list[TopologyReport] = []
    try:
        for vs in vstreams:
            report = await apply_topology(
                nc,
                vs,
                cluster_for_region=(lambda r: None) if args.no_placement else (lambda r: r),
                replicas=args.replicas,
                dry_run=args.dry_run,
            )
            reports.append(report)
            if not args.json:
                # Printed at once: a later refusal must not hide what was already applied.
                print(format_report(report), flush=True)
    finally:
        await nc.close()
    return reports


def run_apply(args: argparse.Namespace) -> int:
    # The report is the output; logs go to stderr so that --json stays parseable.
    configure_logging(level="warning", stream=sys.stderr)
    try:
        reports = asyncio.run(_apply(args))
    except (TopologyError, ValueError) as exc:
        print(f"rsub topology apply: refused: {exc}", file=sys.stderr)
        return 2
    except (OSError, nats.errors.Error) as exc:
        print(f"rsub topology apply: cannot reach NATS at {args.servers}: {exc!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    return 0
