"""The sidecar's cursor API as seen from Spark: where a subscription stands, and commits."""

from __future__ import annotations

import time

import grpc
import structlog

from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc

log = structlog.get_logger(__name__)


class SidecarError(RuntimeError):
    """The sidecar could not answer; the message names the sidecar, stream and subscription."""


class SidecarClient:
    """A small synchronous client of one region's sidecar (CursorService)."""

    def __init__(self, address: str, *, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._channel = grpc.insecure_channel(address)
        self._stub = api_pb2_grpc.CursorServiceStub(self._channel)

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
                f"not found ({detail}); start once with startingOffsets=earliest or latest"
            )
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return SidecarError(f"sidecar {self.address} unreachable during {what}: {detail}")
        return SidecarError(
            f"sidecar {self.address}: {what} for subscription {subscription!r} of stream "
            f"{stream!r} failed with {code.name}: {detail}"
        )

    def mark_delete(self, stream: str, subscription: str) -> int:
        """The subscription's mark-delete position: every sequence <= it is consumed."""
        request = api_pb2.GetSubscriptionRequest(stream=stream, subscription=subscription)
        try:
            state = self._stub.GetSubscription(
                request, timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise self._fail("GetSubscription", stream, subscription, error) from None
        return int(state.mark_delete)

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
        self, stream: str, subscription: str, sequence: int, attempts: int = 3
    ) -> int | None:
        """`commit`, retried with a short back-off; None (logged) when every attempt failed."""
        for attempt in range(1, attempts + 1):
            try:
                return self.commit(stream, subscription, sequence)
            except SidecarError as error:
                log.warning(
                    "rsub.commit_failed",
                    sidecar=self.address,
                    stream=stream,
                    subscription=subscription,
                    sequence=sequence,
                    attempt=attempt,
                    error=str(error),
                )
                if attempt < attempts:
                    time.sleep(0.2 * attempt)
        return None
