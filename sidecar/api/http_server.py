"""The sidecar's HTTP endpoints (aiohttp): /healthz, /readyz and /metrics.

/healthz answers from the event loop that runs the sidecar, so an answer at all proves the
process is alive and its loop is not blocked; a blocked loop makes the probe time out.
"""

from __future__ import annotations

import structlog
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from sidecar.api.backend import SidecarBackend
from sidecar.api.errors import ListenError
from sidecar.api.metrics import SidecarMetrics
from sidecar.config import split_host_port

log = structlog.get_logger(__name__)


class HttpServerHandle:
    """A running HTTP server: `port` is the bound port (useful with port 0)."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self._runner = runner
        self.port = port

    async def stop(self) -> None:
        await self._runner.cleanup()
        log.info("http_server_stopped", port=self.port)


def build_app(backend: SidecarBackend, metrics: SidecarMetrics) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_request: web.Request) -> web.Response:
        readiness = backend.readiness
        body = {
            "ready": readiness.ready,
            "missing": readiness.missing(),
            "leader": backend.is_leader,
        }
        return web.json_response(body, status=200 if readiness.ready else 503)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        # OpenMetrics when the scraper asks for it (Prometheus does), text format otherwise.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(metrics.registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    return app


async def start_http_server(
    backend: SidecarBackend, metrics: SidecarMetrics, listen: str
) -> HttpServerHandle:
    """Serve the endpoints on `listen` ("host:port"; port 0 picks a free port)."""
    host, port = split_host_port(listen)
    runner = web.AppRunner(build_app(backend, metrics), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as error:
        await runner.cleanup()
        raise ListenError(
            f"HTTP server cannot listen on {listen!r} (http.listen): {error}"
        ) from error
    bound = runner.addresses[0][1]
    log.info("http_server_started", listen=listen, port=bound)
    return HttpServerHandle(runner, int(bound))
