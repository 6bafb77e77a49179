"""`python -m rsub_dev.chaos --seeds N [--first-seed S] [--seconds T]`: one chaos run per
seed; prints a line per run, and for a failing one its violations, its folder and the command
that replays it. Exit status 1 when any run failed."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from rsub_dev.chaos.run import replay_command, run_seed
from sidecar.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rsub_dev.chaos", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (runs)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0, help="faults phase per run")
    parser.add_argument("--max-regions", type=int, default=3, choices=(2, 3, 4))
    parser.add_argument("--directory", type=Path, default=None, help="runs' folders (tmp)")
    parser.add_argument("--keep", action="store_true", help="keep passing runs' folders too")
    parser.add_argument("--results", type=Path, default=None, help="append a JSON line per run")
    args = parser.parse_args(argv)
    if args.seconds < 10:
        parser.error("--seconds must be at least 10")
    configure_logging("console", "warning", stream=sys.stderr)
    root = args.directory or Path(tempfile.mkdtemp(prefix="rsub-chaos-"))
    failed = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        outcome = asyncio.run(
            run_seed(
                seed,
                args.seconds,
                root / f"seed-{seed}",
                max_regions=args.max_regions,
                keep=args.keep,
            )
        )
        verdict = "ok" if not outcome.violations else "FAILED"
        print(f"seed {seed}: {verdict} in {outcome.wall_s:.0f}s {json.dumps(outcome.summary)}")
        if args.results is not None:
            line = {"seed": seed, "ok": not outcome.violations, **outcome.summary}
            line["violations"] = [str(v) for v in outcome.violations]
            with args.results.open("a") as out:
                out.write(json.dumps(line) + "\n")
        if outcome.violations:
            failed += 1
            for violation in outcome.violations:
                print(f"  {violation}")
            print(f"  logs, servers' and sidecars', and history.json: {outcome.directory}")
            print(f"  replay: {replay_command(seed, args.seconds, args.max_regions)}")
        sys.stdout.flush()
    print(f"{args.seeds - failed}/{args.seeds} seeds passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
