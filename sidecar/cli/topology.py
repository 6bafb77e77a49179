"""`rsub topology apply`: create, check or adopt the streams of virtual streams.

It connects with the sidecar's own connection settings (`NatsConfig`, `connect_options`), so
a cluster the sidecar can use (users, token, creds file, TLS, mutual TLS) can be set up too.
Secrets come from flags or, to keep them out of the process list and shell history, from
`NATS_PASSWORD` / `NATS_TOKEN` (the `RSUB_` prefix belongs to the sidecar's configuration).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import nats

from sidecar.config.checks import ConfigError
from sidecar.config.nats import NatsConfig, nats_settings, renamed
from sidecar.config.secrets import Secret
from sidecar.logs import configure_logging
from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM, VirtualStream
from sidecar.nats.connection import NatsRefused, NatsUnreachable, connect_once, shown_servers
from sidecar.nats.topology import TopologyError, TopologyReport, apply_topology

PASSWORD_ENV = "NATS_PASSWORD"
TOKEN_ENV = "NATS_TOKEN"

# The flag that sets each key of the NATS settings (`NatsConfig`), for its problems.
NATS_FLAGS = {
    "servers": "--servers",
    "user": "--user",
    "password": f"--password (or ${PASSWORD_ENV})",
    "token": "--token",
    "creds_file": "--creds",
    "tls.ca_file": "--tls-ca",
    "tls.cert_file": "--tls-cert",
    "tls.key_file": "--tls-key",
    "tls": "--tls-ca/--tls-cert/--tls-key",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    # The same patterns as the sidecar's streams[].write_stream/read_stream settings.
    apply.add_argument(
        "--write-pattern",
        default=DEFAULT_WRITE_STREAM,
        help="write-stream name over {name} and {region} (default: %(default)s)",
    )
    apply.add_argument(
        "--read-pattern",
        default=DEFAULT_READ_STREAM,
        help="read-stream name over {name} and {region} (default: %(default)s)",
    )
    apply.add_argument("--dry-run", action="store_true", help="report differences only")
    apply.add_argument("--replicas", type=int, help="replicas of streams created (default 1)")
    apply.add_argument(
        "--no-placement",
        action="store_true",
        help="do not place streams in the cluster named like their region",
    )
    apply.add_argument("--json", action="store_true", help="print the reports as JSON")
    auth = apply.add_argument_group("NATS authentication and TLS (one of user, token, creds)")
    auth.add_argument("--user", help="NATS user; its password comes with --password")
    auth.add_argument(
        "--password", help=f"password of --user (default: ${PASSWORD_ENV}, preferred)"
    )
    auth.add_argument("--token", help=f"NATS token (default: ${TOKEN_ENV}, preferred)")
    auth.add_argument("--creds", type=Path, help="credentials file (JWT + nkey)")
    auth.add_argument("--tls-ca", type=Path, help="CA file that signed the servers")
    auth.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    auth.add_argument("--tls-key", type=Path, help="key of --tls-cert")
    apply.set_defaults(handler=run_apply)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def nats_config(args: argparse.Namespace, env: Mapping[str, str]) -> NatsConfig:
    """The connection settings from the flags (secrets also from `env`); ValueError if unusable."""
    password = args.password or (env.get(PASSWORD_ENV) if args.user else None)
    # The token variable only applies when no other method was chosen on the command line.
    token = args.token or (None if args.user or args.creds else env.get(TOKEN_ENV))
    try:
        return nats_settings(
            tuple(_split(args.servers)),
            user=args.user,
            password=Secret(password) if password else None,
            token=Secret(token) if token else None,
            creds_file=args.creds,
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
        )
    except ConfigError as exc:
        raise ValueError(renamed(exc, NATS_FLAGS)) from None


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


async def _apply(args: argparse.Namespace, config: NatsConfig) -> list[TopologyReport]:
    regions = tuple(_split(args.regions))
    vstreams = [
        VirtualStream(
            name, regions, write_pattern=args.write_pattern, read_pattern=args.read_pattern
        )
        for name in args.streams
    ]
    try:
        nc = await connect_once(config, name="rsub-topology")
    except ConfigError as exc:
        raise ValueError(renamed(exc, NATS_FLAGS)) from None
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
        config = nats_config(args, os.environ)
    except ValueError as exc:
        print(f"rsub topology apply: {exc}", file=sys.stderr)
        return 2
    try:
        reports = asyncio.run(_apply(args, config))
    except (TopologyError, ValueError) as exc:
        print(f"rsub topology apply: refused: {exc}", file=sys.stderr)
        return 2
    except (NatsRefused, NatsUnreachable) as exc:
        print(f"rsub topology apply: {exc}", file=sys.stderr)
        return 1
    except (OSError, nats.errors.Error) as exc:
        print(
            f"rsub topology apply: NATS at {shown_servers(config.servers)} failed: {exc!r}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    return 0
