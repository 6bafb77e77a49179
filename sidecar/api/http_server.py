"""The sidecar's HTTP endpoints (aiohttp): /healthz, /readyz and /metrics.

/healthz answers from the event loop that runs the sidecar, so an answer at all proves the
process is alive and its loop is not blocked; a blocked loop makes the probe time out.

/metrics is collected, encoded and compressed (gzip or deflate, when the scraper accepts it:
Prometheus asks for gzip) in a thread of its own, one scrape at a time: at thousands of
streams an exposition takes a second of CPU, which on the loop would hold up every lease
renewal, marker and /healthz for as long (bench/bench_metrics_scrape.py). prometheus_client's
metrics are safe to read from another thread (each value and each family's children are
behind a lock), as are the sidecar's own collectors (sidecar/metrics.py).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import structlog
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from sidecar.api.backend import SidecarBackend
from sidecar.api.errors import ListenError
from sidecar.config.schema import split_host_port
from sidecar.metrics import SidecarMetrics

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
    """The endpoints; the app's cleanup stops the thread that encodes the scrapes (a scrape
    under way finishes there, unanswered)."""
    scrapes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsub-metrics")

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_request: web.Request) -> web.Response:
        readiness = backend.readiness
        body = {
            "ready": readiness.ready,
            "missing": readiness.missing(),
            "leader": backend.is_leader,
            # The start's progress: each stream rebuilt serves already (docs/api.md).
            "streams": {"rebuilt": readiness.rebuilt, "total": readiness.streams},
        }
        return web.json_response(body, status=200 if readiness.ready else 503)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        # OpenMetrics when the scraper asks for it (Prometheus does), text format otherwise.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.get_running_loop().run_in_executor(scrapes, encode, metrics.registry)
        # Compressed in the same thread (zlib lets go of the GIL meanwhile), whatever its size.
        response = web.Response(
            body=body,
            headers={"Content-Type": content_type},
            zlib_executor=scrapes,
            zlib_executor_size=0,
        )
        response.enable_compression()
        return response

    async def stop_scrapes(_app: web.Application) -> None:
        scrapes.shutdown(wait=False, cancel_futures=True)

    app = web.Application()
    app.on_cleanup.append(stop_scrapes)
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
