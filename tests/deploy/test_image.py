"""The built image, run as an operator runs it (`make image-test`).

Each sidecar runs in a container of the image: read-only root, no tmpfs, the image's non-root
user, every capability dropped, no new privileges, on the host network beside real
nats-servers started on the host (`make_cluster`). Two regions: a replicated durable consumed
in west, west lost (its servers and its container killed), the durable continued in east
with nothing lost. /readyz, /metrics, gRPC health and the image's HEALTHCHECK are reached
from outside the container, and the packages the image holds are exactly constraints.txt's.

They run where RSUB_IMAGE names a built image: `make image-test` builds it and sets it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tomllib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.ports import HOST
from rsub_dev.sidecars import SidecarProcess, sidecar_settings, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.naming import VirtualStream
from tests.support.scenario_kit import (
    DEADLINE_S,
    ack_floor,
    clients,
    consume,
    consume_all,
    create_durable,
    duplicates,
    last_data_sourced,
    publish,
)

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DURABLE = "billing"
STREAM = "orders"  # sidecar_settings' default stream
NO_CAPABILITIES = "0000000000000000"
EROFS = 30


@pytest.fixture(scope="module")
def image(image_tool: ModuleType) -> str:
    name = os.environ.get("RSUB_IMAGE")
    if not name:
        pytest.skip("RSUB_IMAGE is not set: `make image-test` builds the image and runs these")
    if not image_tool.image_exists(name):
        pytest.fail(f"RSUB_IMAGE={name} is not an image podman has (make image builds it)")
    return name


class ContainerSidecar(SidecarProcess):
    """`rsub run` in a container of `image`; the configuration's directory is mounted
    read-only on /etc/rsub. A SIGTERM to the podman client reaches the sidecar; a kill
    goes through `podman kill`, which SIGKILLs the container itself."""

    def __init__(
        self, settings: dict[str, Any], workdir: Path, image: str, image_tool: ModuleType
    ) -> None:
        super().__init__(settings, workdir)
        self.image = image
        self.tool = image_tool
        self.name = f"rsub-test-{self.region}-{uuid.uuid4().hex[:8]}"

    def command(self) -> list[str]:
        argv: list[str] = self.tool.podman_command(
            "run",
            "--rm",
            f"--name={self.name}",
            "--network=host",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            f"--volume={self.workdir}:/etc/rsub:ro",
            # The listen addresses as docs/deployment.md sets them: the HEALTHCHECK follows
            # RSUB_HTTP__LISTEN (the configuration file has the same ones).
            f"--env=RSUB_GRPC__LISTEN={HOST}:{self.grpc_port}",
            f"--env=RSUB_HTTP__LISTEN={HOST}:{self.http_port}",
            self.image,
            "--config",
            f"/etc/rsub/{self.config_path.name}",
        )
        return argv

    async def podman(self, *args: str, check: bool = True) -> str:
        result = await asyncio.to_thread(self.tool.podman, *args, check=check)
        return str(result.stdout)

    async def kill(self) -> None:
        await self.podman("kill", self.name, check=False)
        await super().kill()

    async def remove(self) -> None:
        await self.stop()
        await self.podman("rm", "--force", "--ignore", self.name, check=False)


@asynccontextmanager
async def container_sidecars(
    make_cluster: ClusterFactory, tmp_path: Path, image: str, image_tool: ModuleType
) -> AsyncIterator[tuple[LocalSuperCluster, dict[str, ContainerSidecar]]]:
    """West and east, each with one server on the host and its sidecar in a container."""
    cluster = await make_cluster(["west", "east"])
    sidecars: dict[str, ContainerSidecar] = {}
    try:
        # One after the other: the first applies the topology, the second finds it in place.
        for region in cluster.regions:
            settings = sidecar_settings(cluster, region)
            sidecar = sidecars[region] = ContainerSidecar(
                settings, tmp_path / region, image, image_tool
            )
            await sidecar.start()
            await sidecar.wait_ready()
        yield cluster, sidecars
    finally:
        await asyncio.gather(*(s.remove() for s in sidecars.values()))


async def test_two_regions_in_containers_lose_west_and_lose_no_message(
    image: str, image_tool: ModuleType, make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    async with container_sidecars(make_cluster, tmp_path, image, image_tool) as (cluster, sidecars):
        for sidecar in sidecars.values():
            await check_confined(sidecar)
            await check_reached_from_outside(sidecar)
        vs = VirtualStream(STREAM, tuple(sidecars))
        sent = [f"order-{i}".encode() for i in range(20)]
        async with clients(cluster) as conns:
            west, east = conns["west"].jetstream(), conns["east"].jetstream()
            await create_durable(west, vs, "west", DURABLE)
            for start in range(0, len(sent), 5):
                await publish(west, vs, "west", sent[start : start + 5])
                await snapshot_past_data(conns["west"], sidecars["west"], vs)
            in_west = await consume(west, vs, "west", DURABLE, 10)

            async def moved_in_east() -> bool:
                return await ack_floor(east, vs, "east", DURABLE) > 0

            # East's sidecar created the durable and moved it from west's updates.
            await wait_until(moved_in_east, "the durable to move in east", DEADLINE_S)
            completed = await metric(sidecars["west"], "rsub_snapshots_completed_total")
            assert completed >= 4, completed

            await sidecars["west"].kill()
            await cluster.stop_region("west")
            assert not sidecars["west"].running
            wanted = set(sent) - {d.payload for d in in_west}
            in_east = await consume_all(east, vs, "east", DURABLE, wanted)

        everything = in_west + in_east
        lost = set(sent) - {d.payload for d in everything}
        print(
            f"image failover: sent {len(sent)}, consumed {len(in_west)} in west and "
            f"{len(in_east)} in east, lost {len(lost)}, duplicates {duplicates(everything)}"
        )
        assert lost == set()
        # East resumed where west's updates put it, not from the beginning.
        assert duplicates(everything) < len(in_west)


async def check_confined(sidecar: ContainerSidecar) -> None:
    """The sidecar (PID 1 of its container) runs as 10001 with no capability, cannot gain
    any, and the root filesystem cannot be written, /tmp included."""
    [inspected] = json.loads(await sidecar.podman("container", "inspect", sidecar.name))
    assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    probe = (
        "import errno, json\n"
        "status = dict(l.split(':', 1) for l in open('/proc/1/status').read().splitlines())\n"
        "try:\n    open('/tmp/probe', 'w')\n    written = 0\n"
        "except OSError as e:\n    written = e.errno\n"
        "print(json.dumps({k: status[k].split() for k in ('Uid', 'Gid', 'CapEff', "
        "'CapPrm', 'CapBnd', 'NoNewPrivs')} | {'tmp': written}))\n"
    )
    found = json.loads(await sidecar.podman("exec", sidecar.name, "python", "-c", probe))
    assert found["Uid"] == ["10001"] * 4 and found["Gid"] == ["10001"] * 4
    assert found["CapEff"] == found["CapPrm"] == found["CapBnd"] == [NO_CAPABILITIES]
    assert found["NoNewPrivs"] == ["1"]
    assert found["tmp"] == EROFS


async def check_reached_from_outside(sidecar: ContainerSidecar) -> None:
    """/readyz (waited on by `wait_ready`), /metrics, gRPC health and the image's own
    HEALTHCHECK, from the host."""
    assert await metric(sidecar, "rsub_nats_connected") == 1
    async with grpc.aio.insecure_channel(f"{HOST}:{sidecar.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    # `podman healthcheck run` runs the image's HEALTHCHECK command now: 0 when healthy.
    result = await asyncio.to_thread(
        sidecar.tool.podman, "healthcheck", "run", sidecar.name, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def metric(sidecar: ContainerSidecar, name: str) -> float:
    """The sum of `name`'s samples in the sidecar's /metrics (fetched over HTTP)."""
    text = await sidecar.metrics_text()
    samples = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]
    assert samples, f"{name} is not in /metrics"
    return sum(samples)


async def snapshot_past_data(nc: Client, sidecar: ContainerSidecar, vs: VirtualStream) -> None:
    """Wait until the sidecar lists a snapshot past the last data message its region's read
    stream holds now (asked through its gRPC API, from outside)."""
    last = await last_data_sourced(nc, vs, sidecar.region)
    async with grpc.aio.insecure_channel(f"{HOST}:{sidecar.grpc_port}") as channel:
        cursors = api_pb2_grpc.CursorServiceStub(channel)

        async def past() -> bool:
            reply = await cursors.ListSnapshots(api_pb2.ListSnapshotsRequest(stream=vs.name))
            return any(s.local_position > last for s in reply.snapshots)

        await wait_until(past, f"a snapshot past {last} in {sidecar.region}", DEADLINE_S)


def test_the_image_holds_exactly_the_pinned_runtime_dependencies(
    image: str, image_tool: ModuleType
) -> None:
    """`pip freeze` in the image: rsub's runtime dependencies (not its extras), each at the
    version constraints.txt pins, and nothing else."""
    freeze = image_tool.podman(
        "run", "--rm", "--network=none", "--entrypoint=python", image, "-m", "pip", "freeze"
    ).stdout
    installed: dict[str, str] = {}
    for line in freeze.splitlines():
        name, _, version = re.split(r"(==| @ )", line, maxsplit=1)
        installed[image_tool.normalize(name)] = version
    wheel = installed.pop("rsub")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.endswith(f"/rsub-{version}-py3-none-any.whl"), wheel
    pins = image_tool.pins()
    expected = {name: pins[name] for name in image_tool.runtime_closure()}
    assert installed == expected
