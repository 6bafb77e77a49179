"""Human commands that talk to a running sidecar over gRPC.

Reads: `status`, `subscriptions`, `snapshots`. Writes (token when the sidecar has one):
`create-cursor` (an external cursor at 0, for a Spark job: `CommitCursor` with sequence 0),
and the admin writes `trigger-snapshot` (the stream's leader only: a refusal elsewhere
names it), `set-replicated` and `reset-cursor` (any replica). Nothing is retried: each
command makes one call.

Tables for people, `--json` for scripts (keys are the view field names of
`sidecar/runtime/views.py`). Exit codes: 0 ok, 1 the sidecar answered with an error,
2 the sidecar cannot be reached or the options are unusable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sidecar.api.client import SidecarClient, SidecarError, TlsOptionNames
from sidecar.naming import data_filter_of
from sidecar.runtime.views import CursorResetView, SnapshotView, StatusView, SubscriptionView

DEFAULT_SIDECAR = "127.0.0.1:7070"
EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE = 0, 1, 2
_TLS_OPTIONS = TlsOptionNames("--tls-ca", "--tls-cert", "--tls-key")


_Reply = TypeVar("_Reply")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--sidecar",
        metavar="HOST:PORT",
        default=os.environ.get("RSUB_SIDECAR", DEFAULT_SIDECAR),
        help=f"sidecar gRPC address (env RSUB_SIDECAR, default {DEFAULT_SIDECAR})",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument(
        "--token", default=os.environ.get("RSUB_TOKEN"), help="bearer token (env RSUB_TOKEN)"
    )
    common.add_argument("--tls-ca", type=Path, metavar="FILE", help="use TLS, trust this CA")
    common.add_argument("--tls-cert", type=Path, metavar="FILE", help="client certificate (mTLS)")
    common.add_argument("--tls-key", type=Path, metavar="FILE", help="client key (mTLS)")
    common.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")

    status = subparsers.add_parser(
        "status", parents=[common], help="region, leadership and streams of a sidecar"
    )
    status.set_defaults(handler=_status)
    subscriptions = subparsers.add_parser(
        "subscriptions", parents=[common], help="replicated subscriptions of a stream"
    )
    subscriptions.add_argument("stream")
    subscriptions.set_defaults(handler=_subscriptions)
    snapshots = subparsers.add_parser(
        "snapshots", parents=[common], help="completed snapshots kept for a stream"
    )
    snapshots.add_argument("stream")
    snapshots.set_defaults(handler=_snapshots)
    trigger = subparsers.add_parser(
        "trigger-snapshot", parents=[common], help="start a snapshot of a stream now (leader)"
    )
    trigger.add_argument("stream")
    trigger.set_defaults(handler=_trigger_snapshot)
    set_replicated = subparsers.add_parser(
        "set-replicated",
        parents=[common],
        help="turn replication of a durable on or off in this region",
    )
    set_replicated.add_argument("stream")
    set_replicated.add_argument("subscription")
    set_replicated.add_argument("replicated", type=_on_off, help="on or off (or true/false)")
    set_replicated.set_defaults(handler=_set_replicated)
    create_cursor = subparsers.add_parser(
        "create-cursor",
        parents=[common],
        help="create an external cursor at 0 (for a Spark job); an existing one is left as is",
    )
    create_cursor.add_argument("stream")
    create_cursor.add_argument("subscription")
    create_cursor.set_defaults(handler=_create_cursor)
    reset_cursor = subparsers.add_parser(
        "reset-cursor",
        parents=[common],
        help="set an external cursor to SEQUENCE, backwards too (repairs a wrong commit)",
    )
    reset_cursor.add_argument("stream")
    reset_cursor.add_argument("subscription")
    reset_cursor.add_argument("sequence", type=_sequence)
    reset_cursor.set_defaults(handler=_reset_cursor)


_SWITCH_WORDS = {"on": True, "true": True, "off": False, "false": False}


def _on_off(text: str) -> bool:
    try:
        return _SWITCH_WORDS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on, off, true or false, not {text!r}") from None


def _sequence(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected a read-stream sequence (>= 0), not {text!r}")
    return value


# --- commands -----------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    def render(view: StatusView) -> str:
        return _json(dataclasses.asdict(view)) if args.json else _status_text(view)

    return _call(args, lambda client: client.status(), render)


def _subscriptions(args: argparse.Namespace) -> int:
    def render(views: list[SubscriptionView]) -> str:
        if args.json:
            subs = [dataclasses.asdict(v) for v in views]
            return _json({"stream": args.stream, "subscriptions": subs})
        return _subscriptions_text(args.stream, views)

    return _call(args, lambda client: client.subscriptions(args.stream), render)


def _snapshots(args: argparse.Namespace) -> int:
    def render(views: list[SnapshotView]) -> str:
        if args.json:
            snaps = [dataclasses.asdict(v) for v in views]
            return _json({"stream": args.stream, "snapshots": snaps})
        return _snapshots_text(args.stream, views)

    return _call(args, lambda client: client.snapshots(args.stream), render)


def _trigger_snapshot(args: argparse.Namespace) -> int:
    def render(snapshot_id: str) -> str:
        if args.json:
            return _json({"stream": args.stream, "snapshot_id": snapshot_id})
        return snapshot_id

    return _call(args, lambda client: client.trigger_snapshot(args.stream), render)


def _set_replicated(args: argparse.Namespace) -> int:
    def render(view: SubscriptionView) -> str:
        return _json(dataclasses.asdict(view)) if args.json else _subscriptions_table([view])

    return _call(
        args,
        lambda client: client.set_replicated(args.stream, args.subscription, args.replicated),
        render,
    )


def _create_cursor(args: argparse.Namespace) -> int:
    def render(mark_delete: int) -> str:
        where = {"stream": args.stream, "subscription": args.subscription}
        if args.json:
            return _json({**where, "mark_delete": mark_delete})
        return f"external cursor {args.subscription!r} of stream {args.stream!r} at {mark_delete}"

    # Sequence 0 claims nothing consumed: it creates the cursor, or leaves one as it stands.
    return _call(args, lambda client: client.commit(args.stream, args.subscription, 0), render)


def _reset_cursor(args: argparse.Namespace) -> int:
    def render(view: CursorResetView) -> str:
        if args.json:
            return _json(dataclasses.asdict(view))
        return (
            f"external cursor {view.subscription!r} of stream {view.stream!r} reset from "
            f"{view.previous_sequence} to {view.sequence}"
        )

    return _call(
        args,
        lambda client: client.reset_cursor(args.stream, args.subscription, args.sequence),
        render,
    )


# --- connection and errors ----------------------------------------------------------------


def _call(
    args: argparse.Namespace,
    call: Callable[[SidecarClient], _Reply],
    render: Callable[[_Reply], str],
) -> int:
    """Make one `call` on the sidecar of `args` and print `render(reply)`."""
    try:
        with SidecarClient(
            args.sidecar,
            names=_TLS_OPTIONS,
            token=args.token,
            timeout_s=args.timeout,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        ) as client:
            client.wait_connected(args.timeout)
            print(render(call(client)))
    except SidecarError as error:
        if error.code is None:  # no call made: unusable options, or no connection
            print(f"error: {error}", file=sys.stderr)
            return EXIT_UNREACHABLE
        print(f"error: {error.code.name}: {error.details}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# --- rendering ----------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; no trailing blanks."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *rows]
    ]
    return "\n".join(lines)


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _age(ms: int | None) -> str:
    return "never" if ms is None else f"{ms / 1000:.1f}s ago"


def _time(unix_ms: int | None) -> str:
    if unix_ms is None:
        return "never"
    moment = datetime.fromtimestamp(unix_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _status_text(view: StatusView) -> str:
    header = table(
        ("region", view.region),
        [
            ("regions", ", ".join(view.regions)),
            ("replica", view.holder),
            ("leads", f"{sum(s.leads for s in view.streams)} of {len(view.streams)} streams"),
            ("nats", "connected" if view.connected else "DISCONNECTED"),
            ("version", view.version),
        ],
    )
    if not view.streams:
        return f"{header}\n\nno streams (none listed, none discovered yet)"
    streams = table(
        (
            "STREAM",
            "LEADER",
            "EPOCH",
            "WRITE STREAM",
            "READ STREAM",
            "LAST SNAPSHOT",
            "PENDING",
            "REPLICATED SUBS",
            "FROM",
        ),
        [
            (
                s.stream,
                f"{s.leader_holder} (this replica)" if s.leads else s.leader_holder or "unknown",
                str(s.leader_epoch),
                s.write_stream,
                s.read_stream,
                _age(s.last_snapshot_age_ms),
                _yes_no(s.snapshot_pending),
                str(s.replicated_subscriptions),
                "discovery" if s.discovered else "config",
            )
            for s in view.streams
        ],
    )
    sources = table(
        ("STREAM", "SOURCE", "ACTIVE", "LAST MARKER", "LAG (MESSAGES)"),
        [
            (
                s.stream,
                link.origin_region,
                _yes_no(link.active),
                _age(link.last_marker_age_ms),
                str(link.lag_messages),
            )
            for s in view.streams
            for link in s.sources
        ],
    )
    return f"{header}\n\n{streams}\n\n{sources}"


def _subscriptions_text(stream: str, views: Sequence[SubscriptionView]) -> str:
    if not views:
        return f"no replicated subscriptions on stream {stream!r}"
    return _subscriptions_table(views)


def _subscriptions_table(views: Sequence[SubscriptionView]) -> str:
    """The table, then a warning line per durable that receives the markers, and per
    subscription consumed in two regions at once."""
    warnings = [
        f"warning: {v.subscription!r} is consumed in {len(v.consumed_in)} regions at once "
        f"({', '.join(v.consumed_in)}): each delivers every message (docs/protocol.md §8)"
        for v in views
        if len(v.consumed_in) > 1
    ] + [
        f"warning: durable {v.subscription!r} receives the markers of stream {v.stream!r}: its "
        f"filter lets them through; filter it on {data_filter_of(v.stream)!r} "
        "(docs/topology.md)"
        for v in views
        if v.receives_markers
    ]
    return "\n".join([_table_of(views), *warnings])


def _table_of(views: Sequence[SubscriptionView]) -> str:
    return table(
        (
            "SUBSCRIPTION",
            "KIND",
            "REPLICATED",
            "MARK-DELETE",
            "LAST SNAPSHOT",
            "AT",
            "UPDATE SENT",
            "CACHED",
            "EXPOSURE",
            "APPLIED FROM",
        ),
        [
            (
                v.subscription,
                v.kind.value,
                _yes_no(v.replicated),
                str(v.mark_delete),
                v.last_snapshot_id or "-",
                str(v.last_snapshot_local) if v.last_snapshot_id else "-",
                _time(v.last_update_sent_unix_ms),
                str(v.cached_snapshots),
                "-" if v.failover_exposure is None else str(v.failover_exposure),
                " ".join(f"{a.from_region}@{a.position}" for a in v.applied) or "-",
            )
            for v in views
        ],
    )


def _snapshots_text(stream: str, views: Sequence[SnapshotView]) -> str:
    if not views:
        return f"no snapshots kept for stream {stream!r}"
    return table(
        ("SNAPSHOT", "LOCAL", "POSITIONS", "COMPLETED", "DURATION"),
        [
            (
                v.id,
                str(v.local_position),
                " ".join(f"{region}={pos}" for region, pos in sorted(v.positions.items())),
                _time(v.completed_unix_ms),
                f"{v.duration_ms}ms",
            )
            for v in views
        ],
    )
