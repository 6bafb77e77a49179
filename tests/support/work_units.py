"""How `make test` spreads the suite over pytest-xdist workers (`--dist loadfile`).

A work unit runs whole on one worker: one per test file, so a module's fixtures and state
start once, except that
- the files whose tests share the Spark session (`spark` of tests/spark/conftest.py, one JVM
  per process) are one unit together, so the JVM starts once;
- each test of the seeded simulations (`SPLIT_FILES`: pure, minutes of CPU a file, no
  fixture wider than a test) is a unit of its own, so that a file's runs spread over the
  workers instead of holding one to the end.
Units start longest first, by the seconds recorded in `tests/durations.json` per file (per
test for `SPLIT_FILES`; one not recorded there, a new one, first of all), so the last to end
is a short one.

xdist's own `--dist loadgroup` would do the grouping from `xdist_group` marks, but with
pytest 9.2 it silently groups nothing (it renames node ids through a field pytest no longer
reads: pytest-dev/pytest-xdist#1386), hence a scheduler of our own (`make_scheduler`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).parents[1] / "durations.json"
SPARK_UNIT = "spark"
SPARK_SESSION_FILES = frozenset(
    {"tests/spark/test_spark_failover.py", "tests/spark/test_spark_streaming.py"}
)
SPLIT_FILES = frozenset({"tests/dev/test_shell_sim.py", "tests/dev/test_shell_failback.py"})


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_as(nodeid: str) -> str:
    """The key of `nodeid`'s seconds in `DURATIONS`: its file, or itself in `SPLIT_FILES`."""
    path = file_of(nodeid)
    return nodeid if path in SPLIT_FILES else path


def work_unit(nodeid: str) -> str:
    path = file_of(nodeid)
    return SPARK_UNIT if path in SPARK_SESSION_FILES else recorded_as(nodeid)


def recorded_seconds() -> dict[str, float]:
    seconds: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    return seconds


class _Node(Protocol):
    @property
    def nodeid(self) -> str: ...


N = TypeVar("N", bound=_Node)


def longest_first(items: Sequence[N], seconds: dict[str, float]) -> list[N]:
    """`items` by work unit, the units by their recorded seconds, longest first, a unit with
    a file not recorded before all; within a unit, the collection order."""
    units: dict[str, list[N]] = {}
    for item in items:
        units.setdefault(work_unit(item.nodeid), []).append(item)

    def recorded(unit: str) -> float:
        keys = {recorded_as(item.nodeid) for item in units[unit]}
        return sum(seconds.get(k, float("inf")) for k in keys)

    return [item for unit in sorted(units, key=lambda u: -recorded(u)) for item in units[unit]]


def check_spark_files(items: Sequence[pytest.Item]) -> None:
    """A test file using the Spark session but not in `SPARK_SESSION_FILES` would start a JVM
    of its own on another worker: name it."""
    using = {file_of(i.nodeid) for i in items if "spark" in getattr(i, "fixturenames", ())}
    if not using <= SPARK_SESSION_FILES:
        missing = ", ".join(sorted(using - SPARK_SESSION_FILES))
        raise pytest.UsageError(f"add {missing} to SPARK_SESSION_FILES in {__name__}")


class DurationRecorder:
    """Each test file's seconds (setup, call and teardown of its tests; each test's in
    `SPLIT_FILES`) of a passing run, merged into `DURATIONS` at its end (under xdist, in the
    controller: it gets every report)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[recorded_as(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != pytest.ExitCode.OK:
            return
        recorded = recorded_seconds()
        recorded.update({f: round(s, 1) for f, s in self.seconds.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")


def make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    """xdist's scheduling by scope with `work_unit` as the scope, the units in the order the
    workers collected them (`longest_first`), not reordered by their number of tests."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)
