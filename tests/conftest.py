"""Shared fixtures: real local multi-region NATS super-clusters (see docs/dev-cluster.md).

Every fixture here starts real nats-server processes under `tmp_path`, returns only once
every server is JetStream-ready (meta leader elected, gateways connected), and stops them
all at teardown, except the shared ones (a super-cluster takes seconds to start, most of it
the meta leader's first election: docs/benchmarks.md, "Local super-cluster start-up").

- `cluster3`: regions `west`, `central`, `east`, one server each; `cluster2`: regions `west`,
  `east`. Both shared by the tests of one worker, one test at a time (`cluster_pool`,
  tests/support/cluster_pool.py): every stream is deleted after a test, and a cluster whose
  servers were stopped or whose configuration changed is not lent again. Their gateways
  connect directly: a test that cuts or delays links uses `make_cluster`.
- `make_cluster`: factory for anything else (function-scoped, its gateways through
  in-process proxies of the test's event loop, so `cut_link` / `set_link_delay` work), e.g.
  `cluster = await make_cluster(["a", "b"], servers_per_region=3)`; takes the keyword
  arguments of `LocalSuperCluster` (the directory defaults to a fresh one under `tmp_path`);
  annotate it as `rsub_dev.cluster.ClusterFactory`.
- `js_server`: one stand-alone JetStream server for the whole test module (the adapter tests
  of tests/nats and the runtime's tests that need no cluster); `nc`: a client of it,
  connected once JetStream can create streams.

Tests that use them should be marked `@pytest.mark.integration`.

`make test` runs the suite on pytest-xdist workers, `--dist loadfile` with the work units
and their order of `tests/support/work_units.py`; `--store-durations` records each test
file's seconds of a run (each test's, for the seeded simulations split by test) in
`tests/durations.json`, the order's source.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import pytest
from nats.aio.client import Client

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from tests.support import work_units
from tests.support.cluster_pool import ClusterPool
from tests.support.nats_servers import LoneServer

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    counter = itertools.count()
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            regions: Sequence[str], directory: Path | None = None, **kwargs: Any
        ) -> LocalSuperCluster:
            where = directory or tmp_path / f"cluster-{next(counter)}"
            return await stack.enter_async_context(LocalSuperCluster(regions, where, **kwargs))

        yield make


@pytest.fixture(scope="session")
def cluster_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterPool]:
    pool = ClusterPool(tmp_path_factory.mktemp("pooled"))
    yield pool
    asyncio.run(pool.close())


@pytest.fixture
async def cluster3(cluster_pool: ClusterPool) -> AsyncIterator[LocalSuperCluster]:
    async with cluster_pool.lend(("west", "central", "east")) as cluster:
        yield cluster


@pytest.fixture
async def cluster2(cluster_pool: ClusterPool) -> AsyncIterator[LocalSuperCluster]:
    async with cluster_pool.lend(("west", "east")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def js_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoneServer]:
    """A stand-alone JetStream server for the whole test module."""
    server = LoneServer(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(js_server: LoneServer) -> AsyncIterator[Client]:
    """A client connected once JetStream can create streams (it needs a meta leader)."""
    client = await nats.connect(js_server.url)
    js = client.jetstream()
    for _ in range(300):
        with contextlib.suppress(Exception):
            await js.add_stream(name="probe", subjects=["probe"], max_consumers=1)
            break
        await asyncio.sleep(0.1)
    try:
        yield client
    finally:
        await client.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="record each test file's seconds of this run in tests/durations.json",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(work_units.DurationRecorder(), "rsub-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the units longest first
        work_units.check_spark_files(items)
        items[:] = work_units.longest_first(items, work_units.recorded_seconds())


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None
    return work_units.make_scheduler(config, log)
