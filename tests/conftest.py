"""Shared fixtures: real local multi-region NATS super-clusters (see docs/dev-cluster.md).

Every fixture here starts real nats-server processes under `tmp_path`, returns only once
every server is JetStream-ready (meta leader elected, gateways connected), and stops them
all at teardown. Fixtures are function-scoped (the gateway proxies live in the test's event
loop); a 3-region cluster starts in about 5-6 s.

- `cluster3`: regions `west`, `central`, `east`, one server each, gateways through
  in-process proxies (so `cut_link` / `set_link_delay` work).
- `cluster2`: regions `west`, `east`, one server each, proxied gateways.
- `make_cluster`: factory for anything else, e.g.
  `cluster = await make_cluster(["a", "b"], servers_per_region=3)`; takes the keyword
  arguments of `LocalSuperCluster` (the directory defaults to a fresh one under `tmp_path`);
  annotate it as `rsub_dev.cluster.ClusterFactory`.

Tests that use them should be marked `@pytest.mark.integration`.

`make test` runs the suite on pytest-xdist workers, `--dist loadfile` with the work units
and their order of `tests/support/work_units.py`; `--store-durations` records each test
file's seconds of a run in `tests/durations.json`, the order's source.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from tests.support import work_units

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


@pytest.fixture
async def cluster3(make_cluster: ClusterFactory) -> LocalSuperCluster:
    return await make_cluster(["west", "central", "east"])


@pytest.fixture
async def cluster2(make_cluster: ClusterFactory) -> LocalSuperCluster:
    return await make_cluster(["west", "east"])


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
