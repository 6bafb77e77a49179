"""`python -m rsub_dev.chaos.table RESULTS.jsonl...`: the campaign's table for
docs/reliability.md from the JSON lines `python -m rsub_dev.chaos --results` appends."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rsub_dev.chaos.plan import KINDS


def table(runs: list[dict[str, Any]]) -> str:
    seeds = sorted(r["seed"] for r in runs)
    faults: Counter[str] = Counter()
    for r in runs:
        faults.update(r["faults"])
    regions = Counter(r["regions"] for r in runs)
    passed = sum(1 for r in runs if r["ok"])
    rows = [
        ("runs (seeds)", f"{len(runs)} ({_ranges(seeds)})"),
        ("regions per run", ", ".join(f"{n}: {c} runs" for n, c in sorted(regions.items()))),
        ("passed / failed", f"{passed} / {len(runs) - passed}"),
        *((f"faults: {kind}", str(faults.get(kind, 0))) for kind in KINDS),
        (
            "failovers (without a view from the target)",
            _sum_pair(runs, "failovers", "failovers_without_view"),
        ),
        ("messages published (acknowledged)", str(sum(r["published"] for r in runs))),
        ("deliveries", str(sum(r["deliveries"] for r in runs))),
        (
            "messages delivered again after failovers (of them not covered by the target's progress)",
            _sum_pair(runs, "failover_duplicates", "failover_duplicates_uncovered"),
        ),
        (
            "covered messages delivered again beyond the failover_exposure reported (failovers)",
            _sum_pair(runs, "failover_duplicates_beyond_exposure", "failovers_beyond_exposure"),
        ),
        ("faults the harness failed to inject or heal", str(sum(r["fault_errors"] for r in runs))),
        ("messages removed by purges", str(sum(r["removed"] for r in runs))),
    ]
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    for r in runs:
        if not r["ok"]:
            shown = "; ".join(v[:150].replace("|", "/") for v in r["violations"])
            lines.append(f"| seed {r['seed']} failed | {shown} |")
    return "\n".join(lines)


def _sum_pair(runs: list[dict[str, Any]], a: str, b: str) -> str:
    return f"{sum(r[a] for r in runs)} ({sum(r[b] for r in runs)})"


def _ranges(seeds: list[int]) -> str:
    parts: list[str] = []
    start = prev = seeds[0] if seeds else 0
    for seed in [*seeds[1:], None]:
        if seed is not None and seed == prev + 1:
            prev = seed
            continue
        parts.append(f"{start}-{prev}" if start != prev else str(start))
        if seed is not None:
            start = prev = seed
    return ", ".join(parts)


def main(argv: list[str]) -> int:
    runs = [json.loads(line) for path in argv for line in Path(path).read_text().splitlines()]
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
