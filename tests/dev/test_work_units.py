"""`make test`'s work units for pytest-xdist and their order (tests/support/work_units.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.support import work_units
from tests.support.work_units import SPARK_UNIT, SPLIT_FILES, longest_first, work_unit

SIM = "tests/dev/test_shell_failback.py"


@dataclass(frozen=True)
class Node:
    nodeid: str


def nodes(*ids: str) -> list[Node]:
    return [Node(i) for i in ids]


def test_a_file_is_a_unit_and_the_spark_sessions_files_are_one() -> None:
    assert work_unit("tests/api/test_api_cli.py::test_x[a]") == "tests/api/test_api_cli.py"
    assert work_unit("tests/spark/test_spark_streaming.py::test_a") == SPARK_UNIT
    assert work_unit("tests/spark/test_spark_failover.py::test_b") == SPARK_UNIT
    assert (
        work_unit("tests/spark/test_spark_reader.py::test_c") == "tests/spark/test_spark_reader.py"
    )


def test_each_test_of_a_seeded_simulation_is_a_unit() -> None:
    assert SIM in SPLIT_FILES
    assert work_unit(f"{SIM}::test_a[_quiet-0]") == f"{SIM}::test_a[_quiet-0]"
    assert work_unit(f"{SIM}::test_b") == f"{SIM}::test_b"


def test_units_go_longest_first_new_files_before_all_tests_keep_their_order() -> None:
    items = nodes(
        "tests/a.py::t1",
        "tests/spark/test_spark_streaming.py::s1",
        "tests/b.py::t1",
        "tests/a.py::t2",
        "tests/new.py::t1",
        "tests/spark/test_spark_failover.py::f1",
        "tests/b.py::t2",
    )
    seconds = {
        "tests/a.py": 10.0,
        "tests/b.py": 30.0,
        "tests/spark/test_spark_streaming.py": 25.0,
        "tests/spark/test_spark_failover.py": 20.0,
    }
    assert [n.nodeid for n in longest_first(items, seconds)] == [
        "tests/new.py::t1",
        "tests/spark/test_spark_streaming.py::s1",  # 45 s together
        "tests/spark/test_spark_failover.py::f1",
        "tests/b.py::t1",
        "tests/b.py::t2",
        "tests/a.py::t1",
        "tests/a.py::t2",
    ]


def test_a_seeded_simulations_tests_go_by_their_own_seconds() -> None:
    items = nodes(f"{SIM}::short", "tests/a.py::t1", f"{SIM}::long", f"{SIM}::new")
    seconds = {f"{SIM}::short": 1.0, "tests/a.py": 10.0, f"{SIM}::long": 30.0}
    assert [n.nodeid for n in longest_first(items, seconds)] == [
        f"{SIM}::new",
        f"{SIM}::long",
        "tests/a.py::t1",
        f"{SIM}::short",
    ]


def test_the_recorder_keeps_a_file_s_seconds_and_each_seeded_simulation_test_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/old.py": 5.0}))
    monkeypatch.setattr(work_units, "DURATIONS", durations)
    recorder = work_units.DurationRecorder()
    phases: list[tuple[str, Literal["setup", "call", "teardown"], float]] = [
        ("tests/a.py::t1", "setup", 1.0),
        ("tests/a.py::t1", "call", 2.0),
        ("tests/a.py::t2", "call", 3.0),
        (f"{SIM}::t1", "call", 4.0),
        (f"{SIM}::t2[x]", "call", 6.0),
        (f"{SIM}::t2[x]", "teardown", 0.5),
    ]
    for nodeid, when, seconds in phases:
        report = pytest.TestReport(nodeid, (nodeid, 0, ""), {}, "passed", None, when, [], seconds)
        recorder.pytest_runtest_logreport(report)
    recorder.pytest_sessionfinish(pytest.Session.__new__(pytest.Session), pytest.ExitCode.OK)
    assert json.loads(durations.read_text()) == {
        "tests/a.py": 6.0,
        "tests/old.py": 5.0,
        f"{SIM}::t1": 4.0,
        f"{SIM}::t2[x]": 6.5,
    }
