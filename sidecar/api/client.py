"""The one client of a sidecar's gRPC API: `rsub` commands, the Spark source, the exact
client and the devtools alike.

`SidecarClient` is synchronous (a command, a Spark driver; asyncio code calls it through
`asyncio.to_thread`) and answers with the runtime's views, converted from the wire by
`sidecar.api.convert`. Every failure is a `SidecarError` naming the sidecar, with the call's
gRPC status as `code` (None when no call was made). A commit is retried only while the
failure may pass (`commit_with_retries`, `RETRYABLE`); nothing else is retried.

The channel is insecure, or TLS trusting a private CA, optionally with a client certificate
(mutual TLS); the bearer token travels as call metadata, which is what the server checks.
Files are read when the client is made, so a wrong path fails before any call with a message
naming the caller's option (`--tls-ca` for the command line, `sidecarTlsCa` for Spark).
"""

from __future__ import annotations

import queue
import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, TypeVar

import grpc
import structlog

from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api import convert
from sidecar.runtime.views import CursorResetView, SnapshotView, StatusView, SubscriptionView

log = structlog.get_logger(__name__)

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Status codes worth another attempt: the same call may succeed a moment later."""

_Reply = TypeVar("_Reply")


class TlsOptionNames(NamedTuple):
    """How the caller calls its CA, certificate and key options, for error messages."""

    ca: str
    cert: str
    key: str


PLAIN_NAMES = TlsOptionNames("tls_ca", "tls_cert", "tls_key")
"""The TLS options named as `SidecarClient`'s own arguments."""

# A connection of its own per channel: gRPC otherwise shares one with earlier channels to the
# same address, so a new client behind a Service would keep reaching the same replica.
_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def open_channel(
    address: str,
    names: TlsOptionNames,
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> grpc.Channel:
    """A channel to `address`: TLS when `ca` is given; ValueError naming the bad option."""
    if (cert is None) != (key is None):
        raise ValueError(f"{names.cert} and {names.key} go together")
    if ca is None:
        if cert is not None:
            raise ValueError(f"{names.cert} needs {names.ca}")
        return grpc.insecure_channel(address, options=_OPTIONS)
    root = _read(ca, names.ca)
    _check_pem(root, ca, names.ca)
    chain = private = None
    if cert is not None and key is not None:
        chain, private = _read(cert, names.cert), _read(key, names.key)
        _check_pair(cert, key, names)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root, private_key=private, certificate_chain=chain
    )
    return grpc.secure_channel(address, credentials, options=_OPTIONS)


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of every call: the bearer token when there is one."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _check_pem(data: bytes, path: Path, option: str) -> None:
    """Refuse a CA file that holds no certificate here, naming the option: gRPC would only
    log a C++ error and report the sidecar as unreachable."""
    try:
        ssl.create_default_context().load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{option}: {path} holds no PEM certificate ({_reason(error)})") from None


def _check_pair(cert: Path, key: Path, names: TlsOptionNames) -> None:
    try:
        ssl.create_default_context().load_cert_chain(cert, key)
    except ssl.SSLError as error:
        raise ValueError(
            f"{names.cert}/{names.key}: {cert} and {key} are not a PEM certificate and its "
            f"key ({_reason(error)})"
        ) from None


