"""`make demo-spark`: the verdict logic, and one real run of the demo in a subprocess.

The run starts its own three-region cluster, sidecars and Spark (a separate process, so its
Spark session and log settings stay apart from the session fixture of the other tests).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from examples.spark_failover import Order, Outcome, totals_of

ROOT = Path(__file__).resolve().parents[2]


def test_totals_of_sums_amounts_and_counts_orders_per_key() -> None:
    orders = [Order("west", 1, "k1", 5), Order("east", 1, "k1", 2), Order("east", 3, "k2", 7)]
    assert totals_of(orders) == {"k1": (7, 2), "k2": (7, 1)}


def good_outcome() -> Outcome:
    totals = {"k1": (7, 2)}
    return Outcome(
        published={"west": 1, "central": 0, "east": 1},
        stranded=0,
        delivered={"west": 1, "east": 2},
        twice=1,
        table_rows=2,
        table_duplicates=0,
        missing=0,
        unexpected=0,
        resumed_after=3,
        loss_to_first_batch_s=1.0,
        expected=totals,
        got=dict(totals),
    )


@pytest.mark.parametrize(
    "change",
    [
        {"got": {"k1": (6, 2)}},
        {"got": {"k1": (7, 2), "k2": (1, 1)}},
        {"stranded": 1},
        {"missing": 1},
        {"unexpected": 1},
        {"table_duplicates": 1},
    ],
)
def test_the_verdict_fails_on_any_difference_or_loss(change: dict[str, object]) -> None:
    assert good_outcome().ok
    assert not dataclasses.replace(good_outcome(), **change).ok  # type: ignore[arg-type]


@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_demo_runs_through_the_failover_and_finds_equal_totals(tmp_path: Path) -> None:
    args = ["--west-batches", "2", "--burst", "20", "--after-seconds", "2", "--dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "examples.spark_failover", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "result: OK" in done.stdout
    assert "never left west:           0" in done.stdout
    assert "0 duplicated, 0 published orders missing, 0 rows nobody published" in done.stdout
