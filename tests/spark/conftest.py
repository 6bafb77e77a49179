"""Fixtures of the Spark plugin tests.

The helpers they build on, and why they work as they do: `tests/support/spark_helpers.py`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import nats
import pytest
from pyspark.sql import SparkSession

from spark_jobs import rsub_spark
from tests.support.nats_servers import LoneServer
from tests.support.spark_helpers import (
    Layout,
    SidecarDouble,
    create_layout,
    publish_orders,
    stored_messages,
    wait_sourced,
)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoneServer]:
    server = LoneServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["direct", "consumer"])
def orders_layout(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Layout]:
    """A virtual stream with 200 data messages (plus markers) in its west read stream, read
    with direct gets (`orders`) or, without allow_direct, with a consumer (`ordersc`).

    On a server of its own: pytest builds a session fixture's parameter again when the tests
    using it come back to it after the other one (under xdist a worker runs them after other
    files' tests), and a second build on a shared server would publish 200 messages more."""
    direct = request.param == "direct"
    server = LoneServer(tmp_path_factory.mktemp("nats-orders"))
    server.start()

    async def build() -> Layout:
        nc = await nats.connect(server.url)
        try:
            vstream = await create_layout(nc, "orders" if direct else "ordersc", direct=direct)
            published = await publish_orders(nc, vstream, 200)
            last = await wait_sourced(nc, vstream, len(published))
            read_stream = vstream.read_stream("west")
            stored = await stored_messages(nc, read_stream, last)
            return Layout(server.url, vstream, read_stream, published, stored)
        finally:
            await nc.close()

    try:
        yield asyncio.run(build())
    finally:
        server.stop()


@pytest.fixture
def sidecar_double() -> Iterator[SidecarDouble]:
    double = SidecarDouble()
    yield double
    double.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark's Python workers (data source planner and readers) must run this venv's Python.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rsub-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    rsub_spark.register(session)
    yield session
    session.stop()
