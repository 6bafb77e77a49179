"""Streams that cannot be adopted are refused with the stream and field named, untouched;
`rsub topology apply` on a real cluster, custom stream-name patterns included."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import wait_until
from sidecar.naming import VirtualStream
from sidecar.nats.topology import TopologyConflict, apply_topology
from tests.support.topology_helpers import message_count, read_all

pytestmark = pytest.mark.integration

VS = VirtualStream("acct", ("west", "east"))
W = {"name": "acct-write-west", "subjects": ["acct.west.>"], "placement": {"cluster": "west"}}


def read_cfg(region: str, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": VS.read_stream(region),
        "placement": {"cluster": region},
        "sources": [
            {"name": VS.write_stream(x), "filter_subject": VS.data_subject(x)} for x in VS.regions
        ],
        "subject_transform": {"src": "acct.*.>", "dest": "acct.>"},
    }
    cfg.update(extra)
    return cfg


CASES: list[tuple[str, list[dict[str, Any]], str, str]] = [
    (
        "overlap",
        [{"name": "legacy", "subjects": ["acct.>"], "placement": {"cluster": "west"}}],
        "acct-write-west",
        r"subjects: 'acct\.west\.>' overlaps the subjects of stream\(s\) legacy",
    ),
    (
        "write stream captures another region",
        [{**W, "subjects": ["acct.west.>", "acct.east.x"]}],
        "acct-write-west",
        r"subjects: 'acct\.east\.x' reaches into",
    ),
    (
        "write stream captures less",
        [{**W, "subjects": ["acct.west.a.>"]}],
        "acct-write-west",
        r"subjects: \['acct\.west\.a\.>'\] does not capture 'acct\.west\.>'",
    ),
    (
        "wrong placement",
        [{**W, "placement": {"cluster": "east"}}],
        "acct-write-west",
        r"placement\.cluster: lives in cluster 'east', expected 'west'",
    ),
    (
        "read stream sources a foreign stream",
        [
            {"name": "other", "subjects": ["other.>"], "placement": {"cluster": "west"}},
            read_cfg("west", sources=[{"name": "other"}]),
        ],
        "acct-read-west",
        r"sources\[other\]: sources 'other', which is not a write stream of 'acct'",
    ),
    (
        "transform renames differently",
        [read_cfg("east", subject_transform={"src": "acct.*.>", "dest": "acct.all.>"})],
        "acct-read-east",
        r"subject_transform: .* would rename differently",
    ),
    (
        "source filter narrower",
        [
            read_cfg(
                "east",
                sources=[
                    {"name": "acct-write-west", "filter_subject": "acct.west.a.>"},
                    {"name": "acct-write-east", "filter_subject": "acct.east.>"},
                ],
            )
        ],
        "acct-read-east",
        r"sources\[acct-write-west\]: source 'acct-write-west', filter 'acct\.west\.a\.>' "
        "cannot be adopted",
    ),
    (
        "workqueue read stream",
        [read_cfg("west", retention="workqueue")],
        "acct-read-west",
        r"retention: is 'workqueue'",
    ),
]


@pytest.fixture
async def nc(cluster2: LocalSuperCluster) -> AsyncIterator[Client]:
    conn = await nats.connect(cluster2.servers("west"))
    yield conn
    await conn.close()


async def api(nc: Client, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = json.dumps(body).encode() if body is not None else b""
    reply = await nc.request(f"$JS.API.{op}", payload, timeout=10)
    result: dict[str, Any] = json.loads(reply.data)
    return result


async def all_configs(nc: Client, *, including: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every stream's configuration, once the listing shows `including` (a stream just created
    in another cluster of the super-cluster may be missing from it for a moment)."""
    listed: list[str] = []

    async def complete() -> bool:
        listed[:] = (await api(nc, "STREAM.NAMES")).get("streams") or []
        return set(including) <= set(listed)

    await wait_until(complete, f"streams {including} listed", timeout_s=10)
    return {n: (await api(nc, f"STREAM.INFO.{n}"))["config"] for n in listed}


