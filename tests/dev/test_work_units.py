"""`make test`'s work units for pytest-xdist and their order (tests/support/work_units.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.work_units import SPARK_UNIT, longest_first, work_unit


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
