"""The failback guard at the issue's scale: duplicates in a returning region, with and without.

Usage: .venv/bin/python bench/bench_failback.py [--rate 300] [--away-s 15,45] [--after-s 10]

Issue 23, item 1: three regions (west, central, east), a producer in each at `--rate`
msg/s, the replicated durable `billing` consumed in west. All of west is lost (application,
servers, sidecar); the application continues in east for each `--away-s`, then stops; west's
servers restart from their store, its sidecar restarts, and the application in west
reconnects as soon as west's JetStream answers (`rsub_dev.failback`). For each time away,
one run with the guard (the default `failback.hold_s`) and one without (`failback.hold_s:
0`), each on a fresh cluster, printed side by side: the duplicates in west (messages
delivered there after the return that east consumed before it), what was lost, when west
delivered again and the hold its sidecar reported (`rsub_failback_hold_seconds`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.failback import FailbackOutcome, FailbackRun, failback, table
from sidecar.logs import configure_logging

REGIONS = ("west", "central", "east")


async def run(rate: float, aways: list[float], after_s: float, workdir: Path) -> None:
    outcomes: list[FailbackOutcome] = []
    for away_s in aways:
        for hold_s in (None, 0.0):
            spec = FailbackRun(
                home="west",
                away="east",
                rate_per_s=rate,
                warm_s=3.0,
                away_s=away_s,
                after_s=after_s,
                hold_s=hold_s,
                interval_ms=250,
                timeout_s=5.0,
            )
            where = workdir / f"away-{away_s:g}-{'guard' if spec.guard else 'off'}"
            async with LocalSuperCluster(list(REGIONS), where) as cluster:
                outcomes.append(await failback(cluster, spec))
            print(
                f"done: {away_s:g} s away, guard {'on' if spec.guard else 'off'}", file=sys.stderr
            )
    print("\n".join(table(outcomes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=300.0, help="msg/s per region")
    parser.add_argument("--away-s", default="15,45", help="seconds consumed in east")
    parser.add_argument("--after-s", type=float, default=10.0, help="publishing after return")
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    aways = [float(s) for s in args.away_s.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-failback-") as tmp:
        asyncio.run(run(args.rate, aways, args.after_s, Path(tmp)))


if __name__ == "__main__":
    main()