async def test_refusals_name_stream_and_field_and_change_nothing(nc: Client) -> None:
    for label, streams, stream, pattern in CASES:
        for cfg in streams:
            created = await api(nc, f"STREAM.CREATE.{cfg['name']}", cfg)
            assert "error" not in created, (label, created)
        before = await all_configs(nc, including=tuple(cfg["name"] for cfg in streams))
        with pytest.raises(TopologyConflict, match=f"^stream '{stream}', {pattern}") as err:
            await apply_topology(nc, VS)
        assert err.value.stream == stream, label
        assert await all_configs(nc) == before, f"{label}: refusal changed streams"
        for name in before:
            await api(nc, f"STREAM.DELETE.{name}")


async def run_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        "topology",
        "apply",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_apply_dry_run_json_and_refusal(cluster2: LocalSuperCluster, nc: Client) -> None:
    servers = ",".join(cluster2.servers("west") + cluster2.servers("east"))
    common = ("--servers", servers, "--regions", "west,east", "--stream", "acct")
    code, out, err = await run_cli(*common, "--stream", "bills", "--dry-run")
    assert code == 0, err
    assert "acct-read-east: would be created" in out and "bills-write-west" in out
    assert not (await api(nc, "STREAM.NAMES")).get("streams")

    code, out, err = await run_cli(*common, "--json")
    assert code == 0, err
    [report] = json.loads(out)
    assert {s["action"] for s in report["streams"]} == {"created"}
    code, out, err = await run_cli(*common)
    assert code == 0, err
    assert out.count(": unchanged") == 4

    await api(nc, "STREAM.CREATE.legacy", {"name": "legacy", "subjects": ["bills.>"]})
    code, out, err = await run_cli(*common, "--stream", "bills")
    assert code == 2
    assert "stream 'bills-write-west', subjects: 'bills.west.>' overlaps" in err
    code, _, err = await run_cli(*common, "--stream", "bad.name")
    assert code == 2 and "name: 'bad.name' is not a valid name" in err


async def test_cli_apply_with_custom_patterns(cluster2: LocalSuperCluster, nc: Client) -> None:
    """The streams get the names the patterns give, and each read stream sources the custom
    write streams, so origins resolve through the same patterns (as the sidecar's do)."""
    vs = VirtualStream(
        "acct",
        ("west", "east"),
        write_pattern="{region}_in_{name}",
        read_pattern="{name}_all_{region}",
    )
    servers = ",".join(cluster2.servers("west") + cluster2.servers("east"))
    common = ("--servers", servers, "--regions", "west,east", "--stream", "acct")
    patterns = ("--write-pattern", vs.write_pattern, "--read-pattern", vs.read_pattern)
    code, out, err = await run_cli(*common, *patterns)
    assert code == 0, err
    assert "east_in_acct: created" in out and "acct_all_west: created" in out
    names = (await api(nc, "STREAM.NAMES"))["streams"]
    assert set(names) == {"west_in_acct", "east_in_acct", "acct_all_west", "acct_all_east"}

    await nc.jetstream().publish(vs.publish_subject("east", "k1"), b"from east")

    async def arrived() -> bool:
        return await message_count(nc, vs.read_stream("west")) == 1

    await wait_until(arrived, "east's message in west's read stream", 30, poll_s=0.2)
    [stored] = await read_all(nc, vs, vs.read_stream("west"), vs.data_filter())
    assert (stored.subject, stored.data, stored.origin) == ("acct.k1", b"from east", ("east", 1))

    code, out, err = await run_cli(*common, *patterns)
    assert code == 0, err
    assert out.count(": unchanged") == 4
    code, _, err = await run_cli(*common, "--write-pattern", "{name}-w")
    assert code == 2 and "write_pattern: '{name}-w' must contain {name} and {region}" in err
