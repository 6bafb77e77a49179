"""The sidecar's cursor API as seen from Spark: where a subscription stands, and commits.

A query's progress goes to an external cursor (`rsub create-cursor`, or its first commit,
creates it), never to a durable consumer: a subscription the sidecar knows as a durable is
refused when the query starts (`check_cursor`, and `cursor_position` for a start from it),
before any batch runs, with what to do instead.

The client is the sidecar's one client (`sidecar.api.client.SidecarClient`): a commit is
retried only while the failure may pass, and one that does not take effect is never reported
as one (`SidecarClient.commit_with_retries`).
"""

from __future__ import annotations

import grpc
import structlog

from sidecar.api.client import RETRYABLE, SidecarClient, SidecarError, TlsOptionNames
from sidecar.exact import Progress
from sidecar.protocol import SubscriptionKind
from sidecar.runtime.views import SubscriptionView
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions

log = structlog.get_logger(__name__)

_TLS_OPTIONS = TlsOptionNames(
    "option sidecarTlsCa", "option sidecarTlsCert", "option sidecarTlsKey"
)


def sidecar_client(opts: RsubOptions) -> SidecarClient:
    """The client of the sidecar that `opts` names (token, timeout and TLS included); a TLS
    file that cannot be used fails here with `SidecarError` naming the option."""
    if opts.sidecar is None:
        raise RsubOptionError("option sidecar is required to reach the sidecar")
    return SidecarClient(
        opts.sidecar,
        names=_TLS_OPTIONS,
        token=opts.sidecar_token.reveal() if opts.sidecar_token is not None else None,
        timeout_s=opts.timeout_ms / 1000,
        tls_ca=opts.sidecar_tls_ca,
        tls_cert=opts.sidecar_tls_cert,
        tls_key=opts.sidecar_tls_key,
    )


def _require_cursor(client: SidecarClient, view: SubscriptionView) -> None:
    """Refuse a subscription the sidecar knows as a durable consumer."""
    if view.kind is SubscriptionKind.DURABLE:
        raise RsubOptionError(
            f"option subscription: {view.subscription!r} is a durable consumer of stream "
            f"{view.stream!r} (sidecar {client.address}), not an external cursor: a Spark "
            "query commits its progress to an external cursor of its own. Create one once "
            f"with `{client.create_cursor_command(view.stream)}` (add --token when the sidecar "
            "has one; CursorService.CommitCursor with sequence 0 does the same) and name it in "
            "option subscription (docs/spark.md)"
        )


def cursor_position(client: SidecarClient, stream: str, subscription: str) -> tuple[int, Progress]:
    """The cursor's mark-delete position (every sequence <= it is consumed) and its progress
    (origin region -> highest origin sequence consumed somewhere, with the ranges acked above
    other regions' floors). Raises `RsubOptionError` for a durable consumer (a query commits
    to a cursor)."""
    view = client.subscription(stream, subscription)
    _require_cursor(client, view)
    return view.mark_delete, Progress(view.progress, view.acked)


def check_cursor(client: SidecarClient, stream: str, subscription: str) -> None:
    """Raise `RsubOptionError` when the sidecar knows `subscription` as a durable consumer:
    every commit to it would fail, from the first batch on. An absent one is fine (the
    first commit creates the cursor); when the sidecar cannot answer now, the check is
    logged as skipped (`rsub.cursor_check_skipped`) and commits report what they meet."""
    try:
        view = client.subscription(stream, subscription)
    except SidecarError as error:
        if error.code == grpc.StatusCode.NOT_FOUND:
            return
        if error.code in RETRYABLE:
            log.warning(
                "rsub.cursor_check_skipped",
                sidecar=client.address,
                stream=stream,
                subscription=subscription,
                error=str(error),
            )
            return
        raise
    _require_cursor(client, view)