def _reason(error: Exception) -> str:
    """OpenSSL's words without the source location (`... (_ssl.c:4020)`)."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(error)) or error.__class__.__name__


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"{option}: cannot read {path}: {error.strerror}") from error


class SidecarError(RuntimeError):
    """The sidecar could not answer; the message names the sidecar (and the stream and
    subscription of the call), `code` is the call's gRPC status (None when no call was made:
    unusable TLS files, no connection) and `details` the server's words."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, details: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class CursorCommitError(SidecarError):
    """A commit of `sequence` that did not take effect, after `attempts` calls."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None, sequence: int, attempts: int
    ) -> None:
        super().__init__(message, code)
        self.sequence = sequence
        self.attempts = attempts


class SidecarClient:
    """A client of one sidecar (see the module's docstring); `names` are the caller's names
    of the TLS options, for errors."""

    def __init__(
        self,
        address: str,
        *,
        names: TlsOptionNames = PLAIN_NAMES,
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
            self._channel = open_channel(address, names, ca=tls_ca, cert=tls_cert, key=tls_key)
        except ValueError as error:
            raise SidecarError(str(error)) from None
        self._cursor = api_pb2_grpc.CursorServiceStub(self._channel)
        self._admin = api_pb2_grpc.AdminServiceStub(self._channel)
        self.commit_failures = 0
        """Commits that did not take effect (`commit_with_retries` raised), since creation."""

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def wait_connected(self, timeout_s: float) -> None:
        """Return once connected; raise `SidecarError` (code None) at the first failure or at
        the timeout. (A call would report UNAVAILABLE both for "nothing listens" and for a
        sidecar that answers UNAVAILABLE itself: the two deserve different handling.)"""
        states: queue.Queue[grpc.ChannelConnectivity] = queue.Queue()
        self._channel.subscribe(states.put, try_to_connect=True)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    state = states.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    why = f"no connection within {timeout_s:g}s"
                    raise SidecarError(self._unreachable(why)) from None
                if state is grpc.ChannelConnectivity.READY:
                    return
                if state in (
                    grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                    grpc.ChannelConnectivity.SHUTDOWN,
                ):
                    why = "connection failed (nothing listening, or TLS refused)"
                    raise SidecarError(self._unreachable(why))
        finally:
            self._channel.unsubscribe(states.put)

    def _unreachable(self, why: str) -> str:
        return f"cannot reach the sidecar at {self.address}: {why}"

    def _call(
        self,
        method: Callable[..., _Reply],
        request: object,
        what: str,
        stream: str,
        subscription: str | None = None,
    ) -> _Reply:
        try:
            return method(request, timeout=self._timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            raise self._failed(what, stream, subscription, error) from None

    def _failed(
        self, what: str, stream: str, subscription: str | None, error: grpc.RpcError
    ) -> SidecarError:
        code, detail = error.code(), error.details() or ""
        of = f"subscription {subscription!r} of stream {stream!r}" if subscription else ""
        of = of or (f"stream {stream!r}" if stream else "")
        if code == grpc.StatusCode.NOT_FOUND and subscription:
            return SidecarError(
                f"sidecar {self.address}: {of} not found ({detail}); an external cursor is "
                f"created with `{self.create_cursor_command(stream)}`",
                code,
                detail,
            )
        if code in RETRYABLE:
            return SidecarError(
                f"sidecar {self.address} unreachable during {what} ({code.name}): {detail}",
                code,
                detail,
            )
        return SidecarError(
            f"sidecar {self.address}: {what}{f' for {of}' if of else ''} failed with "
            f"{code.name}: {detail}",
            code,
            detail,
        )

    def create_cursor_command(self, stream: str, name: str = "NAME") -> str:
        """The command that creates an external cursor of `stream` on this sidecar."""
        return f"rsub create-cursor {stream} {name} --sidecar {self.address}"

    # --- reads ---------------------------------------------------------------------------

    def status(self) -> StatusView:
        reply = self._call(self._admin.Status, api_pb2.StatusRequest(), "Status", "")
        return convert.status_from_proto(reply)

    def subscription(self, stream: str, subscription: str) -> SubscriptionView:
        request = api_pb2.GetSubscriptionRequest(stream=stream, subscription=subscription)
        reply = self._call(
            self._cursor.GetSubscription, request, "GetSubscription", stream, subscription
        )
        return convert.subscription_from_proto(reply)

    def subscriptions(self, stream: str) -> list[SubscriptionView]:
        request = api_pb2.ListSubscriptionsRequest(stream=stream)
        reply = self._call(self._cursor.ListSubscriptions, request, "ListSubscriptions", stream)
        return [convert.subscription_from_proto(s) for s in reply.subscriptions]

    def snapshots(self, stream: str) -> list[SnapshotView]:
        request = api_pb2.ListSnapshotsRequest(stream=stream)
        reply = self._call(self._cursor.ListSnapshots, request, "ListSnapshots", stream)
        return [convert.snapshot_from_proto(s) for s in reply.snapshots]

    # --- writes --------------------------------------------------------------------------

    def trigger_snapshot(self, stream: str) -> str:
        """Starts a snapshot of `stream` now (its leader only); returns the snapshot's id."""
        request = api_pb2.TriggerSnapshotRequest(stream=stream)
        reply = self._call(self._admin.TriggerSnapshot, request, "TriggerSnapshot", stream)
        return str(reply.snapshot_id)

    def set_replicated(self, stream: str, subscription: str, on: bool) -> SubscriptionView:
        request = api_pb2.SetReplicatedRequest(
            stream=stream, subscription=subscription, replicated=on
        )
        reply = self._call(
            self._admin.SetReplicated, request, "SetReplicated", stream, subscription
        )
        return convert.subscription_from_proto(reply.subscription)

    def reset_cursor(self, stream: str, subscription: str, sequence: int) -> CursorResetView:
        """Sets an existing external cursor to `sequence`, backwards too."""
        request = api_pb2.ResetCursorRequest(
            stream=stream, subscription=subscription, sequence=sequence
        )
        reply = self._call(self._admin.ResetCursor, request, "ResetCursor", stream, subscription)
        return CursorResetView(stream, subscription, reply.previous_sequence, reply.sequence)

    def commit(self, stream: str, subscription: str, sequence: int) -> int:
        """Moves the subscription's cursor to `sequence` (0: creates it, or leaves it as it
        stands); returns the cursor after the commit."""
        request = api_pb2.CommitCursorRequest(
            stream=stream, subscription=subscription, sequence=sequence
        )
        reply = self._call(self._cursor.CommitCursor, request, "CommitCursor", stream, subscription)
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

        Raises `CursorCommitError` at the first other failure or after the last attempt (logged
        as `rsub.cursor_commit_failed` and counted in `commit_failures`).
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
