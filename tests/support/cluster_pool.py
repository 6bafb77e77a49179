"""Super-clusters shared by the tests of one pytest process (an xdist worker), one test at a
time: a super-cluster takes seconds to start, most of it the JetStream meta leader's first
election, a raft timer no setting shortens (docs/benchmarks.md, "Local super-cluster
start-up"), and most tests only add streams to one. A cluster comes back to the pool clean (every stream deleted) and only if the test
left it as it found it: every server running, their configuration files unchanged (a test
that reloads users changes them). Otherwise it is stopped, and the next test gets a new one.

Pooled clusters connect their gateways directly (`proxy_gateways=False`): the link proxies
are asyncio servers of one event loop, and each test has its own. A test that cuts, delays or
restores links takes a fresh cluster of its own (`make_cluster`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import nats

from rsub_dev.cluster import LocalSuperCluster

_DELETE_TIMEOUT_S = 10.0


class ClusterPool:
    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._counter = itertools.count()
        self._idle: dict[tuple[str, ...], list[tuple[LocalSuperCluster, str]]] = {}
        self.started = 0
        self.reused = 0

    @contextlib.asynccontextmanager
    async def lend(self, regions: tuple[str, ...]) -> AsyncIterator[LocalSuperCluster]:
        """A ready super-cluster of `regions` for the duration of the block."""
        idle = self._idle.setdefault(regions, [])
        if idle:
            cluster, fingerprint = idle.pop()
            self.reused += 1
        else:
            where = self._directory / f"cluster-{next(self._counter)}"
            cluster = LocalSuperCluster(regions, where, proxy_gateways=False)
            await cluster.start()
            fingerprint = _configuration(cluster)
            self.started += 1
        kept = False
        try:
            yield cluster
            kept = await _cleaned(cluster, fingerprint)
        finally:
            if kept:
                idle.append((cluster, fingerprint))
            else:
                await cluster.stop()

    async def close(self) -> None:
        for idle in self._idle.values():
            for cluster, _ in idle:
                await cluster.stop()
        self._idle.clear()


def _configuration(cluster: LocalSuperCluster) -> str:
    """Its servers' processes and configuration files."""
    digest = hashlib.sha256(repr(sorted(cluster.pids())).encode())
    for path in sorted(cluster.directory.glob("*.conf")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


async def _cleaned(cluster: LocalSuperCluster, fingerprint: str) -> bool:
    """Whether `cluster` is as it was lent, every stream deleted: False when a server stopped
    or was restarted, or a configuration changed (then it is not lent again)."""
    expected = len(cluster.regions) * cluster.servers_per_region
    if len(cluster.pids()) != expected or _configuration(cluster) != fingerprint:
        return False
    client = await nats.connect(servers=cluster.servers(cluster.regions[0]), connect_timeout=2)
    try:
        js = client.jetstream(timeout=_DELETE_TIMEOUT_S)
        async with asyncio.timeout(3 * _DELETE_TIMEOUT_S):
            while streams := await js.streams_info():
                for info in streams:
                    await js.delete_stream(info.config.name or "")
    except (TimeoutError, nats.errors.Error):
        return False
    finally:
        await client.close()
    return await _ready(cluster)


async def _ready(cluster: LocalSuperCluster) -> bool:
    try:
        await cluster.wait_ready(timeout=10)
    except Exception:  # any reason not to lend it again; the next test starts a new one
        return False
    return True
