"""`Service`: a sidecar's `Runtime` serving the API, what `rsub run` runs.

The runtime (`sidecar.runtime.Runtime`) knows nothing of the servers; this layer starts the
gRPC and HTTP servers around it, over its backend (`Runtime.backend`) and its metrics::

    service = Service(config)          # a Runtime that also serves (serve=False: it does not)
    await service.start()              # serve gRPC + HTTP (not ready yet), then the bring-up
    service.grpc_port, service.http_port   # bound ports (listen on port 0 to get free ones)
    await service.stop()               # stop serving, then stop the runtime

`start` raises `ListenError` when a server cannot listen (what started is stopped by `stop`).
"""

from __future__ import annotations

from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.api.http_server import HttpServerHandle, start_http_server
from sidecar.config.schema import Config
from sidecar.metrics import SidecarMetrics
from sidecar.runtime import Runtime

# How long calls in flight may take to finish once the gRPC server stops.
_GRPC_GRACE_S = 1.0


class Service(Runtime):
    def __init__(
        self,
        config: Config,
        *,
        holder: str | None = None,
        apply_topology: bool = True,
        serve: bool = True,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        super().__init__(config, holder=holder, apply_topology=apply_topology, metrics=metrics)
        self._serve = serve
        self._grpc: GrpcServerHandle | None = None
        self._http: HttpServerHandle | None = None

    @property
    def grpc_port(self) -> int | None:
        return self._grpc.port if self._grpc is not None else None

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    async def start(self) -> None:
        """Serve the API (not ready yet), then bring everything up in the background."""
        if self._serve:
            grpc_cfg = self.config.grpc
            token = grpc_cfg.auth_token.reveal() if grpc_cfg.auth_token is not None else None
            self._grpc = await start_grpc_server(
                self.backend,
                grpc_cfg.listen,
                auth_token=token,
                tls=grpc_cfg.tls,
                metrics=self.metrics,
            )
            self._http = await start_http_server(
                self.backend, self.metrics, self.config.http.listen
            )
        await super().start()

    async def stop(self) -> None:
        """Stop serving, then stop the runtime (idempotent)."""
        if self._grpc is not None:
            await self._grpc.stop(_GRPC_GRACE_S)
            self._grpc = None
        if self._http is not None:
            await self._http.stop()
            self._http = None
        await super().stop()
