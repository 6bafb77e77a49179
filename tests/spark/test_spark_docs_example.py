"""The example commands of docs/spark.md ("Example pipeline"), run as written on real servers.

Every `console` block of that section is read from the page: each `$ ` command (with its
continuation lines) runs in a subprocess, with only the NATS URL, the sidecar address and
the `/data` directory replaced by the test's, and the lines the page shows after it must be
lines of its output. A command whose shown output is an `error:` must end with exit code 2,
any other with 0. Around them: a two-region super-cluster, west's real sidecar, orders in
west's read stream and a replicated durable `billing` there (the README's demo has one).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import nats
import pyarrow.parquet as pq
import pytest

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, durable_config, wait_until
from sidecar.naming import VirtualStream
from sidecar.runtime.errors import NotFound
from tests.support.spark_helpers import publish_orders, wait_sourced

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "spark.md"
STREAM = "orders"
ORDERS = 30


@dataclass(frozen=True)
class Command:
    text: str
    shown: tuple[str, ...]  # the output lines the page shows after it

    @property
    def fails(self) -> bool:
        return any(line.startswith("error:") for line in self.shown)


def example_blocks(doc: Path = DOC) -> list[list[Command]]:
    """The commands of each `console` block of the "Example pipeline" section."""
    section = doc.read_text().split("\n## Example pipeline", 1)[1].split("\n## ", 1)[0]
    blocks: list[list[Command]] = []
    for chunk in section.split("```console\n")[1:]:
        commands: list[tuple[list[str], list[str]]] = []
        lines = iter(chunk.split("\n```", 1)[0].splitlines())
        for line in lines:
            if not line.startswith("$ "):
                commands[-1][1].append(line)
                continue
            text = [line[2:]]
            while text[-1].endswith("\\"):
                text[-1] = text[-1][:-1]
                text.append(next(lines))
            commands.append((text, []))
        blocks.append([Command(" ".join(t), tuple(shown)) for t, shown in commands])
    return blocks


def test_the_example_section_has_the_commands_this_test_runs() -> None:
    """What the test below relies on: a cursor created, the job on it, the job on `billing`."""
    [[create, run], [refused]] = example_blocks()
    assert create.text.startswith("rsub create-cursor orders ") and not create.fails
    assert run.text.startswith("python -m spark_jobs.orders_totals ") and not run.fails
    assert "--subscription billing" in refused.text and refused.fails


async def run_command(command: Command, replace: dict[str, str]) -> tuple[int, list[str]]:
    """Run `command` with the page's addresses and directories replaced; its exit code and
    the lines of its stdout and stderr."""
    text = command.text
    for page, here in replace.items():
        text = text.replace(page, here)
    program, *args = shlex.split(text)
    prefix = {"rsub": [sys.executable, "-m", "sidecar.cli"], "python": [sys.executable]}[program]
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, (out.decode() + err.decode()).splitlines()


@pytest.mark.timeout(600)
async def test_the_example_commands_run_as_written(
    cluster2: LocalSuperCluster, tmp_path: Path
) -> None:
    vstream = VirtualStream(STREAM, ("west", "east"))
    read_stream = vstream.read_stream("west")
    async with RegionSidecars(cluster2, streams=[STREAM], regions=["west"]) as sidecars:
        west = sidecars["west"]
        nc = await nats.connect(cluster2.servers("west"))
        try:
            js = nc.jetstream()
            published = await publish_orders(nc, vstream, ORDERS, markers=False)
            last_data = await wait_sourced(nc, vstream, ORDERS, region="west")
            await js.add_consumer(read_stream, config=durable_config(vstream, "billing"))

            async def billing_known() -> bool:
                try:
                    return (await west.get_subscription(STREAM, "billing")).kind == "durable"
                except NotFound:
                    return False

            await wait_until(billing_known, "west's sidecar to list the durable")
        finally:
            await nc.close()

        sidecar = f"127.0.0.1:{west.grpc_port}"
        for number, block in enumerate(example_blocks()):
            directory = tmp_path / f"block{number}"
            replace = {
                "nats://localhost:4222": ",".join(cluster2.servers("west")),
                "localhost:7070": sidecar,
                "/data/": f"{directory}/",
            }
            for command in block:
                code, output = await run_command(command, replace)
                shown = list(command.shown)
                for page, here in replace.items():
                    shown = [line.replace(page, here) for line in shown]
                assert code == (2 if command.fails else 0), "\n".join(output[-40:])
                missing = [line for line in shown if line not in output]
                assert not missing, "\n".join(output[-40:])
            if number == 0:
                # The job read every order, once, and committed the read stream's end.
                table = pq.read_table(directory / "orders").to_pylist()
                assert sorted((r["origin_region"], r["origin_sequence"]) for r in table) == sorted(
                    (p.region, p.origin_sequence) for p in published
                )
                cursor = await west.get_subscription(STREAM, "orders-totals")
                assert cursor.kind == "external" and cursor.mark_delete >= last_data
            else:
                # Refused as it set up: no batch ran, nothing was written or checkpointed.
                assert not directory.exists()
                billing = await west.get_subscription(STREAM, "billing")
                assert billing.kind == "durable" and billing.mark_delete == 0
