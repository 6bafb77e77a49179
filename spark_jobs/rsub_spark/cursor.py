"""The sidecar's cursor API as seen from Spark: where a subscription stands, and commits.

A query's progress goes to an external cursor (`rsub create-cursor`, or its first commit,
creates it), never to a durable consumer: a subscription the sidecar knows as a durable is
refused when the query starts (`check_cursor`, and `subscription` for a start from it),
before any batch runs, with what to do instead.

A commit is retried only while the failure may pass (`RETRYABLE`: the sidecar unreachable
or restarting, NATS down, the call too slow); any other answer is final. A commit that does
not take effect is never reported as one: it raises `CursorCommitError`, is logged as
`rsub.cursor_commit_failed` with its status code and counted in `commit_failures`.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import structlog

from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.client import TlsOptionNames, call_metadata, open_channel
from sidecar.protocol import SubscriptionKind
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions

log = structlog.get_logger(__name__)

_TLS_OPTIONS = TlsOptionNames("sidecarTlsCa", "sidecarTlsCert", "sidecarTlsKey")


RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Status codes worth another attempt: the same call may succeed a moment later."""


class SidecarError(RuntimeError):
    """The sidecar could not answer; the message names the sidecar, stream and subscription,
    `code` is the call's gRPC status (None when no call was made)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class CursorCommitError(SidecarError):
    """A commit of `sequence` that did not take effect, after `attempts` calls."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None, sequence: int, attempts: int
    ) -> None:
        super().__init__(message, code)
        self.sequence = sequence
        self.attempts = attempts


