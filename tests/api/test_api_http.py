"""The HTTP endpoints and the metrics registry, on a real aiohttp server on port 0."""

from __future__ import annotations

import asyncio
import gzip
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import sidecar
from sidecar.api.http_server import HttpServerHandle, start_http_server
from sidecar.metrics import SidecarMetrics
from sidecar.runtime.views import Readiness
from tests.support.api_fakes import MemoryBackend
from tests.support.clocks import HandClock
from tests.support.metrics_kit import touch_every_metric

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture
def clock() -> HandClock:
    return HandClock()


@pytest.fixture
def metrics(clock: HandClock) -> SidecarMetrics:
    return SidecarMetrics(clock=clock)


@pytest.fixture
async def http(
    backend: MemoryBackend, metrics: SidecarMetrics
) -> AsyncIterator[tuple[HttpServerHandle, aiohttp.ClientSession]]:
    handle = await start_http_server(backend, metrics, "127.0.0.1:0")
    async with aiohttp.ClientSession(f"http://127.0.0.1:{handle.port}") as session:
        yield handle, session
    await handle.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_healthz(http: tuple[HttpServerHandle, aiohttp.ClientSession]) -> None:
    handle, session = http
    assert handle.port > 0
    async with session.get("/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "alive"}


async def test_readyz_reports_what_is_missing(
    http: tuple[HttpServerHandle, aiohttp.ClientSession], backend: MemoryBackend
) -> None:
    _, session = http
    backend.readiness = Readiness(
        connected=False, topology_applied=False, leadership_known=True, rebuilt=3, streams=5
    )
    backend.is_leader = False
    async with session.get("/readyz") as response:
        assert response.status == 503
        assert await response.json() == {
            "ready": False,
            "missing": ["nats_connection", "topology"],
            "leader": False,
            "streams": {"rebuilt": 3, "total": 5},
        }
    backend.readiness = Readiness(connected=True, topology_applied=True, leadership_known=True)
    async with session.get("/readyz") as response:
        assert response.status == 200
        assert (await response.json())["missing"] == []


async def test_metrics_endpoint_serves_the_sidecar_registry(
    http: tuple[HttpServerHandle, aiohttp.ClientSession],
    metrics: SidecarMetrics,
    clock: HandClock,
) -> None:
    _, session = http
    metrics.snapshot_started("orders")
    metrics.snapshot_completed("orders", 0.2)
    metrics.marker_seen("orders", "east")
    metrics.set_leader("orders", True, 7)
    metrics.set_nats_connected(True)
    clock.now += 2.5
    async with session.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        values = samples(await response.text())
    assert values[("rsub_snapshots_started_total", (("stream", "orders"),))] == 1
    assert values[("rsub_snapshot_duration_seconds_count", (("stream", "orders"),))] == 1
    assert values[("rsub_last_snapshot_age_seconds", (("stream", "orders"),))] == 2.5
    key = ("rsub_origin_last_marker_age_seconds", (("origin", "east"), ("stream", "orders")))
    assert values[key] == 2.5
    assert values[("rsub_leader", (("stream", "orders"),))] == 1
    assert values[("rsub_leader_epoch", (("stream", "orders"),))] == 7
    # The process's own figures and the build, but no `*_created` series.
    assert values[("process_cpu_seconds_total", ())] > 0
    assert values[("process_resident_memory_bytes", ())] > 0
    build = [labels for name, labels in values if name == "rsub_build_info"]
    assert build and dict(build[0])["version"] == sidecar.__version__
    assert not any(name.endswith("_created") for name, _ in values)


async def test_metrics_speak_openmetrics_to_a_scraper_that_asks(
    http: tuple[HttpServerHandle, aiohttp.ClientSession], metrics: SidecarMetrics
) -> None:
    _, session = http
    metrics.snapshot_started("orders")
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    async with session.get("/metrics", headers={"Accept": accept}) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await response.text()
    assert text.endswith("# EOF\n")
    assert 'rsub_snapshots_started_total{stream="orders"} 1.0' in text


class WaitingCollector(Collector):
    """A collector whose collection waits (5 s at most) until told to go on, and notes
    whether it was told: a collection holding the event loop waits in vain, since the loop
    cannot answer the /healthz after which the test tells it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go_on = threading.Event()
        self.told: list[bool] = []

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.told.append(self.go_on.wait(5))
        yield GaugeMetricFamily("test_waited", "A collection that waited.", value=1)


async def test_a_scrape_leaves_the_event_loop_free(
    http: tuple[HttpServerHandle, aiohttp.ClientSession], metrics: SidecarMetrics
) -> None:
    _, session = http
    collector = WaitingCollector()
    metrics.registry.register(collector)

    async def scrape() -> str:
        async with session.get("/metrics") as response:
            return await response.text()

    scraping = asyncio.create_task(scrape())
    assert await asyncio.to_thread(collector.entered.wait, 5)
    # Answered while the scrape is being collected.
    async with session.get("/healthz") as response:
        assert response.status == 200
    collector.go_on.set()
    assert "test_waited 1.0" in await scraping
    assert collector.told == [True]


async def test_metrics_are_compressed_for_a_scraper_that_accepts_it(
    http: tuple[HttpServerHandle, aiohttp.ClientSession], metrics: SidecarMetrics
) -> None:
    handle, _ = http
    metrics.snapshot_started("orders")
    line = b'rsub_snapshots_started_total{stream="orders"} 1.0'
    url = f"http://127.0.0.1:{handle.port}/metrics"
    async with aiohttp.ClientSession(auto_decompress=False) as raw:
        # What Prometheus sends.
        async with raw.get(url, headers={"Accept-Encoding": "gzip"}) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert response.headers["Content-Type"].startswith("text/plain")
            assert line in gzip.decompress(await response.read())
        async with raw.get(url, headers={"Accept-Encoding": "identity"}) as response:
            assert "Content-Encoding" not in response.headers
            assert line in await response.read()


def test_every_documented_metric_is_exported(metrics: SidecarMetrics) -> None:
    documented = set(re.findall(r"^\| `(rsub_[a-z_]+)`", DOCS.read_text(), re.MULTILINE))
    touch_every_metric(metrics)
    # Names as queried: counters with their _total suffix, histograms by their base name;
    # the process_* figures are prometheus_client's own (docs/api.md names them as a group).
    exported = {
        f"{f.name}_total" if f.type == "counter" else f.name
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        if f.name.startswith("rsub_")
    }
    assert documented == exported


def test_forget_subscription_drops_its_series(metrics: SidecarMetrics) -> None:
    metrics.set_replay_gap("s", "billing", "east", 12)
    metrics.set_replay_gap("s", "billing", "north", 4)
    metrics.set_replay_gap("s", "audit", "east", 1)
    metrics.forget_subscription("s", "billing")
    text = generate_latest(metrics.registry).decode()
    gaps = {k: v for k, v in samples(text).items() if k[0].startswith("rsub_subscription")}
    assert gaps == {
        (
            "rsub_subscription_replay_gap_messages",
            (("region", "east"), ("stream", "s"), ("subscription", "audit")),
        ): 1
    }


def test_ready_is_read_at_each_scrape(metrics: SidecarMetrics) -> None:
    readiness = [Readiness(connected=False, topology_applied=True, leadership_known=True)]
    metrics.track_readiness(lambda: readiness[-1].ready)

    def ready() -> float:
        return samples(generate_latest(metrics.registry).decode())[("rsub_ready", ())]

    assert ready() == 0
    readiness.append(Readiness(connected=True, topology_applied=True, leadership_known=True))
    assert ready() == 1


def test_exposure_without_progress_has_no_series(metrics: SidecarMetrics) -> None:
    metrics.set_failover_exposure("s", "billing", 4)
    metrics.set_failover_exposure("s", "audit", 0)
    metrics.set_failover_exposure("s", "billing", None)
    metrics.set_failover_exposure("s", "never", None)
    text = generate_latest(metrics.registry).decode()
    exposure = {k: v for k, v in samples(text).items() if k[0] == "rsub_failover_exposure_messages"}
    assert exposure == {
        ("rsub_failover_exposure_messages", (("stream", "s"), ("subscription", "audit"))): 0
    }


async def test_bad_listen_address_is_rejected(
    backend: MemoryBackend, metrics: SidecarMetrics
) -> None:
    with pytest.raises(ValueError, match="'localhost'"):
        await start_http_server(backend, metrics, "localhost")
