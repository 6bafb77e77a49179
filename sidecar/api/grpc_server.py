"""The sidecar's gRPC server (grpc.aio): CursorService, AdminService, health and reflection.

Requests are validated here before the backend sees them; `sidecar.runtime.errors` exceptions
from validation or from the backend become gRPC status codes in `status_of`, and nowhere
else. With a bearer token configured, every AdminService method and CommitCursor require
`authorization: Bearer <token>` metadata; the other reads stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api import convert
from sidecar.api.backend import SidecarBackend
from sidecar.api.errors import ListenError
from sidecar.api.validation import require_name
from sidecar.config.schema import GrpcTlsConfig
from sidecar.metrics import SidecarMetrics
from sidecar.runtime.errors import (
    ApiError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotLeader,
    Unavailable,
)

log = structlog.get_logger(__name__)

CURSOR_SERVICE = api_pb2.DESCRIPTOR.services_by_name["CursorService"].full_name
ADMIN_SERVICE = api_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
_PROTECTED_METHODS = frozenset(
    [f"/{CURSOR_SERVICE}/CommitCursor"]
    + [
        f"/{ADMIN_SERVICE}/{m.name}"
        for m in api_pb2.DESCRIPTOR.services_by_name["AdminService"].methods
    ]
)

_STATUS_CODES: dict[type[ApiError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    NotLeader: grpc.StatusCode.FAILED_PRECONDITION,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(error: ApiError) -> grpc.StatusCode:
    """The gRPC status code for an API error (INTERNAL for an unmapped subclass)."""
    for cls in type(error).__mro__:
        code = _STATUS_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, detail: str) -> NoReturn:
    await context.abort(code, detail)
    raise AssertionError("grpc.aio ServicerContext.abort returned instead of raising")


async def _abort_for(context: grpc.aio.ServicerContext, error: Exception, method: str) -> NoReturn:
    if isinstance(error, ApiError):
        await _abort(context, status_of(error), error.message)
    log.error("rpc_failed", method=method, exc_info=error)
    await _abort(context, grpc.StatusCode.INTERNAL, "internal error; see sidecar logs")


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Self = TypeVar("_Self")


def _unary(
    method: Callable[[_Self, _Req], Awaitable[_Resp]],
) -> Callable[[_Self, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]:
    """Adapt `method(self, request)` into a grpc.aio handler that maps errors to statuses."""

    @functools.wraps(method)
    async def handler(self: _Self, request: _Req, context: grpc.aio.ServicerContext) -> _Resp:
        try:
            return await method(self, request)
        except Exception as error:
            await _abort_for(context, error, method.__name__)

    return handler


class _CursorService(api_pb2_grpc.CursorServiceServicer):  # type: ignore[misc]
    def __init__(self, backend: SidecarBackend, metrics: SidecarMetrics) -> None:
        self._backend = backend
        self._metrics = metrics

    @_unary
    async def GetSubscription(self, request: Any) -> Any:
        view = await self._backend.get_subscription(
            require_name("stream", request.stream),
            require_name("subscription", request.subscription),
        )
        return convert.subscription_to_proto(view, api_pb2.GetSubscriptionResponse)

    @_unary
    async def ListSubscriptions(self, request: Any) -> Any:
        views = await self._backend.list_subscriptions(require_name("stream", request.stream))
        return api_pb2.ListSubscriptionsResponse(
            subscriptions=[
                convert.subscription_to_proto(v, api_pb2.SubscriptionState) for v in views
            ]
        )

    @_unary
    async def ListSnapshots(self, request: Any) -> Any:
        views = await self._backend.list_snapshots(require_name("stream", request.stream))
        return api_pb2.ListSnapshotsResponse(
            snapshots=[convert.snapshot_to_proto(v) for v in views]
        )

    async def WatchSubscription(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            views = self._backend.watch_subscription(
                require_name("stream", request.stream),
                require_name("subscription", request.subscription),
            )
            async for view in views:
                yield convert.subscription_to_proto(view, api_pb2.WatchSubscriptionResponse)
        except Exception as error:
            await _abort_for(context, error, "WatchSubscription")

    @_unary
    async def CommitCursor(self, request: Any) -> Any:
        try:
            stream = require_name("stream", request.stream)
            subscription = require_name("subscription", request.subscription)
            mark_delete = await self._backend.commit_cursor(stream, subscription, request.sequence)
        except Exception as error:
            # A bad or unknown stream name is counted under "": no series per name sent.
            named = not isinstance(error, InvalidArgument | NotFound)
            code = status_of(error) if isinstance(error, ApiError) else grpc.StatusCode.INTERNAL
            self._metrics.cursor_commit(request.stream if named else "", code.name.lower())
            raise
        self._metrics.cursor_commit(stream, "ok")
        return api_pb2.CommitCursorResponse(mark_delete=mark_delete)


class _AdminService(api_pb2_grpc.AdminServiceServicer):  # type: ignore[misc]
    def __init__(self, backend: SidecarBackend) -> None:
        self._backend = backend

    @_unary
    async def Status(self, request: Any) -> Any:
        return convert.status_to_proto(await self._backend.status())

    @_unary
    async def TriggerSnapshot(self, request: Any) -> Any:
        stream = require_name("stream", request.stream)
        return api_pb2.TriggerSnapshotResponse(
            snapshot_id=await self._backend.trigger_snapshot(stream)
        )

    @_unary
    async def SetReplicated(self, request: Any) -> Any:
        stream = require_name("stream", request.stream)
        subscription = require_name("subscription", request.subscription)
        view = await self._backend.set_replicated(stream, subscription, request.replicated)
        return api_pb2.SetReplicatedResponse(
            subscription=convert.subscription_to_proto(view, api_pb2.SubscriptionState)
        )

    @_unary
    async def ResetCursor(self, request: Any) -> Any:
        stream = require_name("stream", request.stream)
        subscription = require_name("subscription", request.subscription)
        reset = await self._backend.reset_cursor(stream, subscription, request.sequence)
        return api_pb2.ResetCursorResponse(
            previous_sequence=reset.previous_sequence, sequence=reset.sequence
        )


class _BearerTokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        if handler_call_details.method not in _PROTECTED_METHODS:
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        header = metadata.get("authorization")
        if header is None:
            return _rejecting(
                grpc.StatusCode.UNAUTHENTICATED,
                "this method needs 'authorization: Bearer <token>' metadata",
            )
        scheme, _, token = str(header).partition(" ")
        if scheme.lower() != "bearer" or not token:
            return _rejecting(
                grpc.StatusCode.UNAUTHENTICATED, "authorization metadata must be 'Bearer <token>'"
            )
        if not hmac.compare_digest(token.encode(), self._token):
            return _rejecting(grpc.StatusCode.PERMISSION_DENIED, "the bearer token is not valid")
        return await continuation(handler_call_details)


def _rejecting(code: grpc.StatusCode, detail: str) -> Any:
    # Every protected method is unary-unary; the request is never read, so no deserializer.
    async def reject(_request: bytes, context: grpc.aio.ServicerContext) -> NoReturn:
        await _abort(context, code, detail)

    return grpc.unary_unary_rpc_method_handler(reject)


def _server_credentials(tls: GrpcTlsConfig) -> grpc.ServerCredentials:
    """TLS from the configuration; a client CA turns on mutual TLS (client certs required)."""
    if tls.cert_file is None or tls.key_file is None:
        raise ValueError("gRPC TLS needs both cert_file and key_file")
    client_ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


class GrpcServerHandle:
    """A running server: `port` is the bound port (useful with port 0)."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        health: HealthServicer,
        health_task: asyncio.Task[None],
    ) -> None:
        self.server = server
        self.port = port
        self._health = health
        self._health_task = health_task

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, then stop; in-flight calls get `grace` seconds to finish."""
        await self._health.enter_graceful_shutdown()
        self._health_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._health_task
        await self.server.stop(grace)
        log.info("grpc_server_stopped", port=self.port)


_HEALTH_SERVICES = ("", CURSOR_SERVICE, ADMIN_SERVICE)


async def _set_health(health: HealthServicer, ready: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if ready
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for service in _HEALTH_SERVICES:
        await health.set(service, status)


async def _track_readiness(
    backend: SidecarBackend, health: HealthServicer, published: bool, interval_s: float
) -> None:
    """Mirror `backend.readiness` into the health service (polled: the runtime owes no hook)."""
    while True:
        await asyncio.sleep(interval_s)
        ready = backend.readiness.ready
        if ready != published:
            await _set_health(health, ready)
            log.info("grpc_health_changed", serving=ready)
            published = ready


async def start_grpc_server(
    backend: SidecarBackend,
    listen: str,
    *,
    auth_token: str | None = None,
    tls: GrpcTlsConfig | None = None,
    health_poll_interval_s: float = 0.5,
    metrics: SidecarMetrics | None = None,
) -> GrpcServerHandle:
    """Serve the API on `listen` ("host:port"; port 0 picks a free port).

    TLS is on when `tls` is given and enabled (`tls.cert_file` set). Cursor commits are
    counted in `metrics` (the sidecar's; a registry of the server's own when none is given).
    """
    credentials = _server_credentials(tls) if tls is not None and tls.enabled else None
    interceptors = [_BearerTokenAuth(auth_token)] if auth_token else []
    server = grpc.aio.server(interceptors=interceptors)
    api_pb2_grpc.add_CursorServiceServicer_to_server(
        _CursorService(backend, metrics or SidecarMetrics()), server
    )
    api_pb2_grpc.add_AdminServiceServicer_to_server(_AdminService(backend), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            CURSOR_SERVICE,
            ADMIN_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as error:
        raise ListenError(
            f"gRPC server cannot listen on {listen!r} (grpc.listen): {error}"
        ) from error
    ready = backend.readiness.ready
    await _set_health(health, ready)
    await server.start()
    health_task = asyncio.create_task(
        _track_readiness(backend, health, ready, health_poll_interval_s), name="grpc-health"
    )
    log.info(
        "grpc_server_started",
        listen=listen,
        port=port,
        tls=credentials is not None,
        auth=bool(auth_token),
    )
    return GrpcServerHandle(server, port, health, health_task)
