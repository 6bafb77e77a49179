"""How soon after its creation a replicated stream's first leader is elected (the failback
guard's fresh streams, docs/protocol.md §7).

Usage: .venv/bin/python bench/bench_first_leader.py [--streams 20] [--replicas 3]

One region of `--replicas` local servers (`LocalSuperCluster`); creates `--streams` streams
of that many replicas one after the other and prints, per stream and in summary,
`cluster.leader_since - created` from `STREAM.INFO` once each has a leader. A stream of one
replica reports no `leader_since`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import nats

from rsub_dev.cluster import LocalSuperCluster
from sidecar.nats.consumers import created_ms, leader_since_ms

_REGION = "west"


async def run(streams: int, replicas: int, workdir: Path) -> None:
    # A lone server waits for routes: a second region keeps one server per region possible.
    regions = [_REGION] if replicas > 1 else [_REGION, "east"]
    async with LocalSuperCluster(regions, workdir, servers_per_region=replicas) as cluster:
        nc = await nats.connect(cluster.servers(_REGION))
        try:
            gaps: list[int] = []
            for i in range(streams):
                name = f"FIRST{i}"
                config = {
                    "name": name,
                    "subjects": [f"first{i}.>"],
                    "num_replicas": replicas,
                    "placement": {"cluster": _REGION},
                }
                await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode(), 10)
                while True:
                    reply = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=10)
                    info = json.loads(reply.data)
                    if (info.get("cluster") or {}).get("leader"):
                        break
                    await asyncio.sleep(0.05)
                since, created = leader_since_ms(info), created_ms(info)
                if since is None or created is None:
                    print(f"{name}: leader_since {since}, created {created}")
                    continue
                gaps.append(since - created)
                print(f"{name}: first leader {since - created} ms after the creation")
            if gaps:
                print(
                    f"{len(gaps)} streams of {replicas} replicas: min {min(gaps)} ms, "
                    f"median {statistics.median(gaps):.0f} ms, max {max(gaps)} ms"
                )
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(run(args.streams, args.replicas, Path(workdir)))


if __name__ == "__main__":
    main()