class SidecarClient:
    """A small synchronous client of one region's sidecar (CursorService).

    TLS when `tls_ca` is given (with `tls_cert`/`tls_key` for mutual TLS); a file that cannot
    be read fails here with SidecarError naming the Spark option.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._metadata = call_metadata(token)
        try:
            self._channel = open_channel(
                address, _TLS_OPTIONS, ca=tls_ca, cert=tls_cert, key=tls_key
            )
        except ValueError as error:
            raise SidecarError(f"sidecar {address}: option {error}") from None
        self._stub = api_pb2_grpc.CursorServiceStub(self._channel)
        self.commit_failures = 0
        """Commits that did not take effect (`commit_with_retries` raised), since creation."""

    @classmethod
    def for_options(cls, opts: RsubOptions) -> SidecarClient:
        """The client of the sidecar that `opts` names (token, timeout and TLS included)."""
        if opts.sidecar is None:
            raise RsubOptionError("option sidecar is required to reach the sidecar")
        return cls(
            opts.sidecar,
            token=opts.sidecar_token.reveal() if opts.sidecar_token is not None else None,
            timeout_s=opts.timeout_ms / 1000,
            tls_ca=opts.sidecar_tls_ca,
            tls_cert=opts.sidecar_tls_cert,
            tls_key=opts.sidecar_tls_key,
        )

    def close(self) -> None:
        self._channel.close()

    def _fail(
        self, what: str, stream: str, subscription: str, error: grpc.RpcError
    ) -> SidecarError:
        code = error.code()
        detail = error.details()
        if code == grpc.StatusCode.NOT_FOUND:
            return SidecarError(
                f"sidecar {self.address}: subscription {subscription!r} of stream {stream!r} "
                f"not found ({detail}); create its cursor with `{self._create_cursor(stream)}` "
                "or start once with startingOffsets=earliest or latest",
                code,
            )
        if code in RETRYABLE:
            return SidecarError(
                f"sidecar {self.address} unreachable during {what} ({code.name}): {detail}", code
            )
        return SidecarError(
            f"sidecar {self.address}: {what} for subscription {subscription!r} of stream "
            f"{stream!r} failed with {code.name}: {detail}",
            code,
        )

    def _create_cursor(self, stream: str, name: str = "NAME") -> str:
        """The command that creates an external cursor of `stream` on this sidecar."""
        return f"rsub create-cursor {stream} {name} --sidecar {self.address}"

    def _state(self, stream: str, subscription: str) -> api_pb2.GetSubscriptionResponse:
        request = api_pb2.GetSubscriptionRequest(stream=stream, subscription=subscription)
        try:
            state: api_pb2.GetSubscriptionResponse = self._stub.GetSubscription(
                request, timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise self._fail("GetSubscription", stream, subscription, error) from None
        return state

    def _require_cursor(self, state: api_pb2.GetSubscriptionResponse) -> None:
        """Refuse a subscription the sidecar knows as a durable consumer."""
        if state.kind == SubscriptionKind.DURABLE.value:
            raise RsubOptionError(
                f"option subscription: {state.subscription!r} is a durable consumer of stream "
                f"{state.stream!r} (sidecar {self.address}), not an external cursor: a Spark "
                "query commits its progress to an external cursor of its own. Create one once "
                f"with `{self._create_cursor(state.stream)}` (add --token when the sidecar has "
                "one; CursorService.CommitCursor with sequence 0 does the same) and name it in "
                "option subscription (docs/spark.md)"
            )

    def subscription(self, stream: str, subscription: str) -> tuple[int, dict[str, int]]:
        """The subscription's mark-delete position (every sequence <= it is consumed) and its
        progress vector (origin region -> highest origin sequence consumed somewhere).
        Raises `RsubOptionError` for a durable consumer (a query commits to a cursor)."""
        state = self._state(stream, subscription)
        self._require_cursor(state)
        return int(state.mark_delete), dict(state.progress)

    def check_cursor(self, stream: str, subscription: str) -> None:
        """Raise `RsubOptionError` when the sidecar knows `subscription` as a durable consumer:
        every commit to it would fail, from the first batch on. An absent one is fine (the
        first commit creates the cursor); when the sidecar cannot answer now, the check is
        logged as skipped (`rsub.cursor_check_skipped`) and commits report what they meet."""
        try:
            state = self._state(stream, subscription)
        except SidecarError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return
            if error.code in RETRYABLE:
                log.warning(
                    "rsub.cursor_check_skipped",
                    sidecar=self.address,
                    stream=stream,
                    subscription=subscription,
                    error=str(error),
                )
                return
            raise
        self._require_cursor(state)

    def commit(self, stream: str, subscription: str, sequence: int) -> int:
        """Moves the subscription's cursor to `sequence`; returns the cursor after the commit."""
        request = api_pb2.CommitCursorRequest(
            stream=stream, subscription=subscription, sequence=sequence
        )
        try:
            reply = self._stub.CommitCursor(
                request, timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise self._fail("CommitCursor", stream, subscription, error) from None
        return int(reply.mark_delete)

    def commit_with_retries(
        self,
        stream: str,
        subscription: str,
        sequence: int,
        *,
        attempts: int = 3,
        backoff_s: float = 0.2,
    ) -> int:
        """`commit`, called again after `backoff_s`, then twice that, ... while it fails with a
        `RETRYABLE` code, at most `attempts` times; returns the cursor after the commit.

        Raises `CursorCommitError` at the first other failure or after the last attempt.
        """
        attempt = 1
        while True:
            try:
                return self.commit(stream, subscription, sequence)
            except SidecarError as error:
                code = error.code
                fields = {
                    "sidecar": self.address,
                    "stream": stream,
                    "subscription": subscription,
                    "sequence": sequence,
                    "code": code.name if code is not None else None,
                    "attempt": attempt,
                }
                if code not in RETRYABLE or attempt >= attempts:
                    self.commit_failures += 1
                    log.error("rsub.cursor_commit_failed", **fields, error=str(error))
                    raise CursorCommitError(
                        f"commit of sequence {sequence} did not take effect "
                        f"({attempt} attempt(s)): {error}",
                        code,
                        sequence,
                        attempt,
                    ) from None
                delay_s = backoff_s * 2 ** (attempt - 1)
                log.warning("rsub.cursor_commit_retrying", **fields, retry_in_s=delay_s)
                time.sleep(delay_s)
                attempt += 1
